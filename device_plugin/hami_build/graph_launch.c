/* CUDA Graph launches charged to HAMi-core's compute limiter.
 *
 * HAMi-core charges every kernel launch its thread blocks (rate_limiter), but a graph replay launches its
 * kernels inside the driver: the limiter never sees them, so a tenant under a compute cap escapes it by
 * capturing its loop once and replaying it. Here each graph instantiated through HAMi-core has its kernel
 * nodes' blocks summed (child graphs included), and every launch of it is charged that sum, as the same
 * kernels launched one by one would be.
 *
 * The change graph-launch (device_plugin/hami_build/graph_edits.py) appends this to
 * src/cuda/graph.c in place of that file's pass-through cuGraphInstantiate, cuGraphInstantiateWithFlags,
 * cuGraphLaunch and cuGraphExecDestroy, adds cuGraphInstantiateWithParams to HAMi-core's hooks, and lets
 * cuGetProcAddress hand them out (it hands out no cuGraph* hook otherwise; "cuGraphInstantiate" by the CUDA
 * version asked, as its signature changed in 12.0). Not charged: a graph instantiated some other way (the
 * first such launch logs a warning), conditional nodes' bodies, and kernel parameters changed after
 * instantiation. A graph
 * launched on stream 0 by a program built for per-thread default streams runs on the legacy default stream,
 * as HAMi-core's own cuLaunchKernel hook already does. */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>

#include "include/libcuda_hook.h"
#include "include/libvgpu.h"
#include "include/memory_limit.h"
#include "multiprocess/multiprocess_memory_limit.h"

extern int pidfound;
extern void rate_limiter(int grids, int blocks);

#define TF_GRAPH_SLOTS 4096 /* live graph execs remembered; past that a new one is not charged (warned) */
#define TF_GRAPH_DEPTH 8    /* child graphs followed this deep */
#define TF_GRAPH_GONE ((CUgraphExec)(uintptr_t)1)

typedef struct {
    CUgraphExec exec; /* NULL: never used; TF_GRAPH_GONE: destroyed */
    int64_t blocks;
} tf_graph_cost_t;

static tf_graph_cost_t tf_graph_costs[TF_GRAPH_SLOTS];
static pthread_mutex_t tf_graph_lock = PTHREAD_MUTEX_INITIALIZER;
static int tf_graph_unknown_warned = 0;

/* The thread blocks of one launch of every kernel node in graph, child graphs included. */
static int64_t tf_graph_blocks(CUgraph graph, int depth) {
    size_t count = 0;
    if (depth > TF_GRAPH_DEPTH ||
        CUDA_OVERRIDE_CALL(cuda_library_entry, cuGraphGetNodes, graph, NULL, &count) != CUDA_SUCCESS || count == 0) {
        return 0;
    }
    CUgraphNode *nodes = malloc(count * sizeof(*nodes));
    if (nodes == NULL) {
        return 0;
    }
    int64_t blocks = 0;
    if (CUDA_OVERRIDE_CALL(cuda_library_entry, cuGraphGetNodes, graph, nodes, &count) == CUDA_SUCCESS) {
        for (size_t i = 0; i < count; i++) {
            CUgraphNodeType type;
            if (CUDA_OVERRIDE_CALL(cuda_library_entry, cuGraphNodeGetType, nodes[i], &type) != CUDA_SUCCESS) {
                continue;
            }
            if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
                CUDA_KERNEL_NODE_PARAMS params;
                if (CUDA_OVERRIDE_CALL(cuda_library_entry, cuGraphKernelNodeGetParams_v2, nodes[i], &params) ==
                    CUDA_SUCCESS) {
                    blocks += (int64_t)params.gridDimX * params.gridDimY * params.gridDimZ;
                }
            } else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
                CUgraph child;
                if (CUDA_OVERRIDE_CALL(cuda_library_entry, cuGraphChildGraphNodeGetGraph, nodes[i], &child) ==
                    CUDA_SUCCESS) {
                    blocks += tf_graph_blocks(child, depth + 1);
                }
            }
        }
    }
    free(nodes);
    return blocks;
}

static size_t tf_graph_slot(CUgraphExec exec) {
    return (size_t)((((uintptr_t)exec) >> 4) * (uintptr_t)2654435761u) % TF_GRAPH_SLOTS;
}

