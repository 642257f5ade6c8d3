/* An emulated GPU behind the CUDA driver API and NVML, for running HAMi-core's limiter on a machine without
 * one (benchmarks/isolation/emulated).
 *
 * Built as one library and linked as libcuda.so.1 and libnvidia-ml.so.1, so that HAMi-core, preloaded into a
 * tenant, finds it where it looks for the driver's. Every process on the emulated GPU shares one state file
 * (TF_FAKE_GPU_STATE): the GPU runs one kernel at a time, in the order they are launched, whoever launched them
 * (time-sliced processes, not side by side); a kernel lasts what its launcher says (its first parameter, a
 * double of seconds: the emulated runtime header works it out from the kernel's work); a synchronize waits for
 * the caller's last kernel to end. NVML reports what HAMi-core's watcher reads: the processes holding a
 * context (and their memory), and each one's busy share of the window asked (its utilisation).
 *
 * What it does not model: kernels of two processes overlapping, clocks, copies between host and device
 * (memset and memcpy are instant), errors other than running out of memory. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUstream, *CUfunction;
typedef unsigned long long CUdeviceptr;
typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_READY = 600 };
enum { NVML_INSUFFICIENT_SIZE = 7 };
enum { ATTR_MULTIPROCESSOR_COUNT = 16, ATTR_MAX_THREADS_PER_MULTIPROCESSOR = 39, ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
       ATTR_COMPUTE_CAPABILITY_MINOR = 76 };

#define SMS 132
#define THREADS_PER_SM 2048
#define MEMORY (141ULL << 30)
#define CONTEXT_MEMORY (512ULL << 20) /* what NVML shows a process holding once it has a context */
#define SPANS (1 << 17)               /* kernels remembered: over a second of the shortest ones */
#define PROCS 64
#define NAME "NVIDIA H200" /* the GPU whose kernel times cuda_runtime.h uses */
#define UUID "GPU-00000000-0000-0000-0000-00000000e0e0"

typedef struct {
    int pid;
    double start, end;
} span_t;

typedef struct {
    int pid;
    unsigned long long memory;
} proc_t;

typedef struct {
    double free_at;          /* when the GPU ends the last kernel launched */
    unsigned long long next; /* spans written so far */
    span_t spans[SPANS];
    proc_t procs[PROCS];
} state_t;

static state_t *state;
static int state_fd = -1;
static double last_end; /* this process's last kernel */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double wall(void) {
    struct timeval t;
    gettimeofday(&t, NULL);
    return t.tv_sec + t.tv_usec * 1e-6;
}

