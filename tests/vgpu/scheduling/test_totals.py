"""NodeState.totals(): the per-state GPU sums scoring reads stay equal to summing the GPUs again.

The sums are cached on the (immutable) state the first time they are read, so these tests check the
cached value against a fresh recomputation across every way a state is derived — ledger
transitions, ``dataclasses.replace`` of GPUs, health and model changes — and that the shortcuts
built on them (``eligible_node``, ``utilisation_after``) decide exactly as the GPU loop does.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vgpu.scheduling.builders import A100, CATALOG, T4, make_demand, make_gpu, make_node
from vgpu.contract.allocation import GpuGrant
from vgpu.names import IsolationMode
from vgpu.scheduling.fit import ModelMatcher, _explain_any, _explain_one, eligible_node
from vgpu.scheduling.ledger import Ledger, LedgerRefusal
from vgpu.scheduling.model import GpuState, NodeState, NodeTotals
from vgpu.scheduling.policy import TFLOPS_WEIGHT, VRAM_WEIGHT, utilisation_after


def recomputed(node: NodeState) -> NodeTotals:
    """The definition, spelled differently from the product (sorts instead of max, lists instead of sets)."""
    gpus = node.gpus
    healthy = [g for g in gpus if g.healthy]
    shared = [g for g in healthy if not g.whole]
    sizes = sorted({(g.tflops, g.vram) for g in healthy})
    return NodeTotals(
        tflops=sum(g.tflops for g in gpus),
        vram=sum(g.vram for g in gpus),
        tflops_used=sum(g.tflops_used for g in gpus),
        vram_used=sum(g.vram_used for g in gpus),
        all_healthy=all(g.healthy for g in gpus),
        models=tuple(dict.fromkeys(g.model for g in gpus)),
        healthy=tuple(healthy),
        shared=tuple(shared),
        most_vram_free=sorted(shared, key=lambda g: g.vram_free, reverse=True)[0] if shared else None,
        most_tflops_free=sorted(shared, key=lambda g: g.tflops_free, reverse=True)[0] if shared else None,
        uniform=sizes[0] if len(sizes) == 1 else None,
        slots=sum(g.slots for g in healthy),
        isolation=frozenset(m for m in IsolationMode if all(m in g.isolation for g in gpus)),
    )


def loop_eligible(node: NodeState, match: ModelMatcher, mode: IsolationMode | None) -> tuple[GpuState, ...]:
    return tuple(g for g in node.gpus if g.healthy and match(g.model) and (mode is None or mode in g.isolation))


def loop_utilisation(tflops: int, vram: int, count: int, node: NodeState) -> float:
    cap_t = sum(g.tflops for g in node.gpus)
    cap_v = sum(g.vram for g in node.gpus)
    used_t = sum(g.tflops_used for g in node.gpus)
    used_v = sum(g.vram_used for g in node.gpus)
    v = (used_v + vram * count) / cap_v if cap_v else 1.0
    t = (used_t + tflops * count) / cap_t if cap_t else 1.0
    return min(1.0, max(0.0, VRAM_WEIGHT * v + TFLOPS_WEIGHT * t))


MODES = (tuple(IsolationMode), (IsolationMode.SHARED, IsolationMode.SOFT), (IsolationMode.HARD,))
gpu = st.builds(
    lambda i, model, healthy, t_used, v_used, whole, small, modes: make_gpu(
        f"GPU-{i}",
        index=i,
        model=model,
        healthy=healthy,
        tflops_used=f"{t_used}",
        vram_used=f"{v_used}Gi",
        whole=whole,
        vram="40Gi" if small else "80Gi",
        isolation=modes,
    ),
    st.integers(0, 7),
    st.sampled_from([A100, A100, T4, "Unknown GPU"]),
    st.booleans(),
    st.integers(0, 312),
    st.integers(0, 40),
    st.booleans(),
    st.booleans(),
    st.sampled_from(MODES + MODES[:1]),
)
nodes = st.lists(gpu, max_size=6, unique_by=lambda g: g.uuid).map(lambda gs: make_node("n", gpus=gs))


@given(nodes, st.lists(st.tuples(st.integers(0, 5), st.integers(0, 20), st.integers(0, 8)), max_size=8))
@settings(max_examples=200)
def test_totals_equal_the_sums_after_any_ledger_transition(node: NodeState, grants: list[tuple[int, int, int]]) -> None:
    assert node.totals() == recomputed(node)
    assert node.totals() is node.totals()  # computed once per state
    ledger = Ledger()
    for k, (which, tflops, vram) in enumerate(grants):
        if not node.gpus:
            break
        g = node.gpus[which % len(node.gpus)]
        grant = GpuGrant(
            uuid=g.uuid,
            index=g.index,
            tflops_request=tflops * 1000,
            tflops_limit=tflops * 1000,
            vram_request=vram * 2**30,
            vram_limit=vram * 2**30,
            gpu_tflops=g.tflops,
        )
        with contextlib.suppress(LedgerRefusal):
            ledger = ledger.reserve(f"ns/p{k}", node, (grant,), None)
        if k % 3 == 2:
            ledger = ledger.release(f"ns/p{k - 1}")
        view = ledger.apply_node(node)
        node.totals()  # the base's cache must not leak into derived states
        assert view.totals() == recomputed(view)


@given(
    nodes,
    st.sampled_from([None, "A100", "T4"]),
    st.integers(0, 20),
    st.integers(0, 16),
    st.integers(1, 3),
    st.sampled_from([None, None, *IsolationMode]),
)
@settings(max_examples=300)
def test_eligible_view_and_utilisation_match_the_gpu_loop(
    node: NodeState, model: str | None, tflops: int, vram: int, count: int, mode: IsolationMode | None
) -> None:
    demand = make_demand(tflops=f"{tflops}", vram=f"{vram}Gi", count=count, model=model, isolation=mode)
    match = ModelMatcher(CATALOG, model)
    view = eligible_node(demand, node, match)
    assert view.gpus == loop_eligible(node, match, mode)
    if view.gpus == node.gpus:
        assert view is node
    assert view.totals() == recomputed(view)
    assert utilisation_after(demand, view) == loop_utilisation(demand.tflops, demand.vram, count, view)


def test_replace_starts_a_fresh_cache() -> None:
    node = make_node("n", n_gpus=2, vram_used="10Gi")
    before = node.totals()
    sicker = replace(node, gpus=(replace(node.gpus[0], healthy=False, vram_used=0), node.gpus[1]))
    assert sicker.totals() == recomputed(sicker) != before
    assert sicker.totals().all_healthy is False
    assert node == replace(node)  # the cache takes no part in equality


# Nodes of one model and GPU size (what the quick rejection path handles), with random usage, health
# and whole-GPU holds; ties in free room are common, so the GPU a message names is tested too.
homogeneous = st.lists(
    st.tuples(st.booleans(), st.sampled_from([0, 100, 200, 312]), st.sampled_from([0, 40, 79, 80]), st.booleans()),
    min_size=1,
    max_size=8,
).map(
    lambda specs: make_node(
        "n",
        gpus=[
            make_gpu(f"GPU-{i}", index=i, healthy=h, tflops_used=f"{t}", vram_used=f"{v}Gi", whole=w)
            for i, (h, t, v, w) in enumerate(specs)
        ],
    )
)


@given(
    st.one_of(nodes, homogeneous),
    st.sampled_from([None, "A100", "T4"]),
    st.integers(0, 320),
    st.integers(0, 90),
    st.integers(1, 2),
)
@settings(max_examples=800)
def test_the_quick_rejection_reason_is_the_full_one(
    node: NodeState, model: str | None, tflops: int, vram: int, count: int
) -> None:
    demand = make_demand(tflops=f"{tflops}", vram=f"{vram}Gi", count=count, model=model)
    match = ModelMatcher(CATALOG, model)
    quick = _explain_one(demand, node, match)
    if quick is not None:
        assert quick == _explain_any(demand, node, match)
