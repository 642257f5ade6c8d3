// One tenant's load for benchmarks/isolation: one process per tenant, its rate on stdout once a second.
//
// Built by benchmarks.isolation with nvcc (shared cudart, as PyTorch and most applications link it; no
// cuBLAS, so the compute-bound load is an FMA loop) and run in each mode with the environment the device
// plugin gives a container. Every line on stdout is one JSON object; wall times are epoch seconds, so that
// two tenants' seconds can be lined up.
//
//   tenant_load compute SECONDS   an FMA-bound kernel over every SM, back to back, one sync per launch
//                                 (rate: TFLOP/s done, not launches: under MPS the grid is sized from the SMs
//                                 the client is shown, so a capped launch carries less work)
//   tenant_load memory SECONDS    a copy kernel over two 256 MiB buffers (rate: GB/s read + written)
//   tenant_load graph SECONDS     a CUDA Graph of 16 short compute kernels captured once, replayed (TFLOP/s)
//   tenant_load latency SECONDS   a small inference-like kernel (8 blocks, ~20 us) every 200 us; the time
//                                 of each launch to its end; p50/p99 per second and overall
//   tenant_load alloc WITHIN_MIB OVER_MIB   cudaMalloc WITHIN_MIB (expected granted), freed, then OVER_MIB
//   tenant_load fill CHUNK_MIB MOST_MIB HOLD_S   cudaMalloc CHUNK_MIB at a time until refused or MOST_MIB held,
//                                 then holds it all HOLD_S seconds ({"step":"filled","mib":..,"pid":..}): what
//                                 the driver counts of a process its limiter stopped at its limit
//   tenant_load KERNEL SECONDS IDLE_AT IDLE_S   compute, memory or graph, idle IDLE_S seconds once after
//                                 IDLE_AT seconds ({"step":"idle"}, then {"step":"resume"}; the second cut
//                                 short by the pause is not printed), then on to SECONDS of running: what a
//                                 limiter lets through after a pause
//
// Rows: {"step":"ready",...} after the warm-up, {"step":"second","from":..,"to":..,"rate":..} once a second,
// {"step":"done","rate":..,"seconds":..} at the end; errors as {"step":"error","error":"cudaError..."}.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double wall_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int failed(const char *what, cudaError_t rc) {
    if (rc == cudaSuccess) return 0;
    printf("{\"step\":\"error\",\"at\":\"%s\",\"error\":\"%s\"}\n", what, cudaGetErrorName(rc));
    fflush(stdout);
    return 1;
}

