"""The one-line summary: counts per reason, largest group first, the most useful figure per group; and the
reason it leads with, which /metrics counts unschedulable pods by."""

from __future__ import annotations

from tests.vgpu.scheduling.builders import CATALOG, T4, make_demand, make_gpu, make_node, make_snapshot
from vgpu.scheduling.filter import FilterResult, filter_nodes
from vgpu.scheduling.model import Demand, NodeState
from vgpu.scheduling.reasons import ReasonCode
from vgpu.scheduling.summary import leading_reason, summarize


def line(demand: Demand, *nodes: NodeState, extra: tuple[str, ...] = ()) -> str:
    names = [n.name for n in nodes] + list(extra)
    return summarize(demand, filter_nodes(demand, make_snapshot(*nodes), names, CATALOG))


def test_groups_by_reason_with_counts_and_the_best_figure() -> None:
    full = [make_node(f"a{i}", vram_used=f"{78 - i}Gi") for i in range(3)]  # free 2Gi, 3Gi, 4Gi
    full.append(make_node("a3", vram_used="79Gi"))
    t4s = [make_node(f"t{i}", model=T4, tflops="65", vram="16Gi") for i in range(5)]
    got = line(make_demand(vram="5Gi", model="A100"), *full, *t4s)
    assert got == (
        "0/9 nodes: 5 GPU model T4 not in [A100], "
        "4 insufficient VRAM (need 5Gi per GPU, most free 4Gi on A100-SXM4-80GB)"
    )


def test_spec_example_shape() -> None:
    a100 = [make_node(f"a{i}", vram_used="78Gi") for i in range(5)]
    t4s = [make_node(f"t{i}", model=T4, tflops="65", vram="16Gi") for i in range(7)]
    got = line(make_demand(vram="4Gi", model="A100"), *a100, *t4s)
    assert got == (
        "0/12 nodes: 7 GPU model T4 not in [A100], 5 insufficient VRAM (need 4Gi per GPU, most free 2Gi on A100-SXM4-80GB)"
    )


def test_passing_nodes_are_counted_and_a_full_pass_says_so() -> None:
    ok, busy = make_node("ok"), make_node("busy", tflops_used="310")
    assert line(make_demand(), ok, busy) == (
        "1/2 nodes: 1 insufficient TFLOPS (need 10 per GPU, most free 2 on A100-SXM4-80GB)"
    )
    assert line(make_demand(), ok) == "1/1 nodes fit"


def test_ties_in_size_follow_reason_order_and_pools_are_listed() -> None:
    got = line(
        make_demand(pool="gold", count=2),
        make_node("p1", pool="silver"),
        make_node("p2", pool="bronze"),
        make_node("g1", pool="gold", gpus=[make_gpu("GPU-x")]),
        make_node("g2", pool="gold", gpus=[]),
        extra=("ghost",),
    )
    assert got == (
        "0/5 nodes: 2 in GPU pool bronze, silver not gold, 1 unknown to the GPU extender, 1 without GPUs, "
        "1 with fewer than 2 healthy GPUs (most 1)"
    )


def test_whole_gpu_and_multi_gpu_groups_name_the_count() -> None:
    busy = make_node("w", n_gpus=2, vram_used="1Gi")
    assert line(make_demand(whole_gpu=True), busy) == "0/1 nodes: 1 with fewer than 1 idle GPUs (most 0)"


def test_the_leading_reason_is_the_one_the_summary_names_first() -> None:
    a100 = [make_node(f"a{i}", vram_used="78Gi") for i in range(2)]
    t4s = [make_node(f"t{i}", model=T4, tflops="65", vram="16Gi") for i in range(3)]
    demand = make_demand(vram="4Gi", model="A100")

    def result(*nodes: NodeState) -> FilterResult:
        return filter_nodes(demand, make_snapshot(*nodes), [n.name for n in nodes], CATALOG)

    assert leading_reason(result(*a100, *t4s)) == ReasonCode.GPU_MODEL  # 3 T4s against 2 full A100s
    tie = result(a100[0], t4s[0])  # one each: ReasonCode's order decides, as in the summary
    assert leading_reason(tie) == ReasonCode.GPU_MODEL and summarize(demand, tie).startswith("0/2 nodes: 1 GPU model")
    assert leading_reason(result(make_node("ok"))) is None