static int attach(void) {
    if (state != NULL) return 0;
    const char *path = getenv("TF_FAKE_GPU_STATE");
    int fd = open(path ? path : "/tmp/tf-fake-gpu.state", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    flock(fd, LOCK_EX);
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_size < (off_t)sizeof(state_t)) ftruncate(fd, sizeof(state_t));
    flock(fd, LOCK_UN);
    void *mapped = mmap(NULL, sizeof(state_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
        close(fd);
        return -1;
    }
    state_fd = fd;
    state = mapped;
    return 0;
}

static void lock(void) { flock(state_fd, LOCK_EX); }
static void unlock(void) { flock(state_fd, LOCK_UN); }

static int alive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

/* This process's slot (made on first use; a dead process's slot is taken over). Under the lock. */
static proc_t *mine(void) {
    int pid = getpid();
    proc_t *free_slot = NULL;
    for (int i = 0; i < PROCS; i++) {
        if (state->procs[i].pid == pid) return &state->procs[i];
        if (free_slot == NULL && !alive(state->procs[i].pid)) free_slot = &state->procs[i];
    }
    if (free_slot != NULL) *free_slot = (proc_t){pid, CONTEXT_MEMORY};
    return free_slot;
}

static void run_kernel(double seconds) {
    lock();
    double t = now(), start = state->free_at > t ? state->free_at : t;
    last_end = state->free_at = start + seconds;
    state->spans[state->next % SPANS] = (span_t){getpid(), start, last_end};
    state->next++;
    unlock();
}

/* Until this process's last kernel ends: asleep but for its last SPIN_S, where a sleep would overshoot the end
 * by its wake-up time (tens of microseconds here, a sixth of the copy load's kernel). */
#define SPIN_S 100e-6
static void wait_kernels(void) {
    double left = last_end - now() - SPIN_S;
    if (left > 0) {
        struct timespec t = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        while (nanosleep(&t, &t) != 0) {
        }
    }
    while (now() < last_end) {
    }
}

/* ---- the driver API ---- */

CUresult cuInit(unsigned int flags) {
    (void)flags;
    return attach() == 0 ? OK : 3; /* CUDA_ERROR_NOT_INITIALIZED */
}
CUresult cuDriverGetVersion(int *version) {
    *version = 13000;
    return OK;
}
CUresult cuDeviceGetCount(int *count) {
    *count = 1;
    return OK;
}
CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (ordinal != 0) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *device = 0;
    return OK;
}
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {
    (void)device;
    *value = attribute == ATTR_MULTIPROCESSOR_COUNT              ? SMS
             : attribute == ATTR_MAX_THREADS_PER_MULTIPROCESSOR  ? THREADS_PER_SM
             : attribute == ATTR_COMPUTE_CAPABILITY_MAJOR        ? 9
             : attribute == ATTR_COMPUTE_CAPABILITY_MINOR        ? 0
                                                                 : 1;
    return OK;
}
CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    (void)device;
    strncpy(name, NAME, length);
    name[length - 1] = '\0';
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    (void)device;
    *bytes = MEMORY;
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    (void)device;
    if (attach() != 0) return 3;
    lock();
    proc_t *slot = mine();
    unlock();
    if (slot == NULL) return OUT_OF_MEMORY;
    *context = (CUcontext)state;
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    (void)device;
    return OK;
}
CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int *flags, int *active) {
    (void)device;
    *flags = 0;
    *active = state != NULL;
    return OK;
}
CUresult cuCtxSetCurrent(CUcontext context) {
    (void)context;
    return OK;
}
CUresult cuCtxGetCurrent(CUcontext *context) {
    *context = (CUcontext)state;
    return OK;
}
CUresult cuCtxGetDevice(CUdevice *device) {
    *device = 0;
    return OK;
}
CUresult cuCtxSynchronize(void) {
    wait_kernels();
    return OK;
}
CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
    (void)flags;
    *stream = (CUstream)(uintptr_t)1;
    return OK;
}
CUresult cuStreamSynchronize(CUstream stream) {
    (void)stream;
    wait_kernels();
    return OK;
}
CUresult cuStreamDestroy_v2(CUstream stream) {
    (void)stream;
    return OK;
}

/* Memory: addresses only, counted against the GPU's memory and shown by NVML as the process's. */
static CUdeviceptr next_address = 1ULL << 40;

CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes) {
    if (attach() != 0) return 3;
    lock();
    unsigned long long used = 0;
    for (int i = 0; i < PROCS; i++)
        if (alive(state->procs[i].pid)) used += state->procs[i].memory;
    proc_t *slot = mine();
    int fits = slot != NULL && used + bytes <= MEMORY;
    if (fits) slot->memory += bytes;
    unlock();
    if (!fits) return OUT_OF_MEMORY;
    *pointer = next_address;
    next_address += (bytes + 0xfffff) & ~0xfffffULL;
    return OK;
}
/* Freeing does not give the bytes back to the count: enough for the benchmark's one probe per process. */
CUresult cuMemFree_v2(CUdeviceptr pointer) {
    (void)pointer;
    return OK;
}
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    unsigned long long used = 0;
    if (attach() == 0) {
        lock();
        for (int i = 0; i < PROCS; i++)
            if (alive(state->procs[i].pid)) used += state->procs[i].memory;
        unlock();
    }
    *total = MEMORY;
    *free_bytes = used < MEMORY ? MEMORY - used : 0;
    return OK;
}
CUresult cuMemsetD8_v2(CUdeviceptr pointer, unsigned char value, size_t count) {
    (void)pointer, (void)value, (void)count;
    return OK;
}

