"""Per-decision cost of the extender's scoring with a policy: one /prioritize over 1,000 nodes.

The replay judges node *classes*, so its per-pod time understates what the live extender pays,
where :func:`score_nodes` walks every offered node. Here we drive the openb cluster with the
default trace to a realistic fill (arrived ≈ 80 %, the mix learned), then time ``score_nodes``
over 1,000 real nodes for each of the next pods, committing each pod so node states move as they
would live (the policy's memo stays warm between calls, as in the extender process).

:func:`bind_during_refresh` times the policy's share of /bind (``place`` + ``observe``) while the
extender's :class:`~scheduler_extender.refresh.Refresher` solves a due mix refresh of 64 pod sizes
on its thread, and the same refresh run inline, as ``observe`` did before it left the bind path.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.hardware import describe
from benchmarks.placement import traces as openb
from benchmarks.placement.protocol import prepare
from benchmarks.placement.suite import EXTENDER, MAX_PODS
from benchmarks.placement.traces import (
    DEFAULT_TRACES,
    MILLI,
    NODE_FILE,
    pod_file,
    read_nodes,
    read_pods,
    to_demand,
    to_node_state,
)
from scheduler_extender.refresh import Refresher
from vgpu.catalog import builtin
from vgpu.names import LABEL_HOSTNAME
from vgpu.scheduling.fragmentation import FragmentationPolicy, learn
from vgpu.scheduling.model import Demand, NodeState, Snapshot
from vgpu.scheduling.placement import place
from vgpu.scheduling.policy import REGISTRY
from vgpu.scheduling.replay import Cluster, Replay, ReplayConfig
from vgpu.scheduling.scoring import score_nodes


@dataclass(frozen=True, slots=True)
class Latency:
    policy: str
    nodes: int
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def _filled(traces: Path, policy: str, fill: float) -> tuple[Replay, list[Demand], int]:
    """The openb cluster after the default trace's pods up to ``fill`` of its GPUs; the pods left, from where."""
    trace_nodes = read_nodes(traces / NODE_FILE)
    pods = read_pods(pod_file(traces, "default"))
    capacity = sum(n.gpus for n in trace_nodes) * MILLI
    work = prepare(pods, len(trace_nodes), capacity, 42)
    demands = [to_demand(p, f"openb/{p.name}-{i}") for i, p in enumerate(work.pods)]
    catalog = builtin()
    engine = Replay(
        Cluster([to_node_state(n) for n in trace_nodes], work.ranks, MAX_PODS),
        REGISTRY.create(policy),
        catalog,
        ReplayConfig(selection=EXTENDER.selection, max_pods=MAX_PODS),
    )
    arrived, i = 0, 0
    while arrived < fill * capacity:
        engine.submit(demands[i])
        arrived += work.pods[i].gpu_request
        i += 1
    return engine, demands, i


def measure(traces: Path, policy: str, *, nodes: int = 1000, samples: int = 300, fill: float = 0.8) -> Latency:
    """Each node labelled with its hostname, as the extender's are (the replay's nodes are not, so that it
    can group nodes in one state); a node's labelled copy is kept while its state is unchanged, as the
    extender's cache keeps a node's object."""
    engine, demands, i = _filled(traces, policy, fill)
    catalog = engine.catalog
    times: list[float] = []
    labelled: dict[str, tuple[NodeState, NodeState]] = {}
    for demand in demands[i : i + samples]:
        snapshot = Snapshot(nodes={n.name: _hostname_labelled(n, labelled) for n in engine.cluster.nodes[:nodes]})
        names = list(snapshot.nodes)
        start = time.perf_counter()
        score_nodes(demand, snapshot, names, engine.policy, catalog)
        times.append(1000.0 * (time.perf_counter() - start))
        engine.submit(demand)
    return Latency(policy, nodes, len(times), statistics.median(times), _p99(times), max(times))


