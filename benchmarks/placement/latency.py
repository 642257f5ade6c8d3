"""Per-decision cost of the extender's scoring with a policy: one /prioritize over 1,000 nodes.

The replay judges node *classes*, so its per-pod time understates what the live extender pays,
where :func:`score_nodes` walks every offered node. Here we drive the openb cluster with the
default trace to a realistic fill (arrived ≈ 80 %, the mix learned), then time ``score_nodes``
over 1,000 real nodes for each of the next pods, committing each pod so node states move as they
would live (the policy's memo stays warm between calls, as in the extender process).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.placement.protocol import prepare
from benchmarks.placement.suite import EXTENDER, MAX_PODS
from benchmarks.placement.traces import MILLI, NODE_FILE, pod_file, read_nodes, read_pods, to_demand, to_node_state
from scheduler_extender.core.model import Snapshot
from scheduler_extender.core.policy import REGISTRY
from scheduler_extender.core.replay import Cluster, Replay, ReplayConfig
from scheduler_extender.core.scoring import score_nodes
from vgpu.catalog import builtin


@dataclass(frozen=True, slots=True)
class Latency:
    policy: str
    nodes: int
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def measure(traces: Path, policy: str, *, nodes: int = 1000, samples: int = 300, fill: float = 0.8) -> Latency:
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
    times: list[float] = []
    for demand in demands[i : i + samples]:
        snapshot = Snapshot(nodes={n.name: n for n in engine.cluster.nodes[:nodes]})
        names = list(snapshot.nodes)
        start = time.perf_counter()
        score_nodes(demand, snapshot, names, engine.policy, catalog)
        times.append(1000.0 * (time.perf_counter() - start))
        engine.submit(demand)
    return Latency(policy, nodes, len(times), statistics.median(times), _p99(times), max(times))


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def render(rows: Sequence[Latency]) -> str:
    lines = ["| policy | nodes | decisions | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r.policy} | {r.nodes} | {r.samples} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.max_ms:.2f} |" for r in rows
    ]
    return "\n".join(lines)
