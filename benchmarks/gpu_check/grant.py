"""A synthetic grant: the allocation the extender would record for a one-container pod on one GPU, so that
the GPU benchmarks give their programs exactly the environment :func:`device_plugin.enforcement.envs.build`
derives from a real one (gpu_check's HAMi-core runs, benchmarks.isolation's tenants)."""

from __future__ import annotations

from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.names import Qos


def one_gpu_allocation(uuid: str, gpu_tflops: int, tflops_limit: int, vram_limit: int, *, node: str) -> PodAllocation:
    """A pod granted ``tflops_limit`` (milli-TFLOPS, request = limit) and ``vram_limit`` bytes of the GPU
    ``uuid`` whose catalog capacity is ``gpu_tflops``."""
    grant = GpuGrant(
        uuid=uuid,
        index=0,
        tflops_request=tflops_limit,
        tflops_limit=tflops_limit,
        vram_request=vram_limit,
        vram_limit=vram_limit,
        gpu_tflops=gpu_tflops,
    )
    return PodAllocation(
        pod_uid="00000000-0000-0000-0000-00000000c0de",
        node=node,
        pool="default",
        qos=Qos.MEDIUM,
        containers=("main",),
        gpus=(grant,),
        bound_at="2026-01-01T00:00:00Z",
    )