def _hostname_labelled(node: NodeState, labelled: dict[str, tuple[NodeState, NodeState]]) -> NodeState:
    known = labelled.get(node.name)
    if known is None or known[0] is not node:
        known = labelled[node.name] = (node, replace(node, labels={**node.labels, LABEL_HOSTNAME: node.name}))
    return known[1]


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def render(rows: Sequence[Latency]) -> str:
    lines = ["| policy | nodes | decisions | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r.policy} | {r.nodes} | {r.samples} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.max_ms:.2f} |" for r in rows
    ]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class BindLatency:
    sizes: int  # distinct fractional pod sizes in the refreshed mix
    refresh_s: float  # the refresh on the background thread (what a bind waited for when it ran inline)
    inline_s: float  # the same refresh run synchronously, as observe did inside bind before
    binds: int  # binds timed while the refresh ran
    p50_ms: float
    p99_ms: float
    max_ms: float


def bind_during_refresh(traces: Path, *, sizes: int = 64, fill: float = 0.8) -> BindLatency:
    """Time ``place`` + ``observe`` (the policy's part of /bind) while a 64-size refresh solves beside it."""
    engine, demands, i = _filled(traces, "fragmentation", fill)
    policy = engine.policy
    assert isinstance(policy, FragmentationPolicy)
    seconds: list[float] = []
    refresher = Refresher(on_refresh=seconds.append)
    refresher.track(policy)  # deferred from here on, as in the extender
    node = engine.cluster.nodes[0]
    gpus = node.gpus[:1]
    observed = 0
    while not policy.due or observed < sizes:  # new fractional sizes until the next refresh has 64+
        size = openb.TracePod(f"size-{observed}", 1000, 1024, 1, 5 + 15 * (observed % sizes))  # a new fractional size
        policy.observe(to_demand(size, f"bench/{size.name}"), node, gpus)
        observed += 1
    pending = policy.take()
    assert pending is not None
    start = time.perf_counter()
    learn(pending)  # inline, as observe → _refresh ran inside bind before
    inline = time.perf_counter() - start
    filler = to_demand(openb.TracePod("filler", 1000, 1024, 1, 500), "bench/filler")
    while not policy.due:  # the counts are due again: the refresher has work
        policy.observe(filler, node, gpus)
    worker = threading.Thread(target=refresher.run_once)
    times: list[float] = []
    worker.start()
    for demand in itertools.cycle(demands[i:]):
        if not worker.is_alive():
            break
        target = engine.choose(demand)
        if target is None:
            continue
        start = time.perf_counter()
        placement = place(demand, engine.cluster.nodes[target], policy, engine.catalog)
        if placement is not None:
            policy.observe(demand, engine.cluster.nodes[target], placement.gpus)
        times.append(1000.0 * (time.perf_counter() - start))
    worker.join()
    return BindLatency(sizes, seconds[0], inline, len(times), statistics.median(times), _p99(times), max(times))


def render_bind(row: BindLatency) -> str:
    return "\n".join(
        [
            "| sizes | refresh on the thread s | same refresh inline s | binds during it | p50 ms | p99 ms | max ms |",
            "|---|---|---|---|---|---|---|",
            f"| {row.sizes} | {row.refresh_s:.3f} | {row.inline_s:.3f} | {row.binds} | {row.p50_ms:.2f} "
            f"| {row.p99_ms:.2f} | {row.max_ms:.2f} |",
        ]
    )


def latency_report(traces: Path) -> str:
    """Both latency tables, as the harness and ``python -m benchmarks.placement.latency`` print them."""
    return "\n".join(
        [
            "\n## Per-decision latency: score_nodes over 1,000 nodes (openb default, arrived ≈ 80 %)\n",
            render([measure(traces, name) for name in ("binpack", "fragmentation")]),
            "\n## The policy's part of /bind while a mix refresh (cutting-stock LP) runs on the refresher\n",
            render_bind(bind_during_refresh(traces)),
        ]
    )


def main() -> int:
    """``python -m benchmarks.placement.latency``: the latency tables alone, without the replay table."""
    print(f"hardware: {describe()}")
    print(latency_report(DEFAULT_TRACES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
