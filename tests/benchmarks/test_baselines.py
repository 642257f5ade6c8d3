"""BestFit and FGD decisions on hand-made nodes, checked against the paper's formulas by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.placement.baselines import FGD, BestFit, TypicalShape, typical_shapes
from benchmarks.placement.traces import TraceNode, TracePod, to_demand, to_node_state
from vgpu.scheduling.model import NodeState


def node(name: str, used: list[int], cpu: int = 64_000, model: str = "G2") -> NodeState:
    """A trace node whose GPU i has ``used[i]`` milli taken."""
    n = to_node_state(TraceNode(name, cpu, 262_144, len(used), model))
    gpus = tuple(
        replace(g, tflops_used=u, vram_used=u * 1024 * 1024, pods=1 if u else 0)
        for g, u in zip(n.gpus, used, strict=True)
    )
    return replace(n, gpus=gpus)


def demand(milli: int, count: int = 1, cpu: int = 4000) -> object:
    return to_demand(TracePod("p", cpu, 1024, count, milli), "ns/p")


def test_bestfit_score_is_the_papers_formula_truncated() -> None:
    d = to_demand(TracePod("p", 8000, 1024, 1, 500), "ns/p")
    n = node("a", [0, 0], cpu=64_000)
    # 1 − ½·(64000−8000)/128000 − ½·(2000−500)/8000 = 0.68750 → 68
    assert BestFit().score(d, n) == 68.0


def test_bestfit_prefers_the_node_left_fullest_and_the_fullest_fitting_gpu() -> None:
    d = to_demand(TracePod("p", 1000, 1024, 1, 300), "ns/p")
    emptier, fuller = node("a", [0, 0]), node("b", [600, 0])
    assert BestFit().score(d, fuller) > BestFit().score(d, emptier)
    (gpu,) = BestFit().choose_gpus(d, node("c", [0, 650, 600, 900]))
    assert gpu.index == 1  # free 350 ≥ 300 and the least free; GPU 3 (free 100) does not fit


def test_typical_shapes_cover_95_percent_and_renormalise() -> None:
    pods = [TracePod(f"a{i}", 1000, 1, 1, 500) for i in range(90)]
    pods += [TracePod(f"b{i}", 2000, 1, 1, 1000) for i in range(8)]
    pods += [TracePod(f"c{i}", 3000, 1, 0, 0) for i in range(2)]
    shapes = typical_shapes(pods)
    assert [(s.milli, s.count) for s in shapes] == [(500, 1), (1000, 1)]
    assert sum(s.p for s in shapes) == pytest.approx(1.0)
    assert shapes[0].p == pytest.approx(90 / 98)


def test_fgd_moves_a_pod_where_it_removes_fragmentation() -> None:
    fgd = FGD([TypicalShape(cpu=1000, milli=600, count=1, spec=(), p=1.0)])
    d = to_demand(TracePod("p", 1000, 1024, 1, 400), "ns/p")
    stranded, fresh = node("a", [500]), node("b", [0])
    # on "a" the 500 free milli cannot host a 600 shape (fragment); taking 400 of it leaves 100:
    # F 500 → 100, score = int(100·σ(0.4)) = 59. On "b" nothing is fragmented before or after: 50.
    assert fgd.score(d, stranded) == 59.0
    assert fgd.score(d, fresh) == 50.0


def test_fgd_counts_all_idle_gpu_for_shapes_the_node_cannot_host() -> None:
    fgd = FGD([TypicalShape(cpu=1000, milli=1000, count=2, spec=(), p=1.0)])
    assert fgd.frag("G2", 64_000, (1000, 300)) == 1300.0  # only one idle GPU: the 2-GPU shape can't run
    assert fgd.frag("G2", 64_000, (1000, 1000, 300)) == 300.0  # it can run; the 300 GPU is a fragment
    assert fgd.frag("G2", 500, (1000, 1000)) == 2000.0  # not enough CPU
    spec = FGD([TypicalShape(cpu=1000, milli=500, count=1, spec=("T4",), p=1.0)])
    assert spec.frag("G2", 64_000, (1000,)) == 1000.0  # wrong model


def test_fgd_picks_the_first_gpu_with_the_best_integer_score() -> None:
    fgd = FGD([TypicalShape(cpu=1000, milli=600, count=1, spec=(), p=1.0)])
    d = to_demand(TracePod("p", 1000, 1024, 1, 400), "ns/p")
    (gpu,) = fgd.choose_gpus(d, node("a", [0, 500, 500]))
    assert gpu.index == 1  # GPUs 1 and 2 tie; the first wins, as in the simulator


def test_whole_gpu_pods_take_the_first_idle_gpus() -> None:
    d = to_demand(TracePod("p", 1000, 1024, 2, 1000), "ns/p")
    n = node("a", [300, 0, 0, 0])
    assert [g.index for g in FGD([]).choose_gpus(d, n)] == [1, 2]
    assert [g.index for g in BestFit().choose_gpus(d, n)] == [1, 2]
