/* Stand-in for HAMi-core's include/libcuda_hook.h in the graph-launch harness: the real cuda.h, HAMi-core's
 * undoing of its cuGraphInstantiate macro, and CUDA_OVERRIDE_CALL routed to the harness's fake driver. */
#ifndef HARNESS_LIBCUDA_HOOK_H
#define HARNESS_LIBCUDA_HOOK_H
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda.h>

#undef cuGraphInstantiate
CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize);

extern void *cuda_library_entry[];
#define CUDA_OVERRIDE_CALL(table, sym, ...) ((void)(table), fake_##sym(__VA_ARGS__))
#define LOG_DEBUG(msg, ...)
#define LOG_INFO(msg, ...) fprintf(stderr, "INFO " msg "\n", ##__VA_ARGS__)
#define LOG_WARN(msg, ...) fprintf(stderr, "WARN " msg "\n", ##__VA_ARGS__)

CUresult fake_cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count);
CUresult fake_cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type);
CUresult fake_cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params);
CUresult fake_cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *child);
CUresult fake_cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node, char *log, size_t size);
CUresult fake_cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult fake_cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params);
CUresult fake_cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult fake_cuGraphExecDestroy(CUgraphExec exec);
#endif
