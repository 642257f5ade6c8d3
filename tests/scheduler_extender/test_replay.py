"""The replay engine makes exactly the decisions a node-by-node run of the extender's verbs makes.

The engine groups nodes into classes of equal state and caches verdicts per demand shape; these
tests hold it to a naive reference that calls score_nodes / to_extender_scores / top_nodes / place
on every node for every pod, plus the protocol details: ties to the smallest rank, dropped pods,
max pods per node, and cache invalidation when a learning policy changes its revision.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

import vgpu.scheduling.fragmentation  # noqa: F401  (registers the policy)
from vgpu.catalog import builtin
from vgpu.scheduling.model import Demand, GpuState, NodeState, Snapshot
from vgpu.scheduling.placement import place
from vgpu.scheduling.policy import REGISTRY, Policy
from vgpu.scheduling.replay import Cluster, Replay, ReplayConfig, Selection, replay
from vgpu.scheduling.scoring import score_nodes, to_extender_scores, top_nodes

CATALOG = builtin()
MIB = 1024 * 1024


def gpu(node: str, i: int, used: int = 0, model: str = "G2") -> GpuState:
    return GpuState(
        uuid=f"{node}-{i}",
        index=i,
        model=model,
        tflops=1000,
        vram=1000 * MIB,
        tflops_used=used,
        vram_used=used * MIB,
        pods=1 if used else 0,
    )


def node(name: str, used: list[int], cpu: int = 32_000) -> NodeState:
    return NodeState(
        name=name, pool="p", gpus=tuple(gpu(name, i, u) for i, u in enumerate(used)), cpu_free=cpu, memory_free=1 << 40
    )


def demand(key: str, milli: int, count: int = 1, cpu: int = 1000) -> Demand:
    whole = milli >= 1000
    share = 1000 if whole else milli
    return Demand(
        pod_key=key,
        gpu_count=count if milli else 0,
        tflops=share,
        vram=share * MIB,
        tflops_limit=share,
        vram_limit=share * MIB,
        whole_gpu=whole,
        cpu=cpu,
    )


def _commit(n: NodeState, d: Demand, gpus: tuple[GpuState, ...]) -> NodeState:
    chosen = {g.uuid for g in gpus}
    new = []
    for g in n.gpus:
        if g.uuid in chosen:
            if d.whole_gpu:
                g = replace(g, tflops_used=g.tflops, vram_used=g.vram, pods=g.pods + 1, whole=True)
            else:
                g = replace(g, tflops_used=g.tflops_used + d.tflops, vram_used=g.vram_used + d.vram, pods=g.pods + 1)
        new.append(g)
    assert n.cpu_free is not None and n.memory_free is not None
    return replace(n, gpus=tuple(new), cpu_free=n.cpu_free - d.cpu, memory_free=n.memory_free - d.memory)


def naive(nodes: list[NodeState], demands: list[Demand], policy: Policy, ranks: list[int], config: ReplayConfig):
    """kube-scheduler + extender, one node at a time: the reference the engine must match."""
    state = {n.name: n for n in nodes}
    rank = {n.name: r for n, r in zip(nodes, ranks, strict=True)}
    out = []
    for d in demands:
        raw = score_nodes(d, Snapshot(nodes=state), list(state), policy, CATALOG)
        if not raw:
            out.append((None, ()))
            continue
        if config.selection is Selection.RAW:
            totals: dict[str, float] = raw
        else:
            kept = top_nodes(raw, config.keep) if config.keep else tuple(raw)
            totals = {k: v * config.weight * 10 for k, v in to_extender_scores({k: raw[k] for k in kept}).items()}
        best = max(totals.values())
        name = min((rank[k], k) for k, v in totals.items() if v == best)[1]
        placement = place(d, state[name], policy, CATALOG)
        assert placement is not None
        before = state[name]
        state[name] = _commit(before, d, placement.gpus)
        policy.observe(d, before, placement.gpus)
        out.append((name, tuple(g.index for g in placement.gpus)))
    return out


def random_case(seed: int) -> tuple[list[NodeState], list[Demand], list[int]]:
    rng = random.Random(seed)
    nodes = [
        node(f"n{i:02d}", [0] * rng.choice([1, 2, 4, 8]), cpu=rng.choice([8000, 32_000, 96_000])) for i in range(14)
    ]
    sizes = [1000, 1000, 810, 470, 320, 650, 230, 0]
    demands = []
    for i in range(160):
        milli = rng.choice(sizes)
        count = rng.choice([1, 1, 1, 2, 4]) if milli == 1000 else 1
        demands.append(demand(f"ns/p{i}", milli, count, cpu=rng.choice([1000, 4000, 12_000])))
    ranks = list(range(len(nodes)))
    rng.shuffle(ranks)
    return nodes, demands, ranks


CONFIGS = [
    ReplayConfig(selection=Selection.EXTENDER),
    ReplayConfig(selection=Selection.RAW),
    ReplayConfig(selection=Selection.EXTENDER, keep=3),
    ReplayConfig(selection=Selection.EXTENDER, keep=1),
]


@pytest.mark.parametrize("policy", ["binpack", "spread", "fragmentation"])
@pytest.mark.parametrize("config", CONFIGS, ids=["extender", "raw", "keep3", "keep1"])
@pytest.mark.parametrize("seed", [1, 2])
def test_engine_matches_the_node_by_node_reference(policy: str, config: ReplayConfig, seed: int) -> None:
    nodes, demands, ranks = random_case(seed)
    expected = naive(nodes, demands, REGISTRY.create(policy), ranks, config)
    got = [
        (o.node, o.gpus) for o in replay(nodes, demands, REGISTRY.create(policy), CATALOG, ranks=ranks, config=config)
    ]
    assert got == expected
    assert any(n is None for n, _ in got) and any(n is not None for n, _ in got)  # both paths exercised


def test_ties_go_to_the_smallest_rank() -> None:
    nodes = [node("a", [0]), node("b", [0]), node("c", [0])]
    out = list(replay(nodes, [demand("ns/p", 500)], REGISTRY.create("binpack"), CATALOG, ranks=[2, 0, 1]))
    assert out[0].node == "b"


def test_a_pod_that_fits_nowhere_is_dropped_and_the_next_one_still_runs() -> None:
    nodes = [node("a", [0, 0])]
    out = list(
        replay(nodes, [demand("ns/big", 1000, 4), demand("ns/ok", 1000, 2)], REGISTRY.create("binpack"), CATALOG)
    )
    assert [o.node for o in out] == [None, "a"]
    assert out[1].gpus == (0, 1)


def test_max_pods_per_node_counts_cpu_only_pods_too() -> None:
    nodes = [node("a", [0]), node("b", [0])]
    pods = [demand("ns/cpu", 0), demand("ns/gpu", 300)]
    out = list(replay(nodes, pods, REGISTRY.create("binpack"), CATALOG, config=ReplayConfig(max_pods=1)))
    assert [o.node for o in out] == ["a", "b"]


def test_match_fields_affinity_is_refused() -> None:
    d = replace(
        demand("ns/p", 300),
        node_affinity={
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}]
            }
        },
    )
    with pytest.raises(ValueError, match="matchFields"):
        list(replay([node("a", [0])], [d], REGISTRY.create("binpack"), CATALOG))


class Flipping:
    """Prefers the node with the most free CPU until it has seen a pod, then the least; says so via ``revision``."""

    def __init__(self) -> None:
        self.revision = 0

    @property
    def name(self) -> str:
        return "flipping"

    def score(self, demand: Demand, node: NodeState) -> float:
        cpu = (node.cpu_free or 0) / 100_000
        return cpu if self.revision == 0 else 1.0 - cpu

    def choose_gpus(self, demand: Demand, node: NodeState) -> tuple[GpuState, ...]:
        return tuple(g for g in node.gpus if g.tflops_used == 0)[: demand.gpu_count]

    def observe(self, demand: Demand, node: NodeState, gpus: tuple[GpuState, ...]) -> None:
        self.revision += 1


def test_a_new_revision_drops_cached_scores() -> None:
    nodes = [node("a", [0, 0], cpu=64_000), node("b", [0, 0], cpu=8_000), node("c", [0, 0], cpu=16_000)]
    engine = Replay(Cluster(nodes), Flipping(), CATALOG, ReplayConfig(selection=Selection.RAW))
    assert engine.submit(demand("ns/1", 300)).node == "a"
    assert engine.submit(demand("ns/2", 300)).node == "b"  # stale cached scores would say "a" again
