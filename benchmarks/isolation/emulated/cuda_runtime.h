/* The CUDA runtime calls tenant_load.cu makes, on the CUDA driver API, for building its host code with g++
 * against the emulated GPU (benchmarks/isolation/emulated).
 *
 * tenant_load.cu is compiled unchanged but for its launches: each `NAME<<<GRID, BLOCK, SHARED, STREAM>>>(ARGS)`
 * is rewritten `tf_launch_NAME(GRID, BLOCK, SHARED, STREAM, ARGS)` before g++ sees it, and each tf_launch_NAME
 * below works out the kernel's seconds on an H200 from its work (its measured FP32 rate and memory bandwidth:
 * the compute load's 71 GFLOP in 1.7 ms, the copy's 537 MB in 0.15 ms, spread over the SMs its blocks fill)
 * and launches it through cuLaunchKernel with those seconds as its parameter. So HAMi-core, preloaded, sees
 * the driver calls a real runtime makes (cuLaunchKernel, cuMemAlloc_v2, cuGraphInstantiateWithFlags,
 * cuGraphLaunch), and the emulated GPU (fake_gpu.c) runs each kernel for its seconds. The kernels' bodies are
 * compiled as host functions that are never called. */
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

extern "C" {
typedef int CUresult;
typedef void *CUcontext, *CUgraph, *CUgraphNode, *CUgraphExec;
CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuDeviceGetAttribute(int *, int, int);
CUresult cuMemAlloc_v2(unsigned long long *, size_t);
CUresult cuMemFree_v2(unsigned long long);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuLaunchKernel(void *, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, void *, void **, void **);
CUresult cuStreamCreate(void **, unsigned int);
CUresult cuStreamSynchronize(void *);
CUresult cuGraphCreate(CUgraph *, unsigned int);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const void *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, void *);
}

#define __global__ [[maybe_unused]] static
struct tf_dim3 {
    unsigned int x, y, z;
};
static tf_dim3 threadIdx, blockIdx, blockDim, gridDim;
struct float4 {
    float x, y, z, w;
};

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef CUgraph cudaGraph_t;
typedef CUgraphExec cudaGraphExec_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorUnknown = 999 };
enum { cudaDevAttrMultiProcessorCount = 16, cudaStreamNonBlocking = 1, cudaStreamCaptureModeThreadLocal = 1 };

static const double TF_FLOPS = 70.87e9 / 1.7e-3;     /* the compute load's FP32 work per second on an H200 */
static const double TF_BYTES_PER_S = 536.87e6 / 0.15e-3; /* the copy load's bytes moved per second */
static const double TF_LAUNCH_S = 3e-6;                /* a kernel's fixed cost */

static cudaError_t tf_last_error = cudaSuccess;
static CUgraph tf_capturing = NULL; /* the graph a stream capture is adding to */

static cudaError_t tf_runtime(CUresult rc) {
    return rc == 0 ? cudaSuccess : rc == 2 ? cudaErrorMemoryAllocation : cudaErrorUnknown;
}

/* What the runtime does before its first call: the driver initialised, the primary context made current. */
static cudaError_t tf_ready() {
    static cudaError_t ready = -1;
    if (ready == -1) {
        CUcontext context = NULL;
        CUresult rc = cuInit(0);
        if (rc == 0) rc = cuDevicePrimaryCtxRetain(&context, 0);
        if (rc == 0) rc = cuCtxSetCurrent(context);
        ready = tf_runtime(rc);
    }
    return ready;
}

static const char *cudaGetErrorName(cudaError_t rc) {
    return rc == cudaSuccess ? "cudaSuccess" : rc == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation"
                                                                               : "cudaErrorUnknown";
}
static cudaError_t cudaGetLastError() {
    cudaError_t rc = tf_last_error;
    tf_last_error = cudaSuccess;
    return rc;
}
static cudaError_t cudaDeviceGetAttribute(int *value, int attribute, int device) {
    return tf_ready() ?: tf_runtime(cuDeviceGetAttribute(value, attribute, device));
}
static cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    return tf_ready() ?: tf_runtime(cuStreamCreate(stream, flags));
}
static cudaError_t cudaStreamSynchronize(cudaStream_t stream) { return tf_runtime(cuStreamSynchronize(stream)); }
template <typename T> static cudaError_t cudaMalloc(T **pointer, size_t bytes) {
    unsigned long long address = 0;
    cudaError_t rc = tf_ready() ?: tf_runtime(cuMemAlloc_v2(&address, bytes));
    *pointer = (T *)(uintptr_t)address;
    if (rc != cudaSuccess) tf_last_error = rc;
    return rc;
}
static cudaError_t cudaFree(void *pointer) { return tf_runtime(cuMemFree_v2((unsigned long long)(uintptr_t)pointer)); }
static cudaError_t cudaMemset(void *, int, size_t) { return cudaSuccess; }
static cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    return tf_ready() ?: tf_runtime(cuMemGetInfo_v2(free_bytes, total));
}
static cudaError_t cudaStreamBeginCapture(cudaStream_t, int) { return tf_runtime(cuGraphCreate(&tf_capturing, 0)); }
static cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *graph) {
    *graph = tf_capturing;
    tf_capturing = NULL;
    return cudaSuccess;
}
static cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
    return tf_runtime(cuGraphInstantiateWithFlags(exec, graph, flags));
}
static cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    return tf_runtime(cuGraphLaunch(exec, stream));
}

struct tf_kernel_params { /* CUDA_KERNEL_NODE_PARAMS_v2's layout */
    void *func;
    unsigned int grid[3], block[3], shared;
    void **params, **extra;
    void *kern, *ctx;
};

/* A kernel of `seconds` over `blocks` blocks: launched, or added to the graph being captured. */
static void tf_launch(int blocks, int threads, cudaStream_t stream, double seconds) {
    void **params = (void **)malloc(sizeof(void *)); /* kept: a captured node's parameters outlive the call */
    double *held = (double *)malloc(sizeof(double));
    *held = seconds + TF_LAUNCH_S;
    params[0] = held;
    static int kernel; /* stands for a function handle */
    CUresult rc;
    if (tf_capturing != NULL) {
        tf_kernel_params node = {&kernel, {(unsigned)blocks, 1, 1}, {(unsigned)threads, 1, 1}, 0, params, NULL,
                                 NULL, NULL};
        CUgraphNode made;
        rc = cuGraphAddKernelNode_v2(&made, tf_capturing, NULL, 0, &node);
    } else {
        rc = cuLaunchKernel(&kernel, blocks, 1, 1, threads, 1, 1, 0, stream, params, NULL);
        free(params);
        free(held);
    }
    if (rc != 0) tf_last_error = tf_runtime(rc);
}

/* The share of the GPU `blocks` blocks keep busy: all of it from one block per SM. */
static double tf_spread(int blocks) {
    static int sms = 0;
    if (sms == 0 && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) sms = 1;
    return blocks >= sms ? 1.0 : (double)blocks / sms;
}

static void tf_launch_fma_kernel(int blocks, int threads, size_t, cudaStream_t stream, float *, int iters) {
    tf_launch(blocks, threads, stream, 8.0 * iters * blocks * threads / (TF_FLOPS * tf_spread(blocks)));
}

static void tf_launch_copy_kernel(int blocks, int threads, size_t, cudaStream_t stream, const float4 *, float4 *,
                                  size_t n) {
    tf_launch(blocks, threads, stream, 2.0 * n * sizeof(float4) / (TF_BYTES_PER_S * tf_spread(blocks)));
}
