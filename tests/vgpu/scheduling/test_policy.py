"""Placement policies: node ordering, GPU choice inside a node, the registry and the per-pod override."""

from __future__ import annotations

import pytest

from tests.vgpu.scheduling.builders import CATALOG, make_demand, make_gpu, make_node, make_snapshot
from vgpu.names import PlacementPolicy
from vgpu.scheduling.model import Demand, GpuState, NodeState
from vgpu.scheduling.policy import REGISTRY, Binpack, Policies, PolicyRegistry, Spread
from vgpu.scheduling.scoring import score_nodes

NODES = (
    make_node("empty", n_gpus=2),
    make_node("half", n_gpus=2, vram_used="40Gi", tflops_used="156"),
    make_node("nearly", n_gpus=2, vram_used="70Gi", tflops_used="250"),
)


def ranking(policy: Binpack | Spread, demand: Demand) -> list[str]:
    raw = score_nodes(demand, make_snapshot(*NODES), [n.name for n in NODES], policy, CATALOG)
    return sorted(raw, key=lambda n: -raw[n])


def test_binpack_prefers_the_fullest_node_that_fits_and_spread_the_emptiest() -> None:
    assert ranking(Binpack(), make_demand(vram="4Gi")) == ["nearly", "half", "empty"]
    assert ranking(Spread(), make_demand(vram="4Gi")) == ["empty", "half", "nearly"]


def test_binpack_skips_a_fuller_node_the_pod_does_not_fit() -> None:
    assert ranking(Binpack(), make_demand(vram="20Gi")) == ["half", "empty"]


def test_scores_are_fine_grained_and_within_the_unit_interval() -> None:
    small, large = (
        Binpack().score(make_demand(vram="1Gi"), NODES[1]),
        Binpack().score(make_demand(vram="2Gi"), NODES[1]),
    )
    assert 0.0 <= small < large <= 1.0
    assert Spread().score(make_demand(), NODES[1]) == pytest.approx(1.0 - Binpack().score(make_demand(), NODES[1]))


GPUS_NODE = make_node(
    "n",
    gpus=[
        make_gpu("GPU-free", index=0),
        make_gpu("GPU-tight", index=1, vram_used="74Gi", tflops_used="200"),
        make_gpu("GPU-mid", index=2, vram_used="40Gi", tflops_used="100"),
        make_gpu("GPU-full", index=3, vram_used="79Gi"),
    ],
)


def uuids(gpus: tuple[GpuState, ...]) -> list[str]:
    return [g.uuid for g in gpus]


@pytest.mark.parametrize(
    ("policy", "count", "expected"),
    [
        (Binpack(), 1, ["GPU-tight"]),
        (Binpack(), 2, ["GPU-tight", "GPU-mid"]),
        (Binpack(), 3, ["GPU-tight", "GPU-mid", "GPU-free"]),
        (Binpack(), 4, []),
        (Spread(), 1, ["GPU-free"]),
        (Spread(), 2, ["GPU-free", "GPU-mid"]),
    ],
)
def test_choose_gpus_best_fit_or_most_free_never_a_gpu_that_cannot_fit(
    policy: Binpack | Spread, count: int, expected: list[str]
) -> None:
    assert uuids(policy.choose_gpus(make_demand(vram="4Gi", count=count), GPUS_NODE)) == expected


def test_ties_between_identical_gpus_go_to_the_lowest_index() -> None:
    node = make_node(n_gpus=4)
    assert [g.index for g in Binpack().choose_gpus(make_demand(count=2), node)] == [0, 1]
    assert [g.index for g in Spread().choose_gpus(make_demand(count=2), node)] == [0, 1]


def test_whole_gpu_demands_get_idle_gpus_only() -> None:
    assert uuids(Binpack().choose_gpus(make_demand(whole_gpu=True), GPUS_NODE)) == ["GPU-free"]


def test_registry_creates_by_name_and_refuses_a_second_factory_for_a_name() -> None:
    assert {"binpack", "spread"} <= set(REGISTRY.names())
    assert isinstance(REGISTRY.create("spread"), Spread)
    registry = PolicyRegistry()
    registry.register("mine", Binpack)
    registry.register("mine", Binpack)  # the same module imported twice
    with pytest.raises(ValueError, match="already registered"):
        registry.register("mine", Spread)
    with pytest.raises(KeyError, match="known: mine"):
        registry.create("nope")


def test_policies_default_from_config_overridden_per_pod_with_one_live_instance_each() -> None:
    policies = Policies("spread")
    assert policies.for_demand(make_demand()).name == "spread"
    chosen = policies.for_demand(make_demand(policy=PlacementPolicy.BINPACK))
    assert chosen.name == "binpack"
    assert policies.for_demand(make_demand(policy=PlacementPolicy.BINPACK)) is chosen
    with pytest.raises(KeyError):
        Policies("fragmentation-typo")


class Learning:
    """A policy that counts what it observed: the protocol must let state live across calls."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    @property
    def name(self) -> str:
        return "learning"

    def score(self, demand: Demand, node: NodeState) -> float:
        return float(len(self.seen))

    def choose_gpus(self, demand: Demand, node: NodeState) -> tuple[GpuState, ...]:
        return node.gpus[: demand.gpu_count]

    def observe(self, demand: Demand, node: NodeState, gpus: tuple[GpuState, ...]) -> None:
        self.seen.append(demand.pod_key)


def test_a_registered_learning_policy_keeps_its_state_in_policies() -> None:
    registry = PolicyRegistry()
    registry.register("learning", Learning)
    policies = Policies("learning", registry)
    first = policies.for_demand(make_demand())
    first.observe(make_demand(pod_key="ns/a"), NODES[0], ())
    assert policies.get("learning").score(make_demand(), NODES[0]) == 1.0
