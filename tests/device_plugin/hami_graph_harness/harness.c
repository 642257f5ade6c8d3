/* Drives device_plugin/hami_build/graph_launch.c against a fake driver, one command a line on stdin, one JSON
 * line out per command (tests/device_plugin/test_hami_graph_launch.py asserts them):
 *   instantiate[-legacy|-params] GRAPH   -> {"rc": N, "exec": I}   (I: the exec's index, -1 on error; by
 *                                           cuGraphInstantiateWithFlags, cuGraphInstantiate or ...WithParams)
 *   launch I | launch unknown                      -> {"charged": BLOCKS or null, "driver_launches": N}
 *   destroy I                                      -> {"rc": N}
 *   pidfound 0|1                                   -> {}
 * GRAPH: mixed (kernels of 528 and 16 blocks, a copy, a child graph holding 10 blocks and a grandchild of 3),
 * copies (no kernel), huge (one kernel of 65535 x 65535 blocks), deep (a chain of 12 child graphs of one block
 * each), broken (the driver refuses to instantiate it). */
#include <string.h>

#include "include/libcuda_hook.h"

int pidfound = 1;
void *cuda_library_entry[1];

typedef struct fake_graph fake_graph;
typedef struct {
    CUgraphNodeType type;
    unsigned int grid[3];
    fake_graph *child;
} fake_node;
struct fake_graph {
    size_t count;
    fake_node nodes[4];
};

static fake_graph grandchild = {1, {{CU_GRAPH_NODE_TYPE_KERNEL, {3, 1, 1}, NULL}}};
static fake_graph child = {2, {{CU_GRAPH_NODE_TYPE_KERNEL, {5, 2, 1}, NULL}, {CU_GRAPH_NODE_TYPE_GRAPH, {0}, &grandchild}}};
static fake_graph mixed = {4,
                           {{CU_GRAPH_NODE_TYPE_KERNEL, {132, 4, 1}, NULL},
                            {CU_GRAPH_NODE_TYPE_KERNEL, {8, 1, 2}, NULL},
                            {CU_GRAPH_NODE_TYPE_MEMCPY, {0}, NULL},
                            {CU_GRAPH_NODE_TYPE_GRAPH, {0}, &child}}};
static fake_graph copies = {2, {{CU_GRAPH_NODE_TYPE_MEMCPY, {0}, NULL}, {CU_GRAPH_NODE_TYPE_MEMSET, {0}, NULL}}};
static fake_graph huge = {1, {{CU_GRAPH_NODE_TYPE_KERNEL, {65535, 65535, 1}, NULL}}};
static fake_graph broken = {1, {{CU_GRAPH_NODE_TYPE_KERNEL, {1, 1, 1}, NULL}}};
static fake_graph deep[12];

#define EXECS 5000
static char exec_pool[EXECS * 16]; /* distinct, aligned addresses standing for the driver's execs */
static int execs_made = 0;
static int driver_launches = 0;
static long long charged = -1;

static fake_node *node_of(CUgraphNode node) { return (fake_node *)(void *)node; }
static fake_graph *graph_of(CUgraph graph) { return (fake_graph *)(void *)graph; }

CUresult fake_cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count) {
    fake_graph *g = graph_of(graph);
    if (nodes != NULL) {
        for (size_t i = 0; i < g->count && i < *count; i++) {
            nodes[i] = (CUgraphNode)(void *)&g->nodes[i];
        }
    }
    *count = g->count;
    return CUDA_SUCCESS;
}

CUresult fake_cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type) {
    *type = node_of(node)->type;
    return CUDA_SUCCESS;
}

CUresult fake_cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params) {
    memset(params, 0, sizeof(*params));
    params->gridDimX = node_of(node)->grid[0];
    params->gridDimY = node_of(node)->grid[1];
    params->gridDimZ = node_of(node)->grid[2];
    params->blockDimX = 256;
    return CUDA_SUCCESS;
}

CUresult fake_cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *out) {
    *out = (CUgraph)(void *)node_of(node)->child;
    return CUDA_SUCCESS;
}

