"""Which policies a benchmark run compares, and one (trace, seed) task that runs all of them.

The compared policies, all replayed by :mod:`vgpu.scheduling.replay` on the same pod
sequence and node ranks:

- ``bestfit`` and ``fgd``: the paper's baselines with the paper's integer scores, highest score
  wins (:attr:`Selection.RAW`), as they ran as in-tree plugins in the paper's simulator;
- ``ours``: our default policy through the extender path exactly as shipped — filter, raw scores,
  ``to_extender_scores`` (0–10) × weight × 10, equal totals to the node rank;
- ``ours-raw``: the same policy picked by its float score (what 0–10 costs, if anything);
- ``ours-top1``: the extender path with the filter keeping only the best node (``top_nodes``).

A task also computes the GPU-bin floor of its pod sequence at arrived = 100 % and 130 %, and
each run reports its wall time per submitted pod (the replay judges node classes, so this is not
the extender's per-request cost: ``latency.py`` measures that).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.placement.baselines import FGD, BestFit, typical_shapes
from benchmarks.placement.floor import arrived_prefix, floor_unallocated
from benchmarks.placement.pinned import label, pin
from benchmarks.placement.protocol import Curve, curve, prepare
from benchmarks.placement.traces import (
    MILLI,
    NODE_FILE,
    TraceNode,
    TracePod,
    pod_file,
    read_nodes,
    read_pods,
    to_demand,
    to_node_state,
)
from vgpu.catalog import builtin
from vgpu.scheduling.fragmentation import FragmentationPolicy
from vgpu.scheduling.policy import Policy
from vgpu.scheduling.replay import ReplayConfig, Selection, replay

EXTENDER = ReplayConfig(selection=Selection.EXTENDER)
RAW = ReplayConfig(selection=Selection.RAW)
TOP1 = ReplayConfig(selection=Selection.EXTENDER, keep=1)

ALL_POLICIES = ("bestfit", "fgd", "ours", "ours-raw", "ours-top1")
DEFAULT_POLICIES = ("bestfit", "fgd", "ours", "ours-raw")


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


def policy_factory(name: str, pods: Sequence[TracePod]) -> tuple[Callable[[], Policy], ReplayConfig]:
    if name == "bestfit":
        return BestFit, RAW
    if name == "fgd":
        shapes = typical_shapes(pods)
        return (lambda: FGD(shapes)), RAW
    if name == "ours":
        return FragmentationPolicy, EXTENDER
    if name == "ours-raw":
        return FragmentationPolicy, RAW
    if name == "ours-top1":
        return FragmentationPolicy, TOP1
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(ALL_POLICIES)}")


@dataclass(frozen=True, slots=True)
class TaskResult:
    trace: str
    seed: int
    runs: tuple[RunResult, ...]
    floor100: float
    floor130: float


def run_task(
    traces: Path, trace: str, seed: int, policies: Sequence[str], pinning: tuple[float, int, float] | None = None
) -> TaskResult:
    """Every policy on one (trace, seed), plus the floor of that pod sequence.

    ``pinning`` (share, seed, skew) replays the model-pinned variant of the trace (:mod:`.pinned`) instead.
    """
    nodes = read_nodes(traces / NODE_FILE)
    pods = read_pods(pod_file(traces, trace))
    if pinning is not None:
        pods = pin(pods, nodes, *pinning)
        trace = label(trace, *pinning)
    gpus = sum(n.gpus for n in nodes)
    runs = []
    for name in policies:
        factory, config = policy_factory(name, pods)
        runs.append(run_one(name, factory, config, trace, nodes, pods, seed))
    work = prepare(pods, len(nodes), gpus * MILLI, seed)
    f100 = floor_unallocated(arrived_prefix(work.pods, gpus * MILLI, 100.0), gpus)
    f130 = floor_unallocated(arrived_prefix(work.pods, gpus * MILLI, 130.0), gpus)
    return TaskResult(trace, seed, tuple(runs), f100, f130)
