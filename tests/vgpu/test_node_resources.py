"""The node totals a GPU node advertises and the shares a pod requests, as extended resources."""

from __future__ import annotations

import dataclasses

from vgpu.contract.inventory import GpuInfo, Health, NodeInventory
from vgpu.names import RESOURCE_MILLI_TFLOPS, RESOURCE_VRAM, EnforcementBackend, Qos
from vgpu.node_resources import node_capacity, pod_requests
from vgpu.request import GpuRequest

GI = 1024**3


def gpu(i: int, **kw: object) -> GpuInfo:
    return dataclasses.replace(GpuInfo(uuid=f"GPU-{i}", index=i, model="A100", tflops=312_000, vram=80 * GI), **kw)  # type: ignore[arg-type]


def test_a_node_advertises_the_sum_of_its_schedulable_gpus_only() -> None:
    inv = NodeInventory(
        node="n", pool="p", slices_per_gpu=16, backend=EnforcementBackend.HAMI_CORE, heartbeat="t",
        gpus=(gpu(0), gpu(1, health=Health.UNHEALTHY), gpu(2, mig=True), gpu(3, tflops=121_000, vram=24 * GI)),
    )  # fmt: skip
    assert node_capacity(inv) == {RESOURCE_MILLI_TFLOPS: str(433_000), RESOURCE_VRAM: str(104 * GI)}


def test_a_pod_requests_its_per_gpu_share_times_its_gpu_count_exactly() -> None:
    req = GpuRequest(
        pool="p", containers=("main",), gpu_count=3, tflops_request=2_500, tflops_limit=5_000,
        vram_request=GI + 1, vram_limit=2 * GI, qos=Qos.LOW,
    )  # fmt: skip
    assert pod_requests(req) == {RESOURCE_MILLI_TFLOPS: "7500", RESOURCE_VRAM: str(3 * GI + 3)}