static double seconds_of(void **params) { return params != NULL && params[0] != NULL ? *(double *)params[0] : 0; }

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                        void **extra) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)stream, (void)extra;
    run_kernel(seconds_of(params));
    return OK;
}

const char *fake_error_name(CUresult rc) {
    return rc == OK ? "CUDA_SUCCESS" : rc == OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_UNKNOWN";
}
CUresult cuGetErrorName(CUresult rc, const char **name) {
    *name = fake_error_name(rc);
    return OK;
}
CUresult cuGetErrorString(CUresult rc, const char **text) { return cuGetErrorName(rc, text); }

/* Graphs: a list of kernel nodes (no edges: they run in the order added), launched as one. */
typedef struct {
    CUfunction func;
    unsigned int grid[3], block[3], shared;
    void **params, **extra;
    void *kern, *ctx;
} kernel_params_t; /* CUDA_KERNEL_NODE_PARAMS_v2's layout */

typedef struct node {
    kernel_params_t params;
    struct graph *owner;
} node_t;

typedef struct graph {
    node_t *nodes;
    size_t count;
} graph_t;

CUresult cuGraphCreate(graph_t **graph, unsigned int flags) {
    (void)flags;
    *graph = calloc(1, sizeof(graph_t));
    return *graph ? OK : OUT_OF_MEMORY;
}
CUresult cuGraphAddKernelNode_v2(node_t **node, graph_t *graph, void *deps, size_t ndeps,
                                 const kernel_params_t *params) {
    (void)deps, (void)ndeps;
    node_t *grown = realloc(graph->nodes, (graph->count + 1) * sizeof(node_t));
    if (grown == NULL) return OUT_OF_MEMORY;
    graph->nodes = grown;
    graph->nodes[graph->count] = (node_t){*params, graph};
    /* A node's handle must outlive the array's growth: hand out a copy of it. */
    node_t *handle = malloc(sizeof(node_t));
    if (handle == NULL) return OUT_OF_MEMORY;
    *handle = graph->nodes[graph->count++];
    *node = handle;
    return OK;
}
CUresult cuGraphGetNodes(graph_t *graph, node_t **nodes, size_t *count) {
    if (nodes == NULL) {
        *count = graph->count;
        return OK;
    }
    size_t n = *count < graph->count ? *count : graph->count;
    for (size_t i = 0; i < n; i++) nodes[i] = &graph->nodes[i];
    *count = n;
    return OK;
}
CUresult cuGraphNodeGetType(node_t *node, int *type) {
    (void)node;
    *type = 0; /* CU_GRAPH_NODE_TYPE_KERNEL: the only kind made here */
    return OK;
}
CUresult cuGraphKernelNodeGetParams_v2(node_t *node, kernel_params_t *params) {
    *params = node->params;
    return OK;
}
CUresult cuGraphChildGraphNodeGetGraph(node_t *node, graph_t **graph) {
    (void)node, (void)graph;
    return INVALID_VALUE;
}
CUresult cuGraphInstantiateWithFlags(graph_t **exec, graph_t *graph, unsigned long long flags) {
    (void)flags;
    *exec = graph;
    return OK;
}
CUresult cuGraphLaunch(graph_t *exec, CUstream stream) {
    (void)stream;
    double seconds = 0;
    for (size_t i = 0; i < exec->count; i++) seconds += seconds_of(exec->nodes[i].params.params);
    run_kernel(seconds);
    return OK;
}
CUresult cuGraphExecDestroy(graph_t *exec) {
    (void)exec;
    return OK;
}
CUresult cuGraphDestroy(graph_t *graph) {
    (void)graph;
    return OK;
}

/* ---- NVML ---- */

