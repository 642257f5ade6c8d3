"""The isolation benchmark on a machine without a GPU (``--emulated``): HAMi-core's own code, built as the
plugin image builds it, limiting tenants on an emulated GPU.

Only what HAMi-core does is real here: its hooks, its region, its utilisation watcher and the changes made
to it (device_plugin/hami_build). The GPU is a model (``fake_gpu.c``, linked as ``libcuda.so.1`` and
``libnvidia-ml.so.1``): one kernel at a time in launch order across processes, each as long as an H200 took
for that load, and NVML's per-process utilisation as the busy share of the window asked. The tenants are
``tenant_load.cu``'s host code, compiled with g++ against ``cuda_runtime.h``. So a change to HAMi-core is run,
end to end and in every scenario the benchmark has, before a GPU session measures it; a figure from here is
the model's, never a GPU's, and the report says so. Modes: shared and soft (hard needs MPS, partitioned MIG).
"""