__global__ void fma_kernel(float *out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f, d = blockIdx.x * 1e-3f;
    for (int i = 0; i < iters; ++i) {  // four independent FMA chains keep the FP32 pipes busy
        a = fmaf(a, b, c);
        d = fmaf(d, c, b);
        b = fmaf(b, 0.99999f, 1e-7f);
        c = fmaf(c, 1.00001f, -1e-7f);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a + b + c + d;
}

__global__ void copy_kernel(const float4 *src, float4 *dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

// One unit of work for each load: launched, then waited for; returns its error.
typedef struct {
    const char *name;
    const char *unit;
    double per_unit;  // the rate's unit per launch (GB moved for memory, TFLOP done for compute and graph)
    int blocks, threads, iters;
    float *out;
    float4 *src, *dst;
    size_t n;
    cudaStream_t stream;
    cudaGraphExec_t graph;
} Load;

static cudaError_t one(Load *l) {
    if (strcmp(l->name, "memory") == 0)
        copy_kernel<<<l->blocks, l->threads, 0, l->stream>>>(l->src, l->dst, l->n);
    else if (strcmp(l->name, "graph") == 0) {
        cudaError_t rc = cudaGraphLaunch(l->graph, l->stream);
        if (rc != cudaSuccess) return rc;
    } else
        fma_kernel<<<l->blocks, l->threads, 0, l->stream>>>(l->out, l->iters);
    cudaError_t rc = cudaGetLastError();
    return rc != cudaSuccess ? rc : cudaStreamSynchronize(l->stream);
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pick(double *sorted, long n, double q) { return n ? sorted[(long)(q * (n - 1))] : 0.0; }

static int prepare(Load *l, const char *name) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    memset(l, 0, sizeof *l);
    l->name = name;
    l->threads = 256;
    if (failed("stream", cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking))) return 1;
    if (strcmp(name, "memory") == 0) {
        l->n = (256u << 20) / sizeof(float4);
        l->blocks = sms * 8;
        l->unit = "GB/s";
        l->per_unit = 2.0 * l->n * sizeof(float4) / 1e9;
        if (failed("malloc", cudaMalloc(&l->src, l->n * sizeof(float4)))) return 1;
        if (failed("malloc", cudaMalloc(&l->dst, l->n * sizeof(float4)))) return 1;
        return failed("memset", cudaMemset(l->src, 1, l->n * sizeof(float4)));
    }
    l->blocks = strcmp(name, "latency") == 0 ? 8 : sms * 16;
    l->iters = strcmp(name, "compute") == 0 ? 1 << 14 : strcmp(name, "graph") == 0 ? 1 << 10 : 1 << 12;
    l->unit = "TFLOP/s";  // four FMAs (eight FLOPs) per thread per iteration, fma_kernel's loop
    l->per_unit = 8.0 * l->iters * (double)l->blocks * l->threads / 1e12;
    if (failed("malloc", cudaMalloc(&l->out, (size_t)l->blocks * l->threads * sizeof(float)))) return 1;
    if (strcmp(name, "graph") == 0) {
        cudaGraph_t graph;
        l->per_unit *= 16;
        if (failed("capture", cudaStreamBeginCapture(l->stream, cudaStreamCaptureModeThreadLocal))) return 1;
        for (int i = 0; i < 16; ++i) fma_kernel<<<l->blocks, l->threads, 0, l->stream>>>(l->out, l->iters);
        if (failed("capture", cudaStreamEndCapture(l->stream, &graph))) return 1;
        if (failed("instantiate", cudaGraphInstantiate(&l->graph, graph, 0))) return 1;
    }
    return 0;
}

static void pause_s(double seconds) {
    struct timespec t = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&t, &t) != 0) {
    }
}

static int run(const char *name, double seconds, double idle_at, double idle_s) {
    Load l;
    if (prepare(&l, name)) return 1;
    int latency = strcmp(name, "latency") == 0;
    for (int i = 0; i < 3; ++i)  // warm-up: module load, graph upload
        if (failed("warm-up", one(&l))) return 1;
    long cap = latency ? (long)(seconds * 6000) + 1000 : 0, count = 0;
    double *lat = latency ? (double *)malloc(cap * sizeof(double)) : NULL;
    double start = wall_s(), mark = start;
    long in_second = 0, second_first = 0;
    printf("{\"step\":\"ready\",\"kernel\":\"%s\",\"pid\":%d,\"wall\":%.3f,\"blocks\":%d,\"unit\":\"%s\"}\n", name,
           getpid(), start, l.blocks, latency ? "us" : l.unit);
    fflush(stdout);
    while (1) {
        double t0 = wall_s();
        if (failed(name, one(&l))) return 1;
        double t = wall_s();
        if (latency && count < cap) lat[count] = (t - t0) * 1e6;
        ++count;
        ++in_second;
        if (t - mark >= 1.0) {
            if (latency) {
                long upto = count < cap ? count : cap, n = upto > second_first ? upto - second_first : 0;
                qsort(lat + second_first, n, sizeof(double), compare);
                printf("{\"step\":\"second\",\"from\":%.3f,\"to\":%.3f,\"rate\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f}\n",
                       mark, t, in_second / (t - mark), pick(lat + second_first, n, 0.5),
                       pick(lat + second_first, n, 0.99));
                second_first = upto;
            } else
                printf("{\"step\":\"second\",\"from\":%.3f,\"to\":%.3f,\"rate\":%.3f}\n", mark, t,
                       in_second * l.per_unit / (t - mark));
            fflush(stdout);
            mark = t;
            in_second = 0;
        }
        if (idle_s > 0 && t - start >= idle_at) {
            printf("{\"step\":\"idle\",\"wall\":%.3f,\"seconds\":%.3f}\n", t, idle_s);
            fflush(stdout);
            pause_s(idle_s);
            mark = wall_s();
            in_second = 0;
            printf("{\"step\":\"resume\",\"wall\":%.3f}\n", mark);
            fflush(stdout);
            start += mark - t;  // SECONDS counts running time
            idle_s = 0;
        }
        if (t - start >= seconds) break;
        if (latency) usleep(200);  // a request stream, not a saturating loop
    }
    double end = wall_s();
    if (latency) {
        long n = count < cap ? count : cap;
        qsort(lat, n, sizeof(double), compare);
        printf("{\"step\":\"done\",\"kernel\":\"latency\",\"wall\":%.3f,\"seconds\":%.3f,\"launches\":%ld,"
               "\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f}\n",
               end, end - start, count, pick(lat, n, 0.5), pick(lat, n, 0.99), pick(lat, n, 0.999), pick(lat, n, 1.0));
    } else
        printf("{\"step\":\"done\",\"kernel\":\"%s\",\"wall\":%.3f,\"seconds\":%.3f,\"rate\":%.3f,\"unit\":\"%s\"}\n",
               name, end, end - start, count * l.per_unit / (end - start), l.unit);
    fflush(stdout);
    return 0;
}

