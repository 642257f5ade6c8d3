// Probe program for scripts/gpu-check: what a CUDA runtime application sees under HAMi-core's limits.
//
// Built by scripts/gpu-check with nvcc (shared cudart, as PyTorch and most applications link it) and
// run with and without LD_PRELOAD=libvgpu.so. Every result is one JSON line on stdout.
//
//   hami_check mem <held_mib> <extra_mib>   allocate held_mib, then extra_mib while holding it, then
//                                           extra_mib alone; cudaMemGetInfo before
//   hami_check live <mib>                   allocate mib, wait for a line on stdin, allocate mib again
//   hami_check burn <seconds>               launch a compute-bound kernel back to back, one sync per
//                                           launch; kernels per second, per second and overall
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void alloc_line(const char *step, size_t mib, void **ptr) {
    cudaError_t rc = cudaMalloc(ptr, mib << 20);
    if (rc != cudaSuccess) {
        *ptr = NULL;
        cudaGetLastError();  // clear the sticky-free error so later calls run
    }
    printf("{\"step\":\"%s\",\"mib\":%zu,\"ok\":%s,\"error\":\"%s\"}\n", step, mib, rc == cudaSuccess ? "true" : "false",
           rc == cudaSuccess ? "" : cudaGetErrorName(rc));
    fflush(stdout);
}

static void meminfo(void) {
    size_t free_b = 0, total_b = 0;
    cudaError_t rc = cudaMemGetInfo(&free_b, &total_b);
    printf("{\"step\":\"mem_get_info\",\"ok\":%s,\"free_mib\":%zu,\"total_mib\":%zu}\n",
           rc == cudaSuccess ? "true" : "false", free_b >> 20, total_b >> 20);
    fflush(stdout);
}

__global__ void burn_kernel(float *out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f, d = blockIdx.x * 1e-3f;
    for (int i = 0; i < iters; ++i) {  // four dependent-free FMA chains keep the FP32 pipes busy
        a = fmaf(a, b, c);
        d = fmaf(d, c, b);
        b = fmaf(b, 0.99999f, 1e-7f);
        c = fmaf(c, 1.00001f, -1e-7f);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a + b + c + d;
}

static int burn(double seconds) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int blocks = sms * 16, threads = 256, iters = 1 << 14;
    float *out = NULL;
    if (cudaMalloc(&out, (size_t)blocks * threads * sizeof(float)) != cudaSuccess) {
        printf("{\"step\":\"burn\",\"ok\":false,\"error\":\"cudaMalloc\"}\n");
        return 1;
    }
    burn_kernel<<<blocks, threads>>>(out, iters);  // warm-up (module load)
    cudaDeviceSynchronize();
    double start = now_s(), mark = start;
    long total = 0, in_second = 0;
    printf("{\"step\":\"burn_start\",\"blocks\":%d,\"threads\":%d,\"iters\":%d}\n", blocks, threads, iters);
    fflush(stdout);
    while (1) {
        burn_kernel<<<blocks, threads>>>(out, iters);
        cudaError_t rc = cudaDeviceSynchronize();
        if (rc != cudaSuccess) {
            printf("{\"step\":\"burn\",\"ok\":false,\"error\":\"%s\"}\n", cudaGetErrorName(rc));
            return 1;
        }
        ++total;
        ++in_second;
        double t = now_s();
        if (t - mark >= 1.0) {
            printf("{\"step\":\"burn_second\",\"t\":%.3f,\"kernels_per_s\":%.1f}\n", t - start, in_second / (t - mark));
            fflush(stdout);
            mark = t;
            in_second = 0;
        }
        if (t - start >= seconds) {
            printf("{\"step\":\"burn\",\"ok\":true,\"kernels\":%ld,\"seconds\":%.3f,\"kernels_per_s\":%.1f}\n", total,
                   t - start, total / (t - start));
            fflush(stdout);
            return 0;
        }
    }
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "mem") == 0) {
        size_t held = strtoull(argv[2], NULL, 10), extra = strtoull(argv[3], NULL, 10);
        void *a = NULL, *b = NULL, *c = NULL;
        meminfo();
        alloc_line("held", held, &a);
        alloc_line("extra_while_held", extra, &b);
        if (b != NULL) cudaFree(b);
        if (a != NULL) cudaFree(a);
        alloc_line("extra_alone", extra, &c);
        if (c != NULL) cudaFree(c);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "live") == 0) {
        size_t mib = strtoull(argv[2], NULL, 10);
        void *a = NULL, *b = NULL;
        meminfo();
        alloc_line("before", mib, &a);
        if (a != NULL) cudaFree(a);
        printf("{\"step\":\"waiting\"}\n");
        fflush(stdout);
        char line[64];
        if (fgets(line, sizeof line, stdin) == NULL) return 1;
        meminfo();
        alloc_line("after", mib, &b);
        if (b != NULL) cudaFree(b);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "burn") == 0) return burn(atof(argv[2]));
    fprintf(stderr, "usage: %s mem HELD_MIB EXTRA_MIB | live MIB | burn SECONDS\n", argv[0]);
    return 2;
}