/* Remember what one launch of exec costs; 0 when remembered, -1 when the table is full. */
static int tf_graph_remember(CUgraphExec exec, int64_t blocks) {
    int stored = -1;
    pthread_mutex_lock(&tf_graph_lock);
    for (size_t n = 0, i = tf_graph_slot(exec); n < TF_GRAPH_SLOTS; n++, i = (i + 1) % TF_GRAPH_SLOTS) {
        CUgraphExec at = tf_graph_costs[i].exec;
        if (at == NULL || at == TF_GRAPH_GONE || at == exec) {
            tf_graph_costs[i].exec = exec;
            tf_graph_costs[i].blocks = blocks;
            stored = 0;
            break;
        }
    }
    pthread_mutex_unlock(&tf_graph_lock);
    return stored;
}

/* What one launch of exec costs, or -1 when it was not instantiated through HAMi-core. With forget, the
 * entry is dropped (the exec is being destroyed). */
static int64_t tf_graph_cost(CUgraphExec exec, int forget) {
    int64_t blocks = -1;
    pthread_mutex_lock(&tf_graph_lock);
    for (size_t n = 0, i = tf_graph_slot(exec); n < TF_GRAPH_SLOTS; n++, i = (i + 1) % TF_GRAPH_SLOTS) {
        if (tf_graph_costs[i].exec == NULL) {
            break;
        }
        if (tf_graph_costs[i].exec == exec) {
            blocks = tf_graph_costs[i].blocks;
            if (forget) {
                tf_graph_costs[i].exec = TF_GRAPH_GONE;
            }
            break;
        }
    }
    pthread_mutex_unlock(&tf_graph_lock);
    return blocks;
}

static void tf_graph_instantiated(CUresult res, CUgraphExec *exec, CUgraph graph) {
    if (res != CUDA_SUCCESS || exec == NULL) {
        return;
    }
    int64_t blocks = tf_graph_blocks(graph, 0);
    if (tf_graph_remember(*exec, blocks) == 0) {
        LOG_INFO("graph exec %p: each launch charged %" PRId64 " blocks", (void *)*exec, blocks);
    } else {
        LOG_WARN("graph exec %p: %d graph execs already remembered, its launches are not charged",
                 (void *)*exec, TF_GRAPH_SLOTS);
    }
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize) {
    LOG_DEBUG("cuGraphInstantiate");
    CUresult res = CUDA_OVERRIDE_CALL(cuda_library_entry, cuGraphInstantiate, phGraphExec, hGraph, phErrorNode,
                                      logBuffer, bufferSize);
    tf_graph_instantiated(res, phGraphExec, hGraph);
    return res;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    LOG_DEBUG("cuGraphInstantiateWithFlags");
    CUresult res = CUDA_OVERRIDE_CALL(cuda_library_entry, cuGraphInstantiateWithFlags, phGraphExec, hGraph, flags);
    tf_graph_instantiated(res, phGraphExec, hGraph);
    return res;
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    LOG_DEBUG("cuGraphInstantiateWithParams");
    CUresult res =
        CUDA_OVERRIDE_CALL(cuda_library_entry, cuGraphInstantiateWithParams, phGraphExec, hGraph, instantiateParams);
    tf_graph_instantiated(res, phGraphExec, hGraph);
    return res;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    LOG_DEBUG("cuGraphLaunch");
    ENSURE_RUNNING();
    ensure_post_init();
    pre_launch_kernel();
    if (pidfound == 1) {
        int64_t blocks = tf_graph_cost(hGraphExec, 0);
        if (blocks > 0) {
            rate_limiter(blocks > INT_MAX ? INT_MAX : (int)blocks, 0);
        } else if (blocks < 0 && !__atomic_exchange_n(&tf_graph_unknown_warned, 1, __ATOMIC_RELAXED)) {
            LOG_WARN("graph exec %p was not instantiated through HAMi-core: its launches are not charged",
                     (void *)hGraphExec);
        }
    }
    return CUDA_OVERRIDE_CALL(cuda_library_entry, cuGraphLaunch, hGraphExec, hStream);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    LOG_DEBUG("cuGraphExecDestroy");
    tf_graph_cost(hGraphExec, 1);
    return CUDA_OVERRIDE_CALL(cuda_library_entry, cuGraphExecDestroy, hGraphExec);
}