CUresult fake_cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    (void)flags;
    if (graph_of(graph) == &broken || execs_made == EXECS) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *exec = (CUgraphExec)(void *)&exec_pool[16 * execs_made++];
    return CUDA_SUCCESS;
}

CUresult fake_cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node, char *log, size_t size) {
    (void)error_node, (void)log, (void)size;
    return fake_cuGraphInstantiateWithFlags(exec, graph, 0);
}

CUresult fake_cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    CUresult rc = fake_cuGraphInstantiateWithFlags(exec, graph, params->flags);
    params->result_out = rc == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return rc;
}

CUresult fake_cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    (void)exec, (void)stream;
    driver_launches++;
    return CUDA_SUCCESS;
}

CUresult fake_cuGraphExecDestroy(CUgraphExec exec) {
    (void)exec;
    return CUDA_SUCCESS;
}

void rate_limiter(int grids, int blocks) {
    (void)blocks;
    charged = grids;
}
void ensure_post_init(void) {}
void pre_launch_kernel(void) {}

static fake_graph *named(const char *name) {
    if (strcmp(name, "mixed") == 0) return &mixed;
    if (strcmp(name, "copies") == 0) return &copies;
    if (strcmp(name, "huge") == 0) return &huge;
    if (strcmp(name, "deep") == 0) return &deep[0];
    if (strcmp(name, "broken") == 0) return &broken;
    return NULL;
}

static CUgraphExec exec_at(const char *index) {
    if (strcmp(index, "unknown") == 0) return (CUgraphExec)(void *)&exec_pool[sizeof(exec_pool) - 16];
    return (CUgraphExec)(void *)&exec_pool[16 * atoi(index)];
}

static int index_of(CUgraphExec exec) { return (int)(((char *)(void *)exec - exec_pool) / 16); }

int main(void) {
    for (int i = 0; i < 12; i++) { /* deep[i]: one block, and deep[i + 1] as its child */
        deep[i].count = i < 11 ? 2 : 1;
        deep[i].nodes[0] = (fake_node){CU_GRAPH_NODE_TYPE_KERNEL, {1, 1, 1}, NULL};
        deep[i].nodes[1] = (fake_node){CU_GRAPH_NODE_TYPE_GRAPH, {0}, i < 11 ? &deep[i + 1] : NULL};
    }
    char verb[32], arg[32];
    while (scanf("%31s %31s", verb, arg) == 2) {
        if (strncmp(verb, "instantiate", 11) == 0) {
            CUgraphExec exec = NULL;
            CUgraph graph = (CUgraph)(void *)named(arg);
            CUDA_GRAPH_INSTANTIATE_PARAMS params = {0};
            CUresult rc = strcmp(verb, "instantiate-legacy") == 0   ? cuGraphInstantiate(&exec, graph, NULL, NULL, 0)
                          : strcmp(verb, "instantiate-params") == 0 ? cuGraphInstantiateWithParams(&exec, graph, &params)
                                                                    : cuGraphInstantiateWithFlags(&exec, graph, 0);
            printf("{\"rc\": %d, \"exec\": %d}\n", (int)rc, rc == CUDA_SUCCESS ? index_of(exec) : -1);
        } else if (strcmp(verb, "launch") == 0) {
            charged = -1;
            CUresult rc = cuGraphLaunch(exec_at(arg), NULL);
            if (charged < 0) {
                printf("{\"rc\": %d, \"charged\": null, \"driver_launches\": %d}\n", (int)rc, driver_launches);
            } else {
                printf("{\"rc\": %d, \"charged\": %lld, \"driver_launches\": %d}\n", (int)rc, charged, driver_launches);
            }
        } else if (strcmp(verb, "destroy") == 0) {
            printf("{\"rc\": %d}\n", (int)cuGraphExecDestroy(exec_at(arg)));
        } else if (strcmp(verb, "pidfound") == 0) {
            pidfound = atoi(arg);
            printf("{}\n");
        } else {
            printf("{\"error\": \"unknown command %s\"}\n", verb);
        }
        fflush(stdout);
    }
    return 0;
}
