"""GpuRequest → Demand: every field the core decides on is carried over, per GPU."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vgpu.names import Annotation as A
from vgpu.names import PlacementPolicy, Qos
from vgpu.quantity import parse_bytes
from vgpu.request import PodView, resolve
from vgpu.scheduling.demand import decision_key, demand_from_request
from vgpu.scheduling.fragmentation import shape_of
from vgpu.scheduling.model import workload_key


def test_a_resolved_pod_request_becomes_the_demand_the_core_decides_on() -> None:
    affinity: dict[str, Any] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    req = resolve(
        PodView(
            name="p",
            annotations={
                A.TFLOPS_REQUEST: "10",
                A.TFLOPS_LIMIT: "20",
                A.VRAM_REQUEST: "4Gi",
                A.VRAM_LIMIT: "8Gi",
                A.GPU_COUNT: "2",
                A.GPU_MODEL: "A100",
                A.QOS: "high",
                A.GPUPOOL: "gold",
                A.WORKLOAD: "train",
                A.IS_LOCAL_GPU: "true",
                A.PLACEMENT_POLICY: "spread",
            },
            containers=("main",),
        )
    )
    req = replace(req, node_affinity=affinity)  # profiles carry nodeAffinity; annotations cannot
    d = demand_from_request(req, pod_key="ns/p", cpu=500, memory=parse_bytes("1Gi"))
    assert (d.pod_key, d.gpu_count, d.tflops, d.tflops_limit) == ("ns/p", 2, 10_000, 20_000)
    assert (d.vram, d.vram_limit) == (parse_bytes("4Gi"), parse_bytes("8Gi"))
    assert (d.qos, d.pool, d.gpu_model, d.workload) == (Qos.HIGH, "gold", "A100", "ns/train")
    assert (d.is_local_gpu, d.policy, d.node_affinity) == (True, PlacementPolicy.SPREAD, affinity)
    assert (d.whole_gpu, d.cpu, d.memory) == (False, 500, parse_bytes("1Gi"))


def test_a_dedicated_request_is_a_whole_gpu_demand() -> None:
    req = resolve(PodView(name="p", annotations={A.DEDICATED_GPU: "true", A.GPU_COUNT: "2"}, containers=("main",)))
    d = demand_from_request(req, pod_key="ns/p")
    assert (d.whole_gpu, d.gpu_count, d.tflops, d.vram, d.tflops_limit, d.vram_limit) == (True, 2, 0, 0, 0, 0)


def test_defaults_are_fractional_with_no_cpu_or_memory() -> None:
    req = resolve(PodView(name="p", annotations={A.VRAM_REQUEST: "1Gi"}, containers=("main",)))
    d = demand_from_request(req, pod_key="ns/p")
    assert (d.whole_gpu, d.cpu, d.memory, d.policy, d.gpu_count) == (False, 0, 0, None, 1)
    assert d.pool == req.pool


def test_the_workload_is_keyed_by_the_pods_namespace() -> None:
    """Workload names are per namespace: the same name in two namespaces is two workloads."""
    req = resolve(PodView(name="p", annotations={A.WORKLOAD: "train", A.VRAM_REQUEST: "1Gi"}, containers=("main",)))
    assert demand_from_request(req, pod_key="team-a/p").workload == workload_key("team-a", "train") == "team-a/train"
    assert demand_from_request(req, pod_key="team-b/p").workload == "team-b/train"
    assert demand_from_request(replace(req, workload=None), pod_key="team-a/p").workload is None


def test_the_vram_a_demand_holds_is_its_limit_and_its_decision_key_carries_it() -> None:
    """A VRAM limit is held on the GPU like the request (vgpu/scheduling/README.md, "VRAM: the limit is held"):
    two pods asking the same request with different limits fit different GPUs, so they never share a
    remembered verdict, and the fragmentation policy learns the room each takes."""
    req = resolve(PodView(name="p", annotations={A.VRAM_REQUEST: "4Gi", A.VRAM_LIMIT: "8Gi"}, containers=("main",)))
    d = demand_from_request(req, pod_key="ns/p")
    assert d.vram_held == parse_bytes("8Gi") and replace(d, vram_limit=0).vram_held == parse_bytes("4Gi")
    assert decision_key(d) != decision_key(replace(d, vram_limit=d.vram))
    assert decision_key(d) == decision_key(replace(d, pod_key="ns/q", tflops_limit=99_000))
    assert shape_of(d).vram == parse_bytes("8Gi")
