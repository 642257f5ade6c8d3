"""Placement: the policy's GPU choice turned into the grants the allocation contract records."""

from __future__ import annotations

from dataclasses import replace

from tests.vgpu.scheduling.builders import CATALOG, T4, make_demand, make_gpu, make_node
from vgpu.contract.allocation import GpuGrant
from vgpu.names import IsolationMode
from vgpu.quantity import parse_bytes
from vgpu.scheduling.model import Demand, GpuState, NodeState
from vgpu.scheduling.placement import grants_for, place
from vgpu.scheduling.policy import Binpack


def test_fractional_grants_carry_the_per_gpu_request_and_limit() -> None:
    node = make_node(n_gpus=2, vram_used="10Gi")
    demand = replace(make_demand(tflops="10", vram="4Gi", count=2), tflops_limit=20_000, vram_limit=parse_bytes("8Gi"))
    placement = place(demand, node, Binpack(), CATALOG)
    assert placement is not None
    assert (placement.pod_key, placement.node, placement.whole) == ("default/p", "n1", False)
    assert placement.grants == tuple(
        GpuGrant(
            uuid=f"GPU-n1-{i}",
            index=i,
            tflops_request=10_000,
            tflops_limit=20_000,
            vram_request=parse_bytes("4Gi"),
            vram_limit=parse_bytes("8Gi"),
            gpu_tflops=312_000,
        )
        for i in range(2)
    )


def test_whole_gpu_grants_reserve_the_full_capacity() -> None:
    node = make_node(gpus=[make_gpu("GPU-busy", vram_used="1Gi"), make_gpu("GPU-idle", index=1)])
    placement = place(make_demand(whole_gpu=True), node, Binpack(), CATALOG)
    assert placement is not None and placement.whole
    (grant,) = placement.grants
    assert (grant.uuid, grant.tflops_request, grant.vram_request) == ("GPU-idle", 312_000, parse_bytes("80Gi"))
    assert grants_for(make_demand(whole_gpu=True), placement.gpus) == placement.grants


def test_place_refuses_a_node_the_pod_no_longer_fits() -> None:
    assert place(make_demand(), make_node(vram_used="79Gi"), Binpack(), CATALOG) is None
    assert place(make_demand(pool="gold"), make_node(pool="silver"), Binpack(), CATALOG) is None


def test_place_only_offers_the_policy_model_matching_healthy_gpus() -> None:
    node = make_node(
        gpus=[
            make_gpu("GPU-t4", model=T4, tflops="65", vram="16Gi", vram_used="12Gi"),
            make_gpu("GPU-sick", index=1, healthy=False, vram_used="70Gi"),
            make_gpu("GPU-a100", index=2),
        ]
    )
    placement = place(make_demand(model="A100"), node, Binpack(), CATALOG)
    assert placement is not None and [g.uuid for g in placement.gpus] == ["GPU-a100"]


class Rogue:
    """A broken plug-in policy returning whatever it was told to."""

    def __init__(self, pick: tuple[GpuState, ...]) -> None:
        self.pick = pick

    @property
    def name(self) -> str:
        return "rogue"

    def score(self, demand: Demand, node: NodeState) -> float:
        return 0.0

    def choose_gpus(self, demand: Demand, node: NodeState) -> tuple[GpuState, ...]:
        return self.pick

    def observe(self, demand: Demand, node: NodeState, gpus: tuple[GpuState, ...]) -> None:
        """Stateless."""


def test_place_never_trusts_a_policy_with_a_wrong_choice() -> None:
    node = make_node(gpus=[make_gpu("GPU-a"), make_gpu("GPU-b", index=1, vram_used="79Gi")])
    a, b = node.gpus
    stranger = make_gpu("GPU-elsewhere")
    two = make_demand(count=2)
    assert place(make_demand(), node, Rogue((a,)), CATALOG) is not None
    assert place(make_demand(), node, Rogue((b,)), CATALOG) is None  # does not fit on b
    assert place(make_demand(), node, Rogue((stranger,)), CATALOG) is None  # not on this node
    assert place(make_demand(), node, Rogue((a, a)), CATALOG) is None  # wrong count
    big = make_node(n_gpus=2)
    assert place(two, big, Rogue((big.gpus[0], big.gpus[0])), CATALOG) is None  # same GPU twice


def test_place_offers_only_the_gpus_that_serve_the_pods_isolation_mode() -> None:
    """A node whose GPUs serve different modes (here a GPU under MPS beside one under HAMi-core): a pod asking
    for hard isolation gets the MPS GPU even where the other one has more room; one asking for nothing gets
    either, as before."""
    hami, mps = (IsolationMode.SHARED, IsolationMode.SOFT), (IsolationMode.HARD,)
    node = make_node(
        gpus=[make_gpu("GPU-soft", vram_used="10Gi", isolation=hami), make_gpu("GPU-hard", index=1, isolation=mps)]
    )
    hard = place(make_demand(isolation=IsolationMode.HARD), node, Binpack(), CATALOG)
    assert hard is not None and [g.uuid for g in hard.gpus] == ["GPU-hard"]
    soft = place(make_demand(isolation=IsolationMode.SOFT), node, Binpack(), CATALOG)
    assert soft is not None and [g.uuid for g in soft.gpus] == ["GPU-soft"]
    assert place(make_demand(isolation=IsolationMode.PARTITIONED), node, Binpack(), CATALOG) is None
    assert place(make_demand(isolation=IsolationMode.HARD, count=2), node, Binpack(), CATALOG) is None
    anything = place(make_demand(), node, Binpack(), CATALOG)
    assert anything is not None and [g.uuid for g in anything.gpus] == ["GPU-soft"]  # binpack: the fuller one


def test_pinned_indices_are_the_gpus_granted_or_the_pod_does_not_fit() -> None:
    """gpu-indices 1: binpack would take the fuller GPU 0; the pod gets GPU 1. Pinned to a full GPU it does not
    fit, whatever room the others have; pinned to two, it gets those two."""
    node = make_node(gpus=[make_gpu("GPU-0", vram_used="40Gi"), make_gpu("GPU-1", index=1), make_gpu("GPU-2", index=2)])
    one = place(make_demand(gpu_indices=(1,)), node, Binpack(), CATALOG)
    assert one is not None and [g.uuid for g in one.gpus] == ["GPU-1"]
    full = replace(node, gpus=(node.gpus[0], replace(node.gpus[1], vram_used=parse_bytes("79Gi")), node.gpus[2]))
    assert place(make_demand(gpu_indices=(1,)), full, Binpack(), CATALOG) is None
    two = place(make_demand(gpu_indices=(2, 0), count=2), node, Binpack(), CATALOG)
    assert two is not None and sorted(g.uuid for g in two.gpus) == ["GPU-0", "GPU-2"]