static void alloc_step(const char *step, size_t mib) {
    void *ptr = NULL;
    cudaError_t rc = cudaMalloc(&ptr, mib << 20);
    if (rc == cudaSuccess)
        cudaFree(ptr);
    else
        cudaGetLastError();  // clear it so that the next call runs
    printf("{\"step\":\"%s\",\"mib\":%zu,\"ok\":%s,\"error\":\"%s\"}\n", step, mib, rc == cudaSuccess ? "true" : "false",
           rc == cudaSuccess ? "" : cudaGetErrorName(rc));
    fflush(stdout);
}

static int fill(size_t chunk, size_t most, double hold_s) {
    size_t held = 0;
    void *ptr = NULL;
    cudaError_t rc = cudaSuccess;
    while (held + chunk <= most && (rc = cudaMalloc(&ptr, chunk << 20)) == cudaSuccess) held += chunk;  // kept
    if (rc != cudaSuccess) cudaGetLastError();
    printf("{\"step\":\"filled\",\"mib\":%zu,\"pid\":%d,\"stopped\":\"%s\"}\n", held, (int)getpid(),
           rc == cudaSuccess ? "most" : cudaGetErrorName(rc));
    fflush(stdout);
    usleep((useconds_t)(hold_s * 1e6));
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "fill") == 0)
        return fill(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10), atof(argv[4]));
    if (argc >= 4 && strcmp(argv[1], "alloc") == 0) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        printf("{\"step\":\"mem_get_info\",\"free_mib\":%zu,\"total_mib\":%zu}\n", free_b >> 20, total_b >> 20);
        alloc_step("within", strtoull(argv[2], NULL, 10));
        alloc_step("over", strtoull(argv[3], NULL, 10));
        return 0;
    }
    const char *kinds[] = {"compute", "memory", "graph", "latency"};
    for (int i = 0; argc >= 3 && i < 4; ++i)
        if (strcmp(argv[1], kinds[i]) == 0)
            return run(argv[1], atof(argv[2]), argc >= 5 ? atof(argv[3]) : 0, argc >= 5 ? atof(argv[4]) : 0);
    fprintf(stderr,
            "usage: %s compute|memory|graph|latency SECONDS [IDLE_AT IDLE_S] | alloc WITHIN_MIB OVER_MIB | "
            "fill CHUNK_MIB MOST_MIB HOLD_S\n",
            argv[0]);
    return 2;
}
