"""A compute-percent demand is the same share of every GPU: filter, score, placement and preemption read it so."""

from __future__ import annotations

from tests.vgpu.scheduling.builders import CATALOG, T4, make_demand, make_gpu, make_node, make_snapshot
from vgpu.contract.allocation import GpuGrant
from vgpu.names import Qos
from vgpu.scheduling.compute_share import on_node
from vgpu.scheduling.filter import filter_nodes
from vgpu.scheduling.fragmentation import FragmentationPolicy
from vgpu.scheduling.ledger import Ledger
from vgpu.scheduling.placement import place
from vgpu.scheduling.policy import Binpack
from vgpu.scheduling.preempt import Candidate, Victim, plan
from vgpu.scheduling.reasons import ReasonCode
from vgpu.scheduling.scoring import score_nodes

HALF = 50_000  # thousandths of a percent
# Charged at admission as half of the largest GPU in the pool (an A100): 156 TFLOPS, more than a T4 has.
CHARGED = "156"


def test_half_is_half_of_each_gpu_in_the_grant() -> None:
    demand = make_demand(tflops=CHARGED, vram="4Gi", percent=HALF)
    a100 = place(demand, make_node("a100"), Binpack(), CATALOG)
    t4 = place(demand, make_node("t4", model=T4, tflops="65", vram="16Gi"), Binpack(), CATALOG)
    assert a100 is not None and t4 is not None
    assert [(g.tflops_request, g.tflops_limit, g.gpu_tflops) for g in a100.grants] == [(156_000, 156_000, 312_000)]
    assert [(g.tflops_request, g.tflops_limit, g.gpu_tflops) for g in t4.grants] == [(32_500, 32_500, 65_000)]
    assert (a100.demand.tflops, t4.demand.tflops) == (156_000, 32_500)  # what the policy is taught


def test_a_share_rounds_up_never_short() -> None:
    demand = make_demand(percent=33_333)  # 33.333 % of 65 TFLOPS is 21.666445
    assert on_node(demand, make_node(model=T4, tflops="65", vram="16Gi")).tflops == 21_667


def test_the_filter_fits_the_share_of_each_node_not_the_charge() -> None:
    demand = make_demand(tflops=CHARGED, percent=HALF)
    nodes = (
        make_node("a100-free"),
        make_node("a100-busy", tflops_used="200"),  # 112 free of 312: less than half
        make_node("t4-free", model=T4, tflops="65", vram="16Gi"),  # 65 < the 156 charged, but half of it is free
        make_node("t4-busy", model=T4, tflops="65", vram="16Gi", tflops_used="40"),  # 25 free < 32.5
    )
    result = filter_nodes(demand, make_snapshot(*nodes), [n.name for n in nodes], CATALOG)
    assert result.passed == ("a100-free", "t4-free")
    reasons = result.reasons()
    assert reasons["a100-busy"].code is ReasonCode.INSUFFICIENT_TFLOPS and reasons["a100-busy"].requested == 156_000
    assert reasons["t4-busy"].code is ReasonCode.INSUFFICIENT_TFLOPS and reasons["t4-busy"].requested == 32_500


def test_gpus_of_two_sizes_take_a_percent_only_when_the_model_picks_one() -> None:
    mixed = make_node(gpus=[make_gpu("GPU-a", index=0), make_gpu("GPU-t", index=1, model=T4, tflops="65", vram="16Gi")])
    snapshot = make_snapshot(mixed)
    unpinned = filter_nodes(make_demand(percent=HALF), snapshot, ["n1"], CATALOG)
    assert unpinned.unresolvable["n1"].code is ReasonCode.GPU_SIZES_DIFFER
    pinned = make_demand(percent=HALF, model="T4")
    assert filter_nodes(pinned, snapshot, ["n1"], CATALOG).passed == ("n1",)
    placed = place(pinned, mixed, Binpack(), CATALOG)
    assert placed is not None and [(g.uuid, g.tflops_request) for g in placed.grants] == [("GPU-t", 32_500)]
    # the same node takes a TFLOPS demand as before
    assert filter_nodes(make_demand(), snapshot, ["n1"], CATALOG).passed == ("n1",)


def test_scores_compare_the_share_each_node_would_hold() -> None:
    # Binpack prefers the fuller node after placing: a 50 % pod fills the half-used T4 and leaves the
    # quarter-used A100 at 75 %. Read as its 156-TFLOPS charge it would not fit the T4 at all.
    demand = make_demand(tflops=CHARGED, vram="1Gi", percent=HALF)
    a100 = make_node("a100", tflops_used="78")
    t4 = make_node("t4", model=T4, tflops="65", vram="16Gi", tflops_used="32.5")
    scores = score_nodes(demand, make_snapshot(a100, t4), ["a100", "t4"], Binpack(), CATALOG)
    assert set(scores) == {"a100", "t4"} and scores["t4"] > scores["a100"]
    fragmentation = score_nodes(demand, make_snapshot(a100, t4), ["a100", "t4"], FragmentationPolicy(), CATALOG)
    assert set(fragmentation) == {"a100", "t4"}


def test_preemption_frees_the_share_on_that_node() -> None:
    # A T4 with 60 of its 65 TFLOPS held by a low pod: a critical 50 % pod needs 32.5 there, not its 156 charge.
    empty = make_node("t4", model=T4, tflops="65", vram="16Gi")
    grant = GpuGrant(
        uuid="GPU-t4-0", index=0, tflops_request=60_000, tflops_limit=60_000, vram_request=0, vram_limit=0,
        gpu_tflops=65_000,
    )  # fmt: skip
    low = Victim(pod_key="other/low", qos=Qos.LOW, grants=(grant,))
    node = Ledger().reserve(low.pod_key, empty, low.grants, None, qos=low.qos, slots=low.slots).apply_node(empty)
    demand = make_demand(tflops=CHARGED, vram="1Gi", percent=HALF, qos=Qos.CRITICAL)
    chosen = plan(demand, [Candidate(node=node, victims=(low,))], Binpack(), CATALOG)
    assert chosen is not None and chosen.victims == ("other/low",)
    assert [g.tflops_request for g in chosen.grants] == [32_500]
