"""Node states: nodes alike in everything but their identity are judged and scored once per decision.

``NodeState.state()`` lets the filter check one node per fitting state and a state-scored policy score
one node per state (a cold decision at 5,000 nodes). The sharing must never change an answer: every
verdict, reason and score is the one the node would get judged alone, whatever the names, labels,
UUIDs, node affinity and policy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vgpu.scheduling.builders import (
    CATALOG,
    T4,
    expr,
    make_demand,
    make_gpu,
    make_node,
    make_snapshot,
    required,
)
from vgpu.scheduling.filter import filter_nodes
from vgpu.scheduling.fragmentation import FragmentationPolicy
from vgpu.scheduling.model import NodeState
from vgpu.scheduling.policy import Binpack, Policy, Spread, scores_by_state
from vgpu.scheduling.scoring import score_nodes

# A few GPU states, so that drawn nodes often share a whole state while their identities differ.
GPU_STATES = [
    {},
    {"vram_used": "76Gi", "tflops_used": "100", "pods": 2},
    {"vram_used": "40Gi", "tflops_used": "300", "pods": 1},
    {"whole": True, "pods": 1, "vram_used": "80Gi", "tflops_used": "312"},
    {"healthy": False},
    {"model": T4, "tflops": "65", "vram": "16Gi"},
    {"slots_used": 4, "pods": 4, "vram_used": "8Gi", "tflops_used": "40"},
]


@st.composite
def nodes(draw: st.DrawFn) -> list[NodeState]:
    shapes = draw(st.lists(st.lists(st.sampled_from(range(len(GPU_STATES))), min_size=1, max_size=3), min_size=1))
    built = []
    for i in range(draw(st.integers(1, 12))):
        name = f"n{i}"
        gpus = [
            make_gpu(f"GPU-{name}-{g}", index=g, **GPU_STATES[s])  # type: ignore[arg-type]
            for g, s in enumerate(draw(st.sampled_from(shapes)))
        ]
        zone = draw(st.sampled_from(["a", "b"]))
        built.append(make_node(name, gpus=gpus, labels={"kubernetes.io/hostname": name, "zone": zone}))
    return built


demands = st.builds(
    make_demand,
    tflops=st.sampled_from(["10", "150", "300"]),
    vram=st.sampled_from(["4Gi", "30Gi", "60Gi"]),
    count=st.integers(1, 2),
    model=st.sampled_from([None, "A100", "T4"]),
    whole_gpu=st.booleans(),
    node_affinity=st.sampled_from([None, required([expr("zone", "In", "a")])]),
)


@given(nodes(), demands)
@settings(max_examples=300)
def test_every_node_gets_the_verdict_and_reason_it_gets_alone(offered: list[NodeState], demand: Any) -> None:
    snapshot = make_snapshot(*offered)
    together = filter_nodes(demand, snapshot, [n.name for n in offered], CATALOG)
    for node in offered:
        alone = filter_nodes(demand, make_snapshot(node), [node.name], CATALOG)
        assert (node.name in together.passed) == (alone.passed == (node.name,))
        assert together.reasons().get(node.name) == alone.reasons().get(node.name)


@pytest.mark.parametrize("policy", [Binpack(), Spread()], ids=lambda p: p.name)
@given(offered=nodes(), demand=demands)
@settings(max_examples=150)
def test_every_node_gets_the_score_it_gets_alone(policy: Policy, offered: list[NodeState], demand: Any) -> None:
    snapshot = make_snapshot(*offered)
    together = score_nodes(demand, snapshot, [n.name for n in offered], policy, CATALOG)
    for node in offered:
        assert together.get(node.name) == score_nodes(demand, make_snapshot(node), [node.name], policy, CATALOG).get(
            node.name
        )


def test_a_state_is_everything_but_the_identity() -> None:
    node = make_node("a", gpus=[make_gpu("GPU-a", vram_used="8Gi", pods=1)], labels={"zone": "a"})
    twin = make_node("b", gpus=[make_gpu("GPU-b", vram_used="8Gi", pods=1)], labels={"zone": "b"})
    assert node.state() == twin.state()
    gpu = node.gpus[0]
    for changed in (
        replace(node, pool="other"),
        replace(node, cpu_free=1000),
        replace(node, memory_free=1),
        replace(node, slots_used=1),
        replace(node, inventory_error="corrupt"),
        replace(node, gpus=(replace(gpu, vram_used=gpu.vram_used + 1),)),
        replace(node, gpus=(replace(gpu, tflops_used=1),)),
        replace(node, gpus=(replace(gpu, pods=2),)),
        replace(node, gpus=(replace(gpu, whole=True),)),
        replace(node, gpus=(replace(gpu, healthy=False),)),
        replace(node, gpus=(replace(gpu, slots_used=1),)),
        replace(node, gpus=(replace(gpu, numa=1),)),
        replace(node, gpus=(replace(gpu, model=T4),)),
        replace(node, gpus=(gpu, gpu)),
    ):
        assert changed.state() != node.state(), changed


def test_a_fitting_state_is_checked_once_and_a_rejected_one_node_by_node(checks: list[str]) -> None:
    free = [make_node(f"free{i}", gpus=[make_gpu(f"GPU-free{i}")]) for i in range(50)]
    full = [make_node(f"full{i}", gpus=[make_gpu(f"GPU-full{i}", vram_used="80Gi", pods=1)]) for i in range(50)]
    names = [n.name for pair in zip(free, full, strict=True) for n in pair]
    result = filter_nodes(make_demand(), make_snapshot(*free, *full), names, CATALOG)
    assert result.passed == tuple(n.name for n in free)
    assert checks.count("free0") == 1 and not any(c.startswith("free") and c != "free0" for c in checks)
    assert sorted(c for c in checks if c.startswith("full")) == sorted(n.name for n in full)
    assert all(f"GPU-{name}" in result.failed[name].message for name in result.failed)  # its own GPU, not the first's
    checks.clear()
    zone = make_demand(node_affinity=required([expr("zone", "DoesNotExist")]))
    filter_nodes(zone, make_snapshot(*free), [n.name for n in free], CATALOG)
    assert len(checks) == len(free)  # with node affinity, each node on its own


def test_only_policies_that_say_so_score_by_state() -> None:
    assert scores_by_state(Binpack()) and scores_by_state(Spread())
    assert not scores_by_state(FragmentationPolicy())  # it reads labels and remembers nodes by name
