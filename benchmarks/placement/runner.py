"""Run one (policy, trace, seed) through the core's replay engine and bin the result.

The replay is :func:`scheduler_extender.core.replay.replay` — the extender's filter, scores and
GPU choice — fed with the protocol's pod sequence and node ranks. A run also reports its
per-decision cost (wall time per submitted pod), since the same code must fit the extender's budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchmarks.placement.protocol import Curve, curve, prepare
from benchmarks.placement.traces import MILLI, TraceNode, TracePod, to_demand, to_node_state
from scheduler_extender.core.policy import Policy
from scheduler_extender.core.replay import ReplayConfig, replay
from vgpu.catalog import builtin

MAX_PODS = 1001  # the protocol's "< 1001 pods" per node


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    trace: str
    seed: int
    curve: Curve
    seconds: float
    pods: int


def run_one(
    label: str,
    make_policy: Callable[[], Policy],
    config: ReplayConfig,
    trace: str,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    seed: int,
) -> RunResult:
    capacity = sum(n.gpus for n in nodes) * MILLI
    work = prepare(pods, len(nodes), capacity, seed)
    states = [to_node_state(n) for n in nodes]
    demands = [to_demand(p, f"openb/{p.name}-{i}") for i, p in enumerate(work.pods)]
    cfg = ReplayConfig(selection=config.selection, keep=config.keep, weight=config.weight, max_pods=MAX_PODS)
    start = time.perf_counter()
    placed = [
        o.node is not None for o in replay(states, demands, make_policy(), builtin(), ranks=work.ranks, config=cfg)
    ]
    seconds = time.perf_counter() - start
    result = curve((p.gpu_request for p in work.pods), placed, capacity)
    return RunResult(label, trace, seed, result, seconds, len(demands))