typedef struct {
    unsigned int pid;
    unsigned long long used;
} process_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long used;
    unsigned int gpu_instance, compute_instance;
} process_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long timestamp;
    unsigned int sm, mem, enc, dec;
} utilization_sample_t;

typedef struct {
    unsigned long long total, free, used;
} memory_v1_t;

nvmlReturn_t nvmlInit_v2(void) { return attach() == 0 ? OK : 1; }
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}
nvmlReturn_t nvmlShutdown(void) { return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    *count = 1;
    return OK;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index != 0) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *device = (nvmlDevice_t)(uintptr_t)0xe0e0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return strcmp(uuid, UUID) == 0 ? nvmlDeviceGetHandleByIndex_v2(0, device) : 6; /* NVML_ERROR_NOT_FOUND */
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    (void)device;
    *index = 0;
    return OK;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    (void)device;
    strncpy(uuid, UUID, length);
    uuid[length - 1] = '\0';
    return OK;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    (void)device;
    strncpy(name, NAME, length);
    name[length - 1] = '\0';
    return OK;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, memory_v1_t *memory) {
    (void)device;
    size_t free_bytes, total;
    cuMemGetInfo_v2(&free_bytes, &total);
    *memory = (memory_v1_t){total, free_bytes, total - free_bytes};
    return OK;
}

/* The processes holding a context, as either layout (``size`` bytes each). */
static nvmlReturn_t running(unsigned int *count, void *infos, size_t size) {
    if (attach() != 0) return 1;
    lock();
    unsigned int n = 0, room = *count;
    for (int i = 0; i < PROCS; i++) {
        proc_t p = state->procs[i];
        if (!alive(p.pid)) continue;
        if (infos != NULL && n < room) {
            process_v2_t row = {(unsigned int)p.pid, p.memory, 0xffffffff, 0xffffffff};
            memcpy((char *)infos + n * size, &row, size);
        }
        n++;
    }
    unlock();
    *count = n;
    return n > room ? NVML_INSUFFICIENT_SIZE : OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count, process_v1_t *infos) {
    (void)device;
    return running(count, infos, sizeof(process_v1_t));
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count, process_v2_t *infos) {
    (void)device;
    return running(count, infos, sizeof(process_v2_t));
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, process_v2_t *infos) {
    (void)device;
    return running(count, infos, sizeof(process_v2_t));
}

/* Each process's busy share of the time since ``last_seen`` (microseconds of the wall clock; 0: the last
 * second), one sample per process that ran in it. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, utilization_sample_t *samples, unsigned int *count,
                                             unsigned long long last_seen) {
    (void)device;
    if (attach() != 0) return 1;
    double t = now(), at = wall(), window = last_seen ? at - last_seen * 1e-6 : 1.0;
    if (window <= 0 || window > 10) window = 1.0;
    double lo = t - window;
    int pids[PROCS];
    double busy[PROCS];
    int n = 0;
    lock();
    for (unsigned long long i = state->next; i > 0 && state->next - i < SPANS; i--) {
        span_t s = state->spans[(i - 1) % SPANS];
        if (s.end <= lo) break;
        double ran = (s.end < t ? s.end : t) - (s.start > lo ? s.start : lo);
        if (ran <= 0) continue;
        int k = 0;
        while (k < n && pids[k] != s.pid) k++;
        if (k == n) {
            if (n == PROCS) continue;
            pids[n] = s.pid;
            busy[n++] = 0;
        }
        busy[k] += ran;
    }
    unlock();
    if (samples == NULL || *count < (unsigned int)n) {
        *count = n;
        return NVML_INSUFFICIENT_SIZE;
    }
    for (int k = 0; k < n; k++) {
        unsigned int share = (unsigned int)(100 * busy[k] / window + 0.5);
        samples[k] = (utilization_sample_t){(unsigned int)pids[k], (unsigned long long)(at * 1e6), share, 0, 0, 0};
    }
    *count = n;
    return OK;
}
const char *nvmlErrorString(nvmlReturn_t rc) { return rc == OK ? "Success" : "Unknown Error"; }
