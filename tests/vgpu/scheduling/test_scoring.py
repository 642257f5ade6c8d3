"""Raw scores with the additive terms, the 0–10 mapping kube-scheduler accepts, and top-N selection."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.vgpu.scheduling.builders import CATALOG, T4, make_demand, make_node, make_snapshot
from vgpu.names import Annotation as A
from vgpu.request import PodView, resolve
from vgpu.scheduling.demand import demand_from_request
from vgpu.scheduling.model import workload_key
from vgpu.scheduling.policy import Binpack, Spread
from vgpu.scheduling.scoring import ScoreTerms, best_scored, score_nodes, to_extender_scores, top_nodes


def test_only_nodes_that_fit_now_are_scored() -> None:
    snapshot = make_snapshot(make_node("ok"), make_node("full", vram_used="80Gi"), make_node("t4", model=T4))
    raw = score_nodes(make_demand(model="A100"), snapshot, ["ok", "full", "t4", "ghost"], Binpack(), CATALOG)
    assert set(raw) == {"ok"}


def test_local_gpu_affinity_prefers_the_workloads_nodes_over_any_packing() -> None:
    snapshot = make_snapshot(
        make_node("busy", vram_used="70Gi"), make_node("home"), workload_nodes={"train": frozenset({"home"})}
    )
    names = ["busy", "home"]
    local = make_demand(workload="train", is_local_gpu=True)
    raw = score_nodes(local, snapshot, names, Binpack(), CATALOG)
    assert max(raw, key=lambda n: raw[n]) == "home"
    remote = make_demand(workload="train", is_local_gpu=False)
    raw = score_nodes(remote, snapshot, names, Binpack(), CATALOG)
    assert max(raw, key=lambda n: raw[n]) == "busy"
    raw = score_nodes(local, snapshot, names, Binpack(), CATALOG, ScoreTerms(locality=0.0))
    assert max(raw, key=lambda n: raw[n]) == "busy"


def test_local_gpu_affinity_is_only_to_the_same_workload_in_the_same_namespace() -> None:
    """team-b's "train" is another workload than team-a's: it is not drawn to team-a's nodes."""
    snapshot = make_snapshot(
        make_node("busy", vram_used="70Gi"),
        make_node("home"),
        workload_nodes={workload_key("team-a", "train"): frozenset({"home"})},
    )
    annotations = {A.WORKLOAD: "train", A.IS_LOCAL_GPU: "true", A.VRAM_REQUEST: "4Gi"}
    req = resolve(PodView(name="p", annotations=annotations, containers=("main",)))

    def best(pod_key: str) -> str:
        raw = score_nodes(demand_from_request(req, pod_key=pod_key), snapshot, ["busy", "home"], Binpack(), CATALOG)
        return max(raw, key=lambda n: raw[n])

    assert best("team-a/p") == "home"
    assert best("team-b/p") == "busy"  # binpack's own choice: no affinity across namespaces


def test_smaller_model_preference_picks_the_smallest_gpu_that_fits() -> None:
    snapshot = make_snapshot(make_node("a100"), make_node("t4", model=T4, tflops="65", vram="16Gi"))
    demand = make_demand(tflops="5", vram="2Gi")
    plain = score_nodes(demand, snapshot, ["a100", "t4"], Spread(), CATALOG)
    assert max(plain, key=lambda n: plain[n]) == "a100"  # spread alone likes the roomier A100
    raw = score_nodes(demand, snapshot, ["a100", "t4"], Spread(), CATALOG, ScoreTerms(smaller_model=1.0))
    assert max(raw, key=lambda n: raw[n]) == "t4"
    assert raw["a100"] == pytest.approx(plain["a100"])


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, {}),
        ({"a": 0.3}, {"a": 10}),
        ({"a": 0.5, "b": 0.5}, {"a": 10, "b": 10}),
        ({"a": 0.0, "b": 1.0}, {"a": 0, "b": 10}),
        ({"a": 0.40, "b": 0.45, "c": 0.50}, {"a": 0, "b": 5, "c": 10}),
        ({"a": 1.0, "b": 1.24, "c": 1.26, "d": 2.0}, {"a": 0, "b": 2, "c": 3, "d": 10}),
        ({"a": -3.0, "b": 7.0}, {"a": 0, "b": 10}),
    ],
)
def test_to_extender_scores_stretches_min_max_onto_0_to_10(raw: dict[str, float], expected: dict[str, int]) -> None:
    assert to_extender_scores(raw) == expected


def test_extender_scores_keep_the_order_of_raw_scores() -> None:
    raw = {f"n{i}": (i * 37 % 101) / 101 for i in range(50)}
    scores = to_extender_scores(raw)
    assert all(0 <= s <= 10 for s in scores.values())
    for a in raw:
        for b in raw:
            if raw[a] < raw[b]:
                assert scores[a] <= scores[b]


def test_top_nodes_keeps_the_best_with_full_resolution() -> None:
    raw = {"a": 0.501, "b": 0.502, "c": 0.1, "d": 0.502}
    assert top_nodes(raw, 2) == ("b", "d")
    assert top_nodes(raw, 10) == ("b", "d", "a", "c")
    assert top_nodes(raw, 0) == ()


@given(
    st.dictionaries(
        st.sampled_from([f"node-{i}" for i in range(12)]),
        st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, 1.5]) | st.floats(0, 2, allow_nan=False),
        max_size=12,
    ),
    st.integers(0, 14),
)
def test_top_nodes_is_the_best_by_score_then_name_for_every_keep(raw: dict[str, float], keep: int) -> None:
    # keep=1 (prioritize, every call) takes a linear path; the definition is the full sort.
    assert top_nodes(raw, keep) == tuple(sorted(raw, key=lambda name: (-raw[name], name))[: max(keep, 0)])


@given(
    st.dictionaries(
        st.sampled_from([f"node-{i}" for i in range(12)]),
        st.sampled_from([0.0, 0.9, 0.95, 0.949999, 1.0, 1e-12]) | st.floats(-1e6, 1e6, allow_nan=False),
        max_size=12,
    ),
    st.permutations([f"node-{i}" for i in range(14)]),
)
def test_best_scored_are_the_nodes_the_0_to_10_mapping_gives_10_in_the_given_order(
    raw: dict[str, float], order: list[str]
) -> None:
    scores = to_extender_scores(raw)
    assert best_scored(raw, order) == [name for name in order if scores.get(name) == 10]
