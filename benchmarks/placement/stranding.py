"""``python -m benchmarks.placement.stranding``: where the idle GPUs are when a policy loses capacity.

The table says *how much* is unallocated at arrived = 100 %; this says *where* and *whose* — the
experiment behind the pinned-demand finding in ``README.md``. For one (trace, pin share, seed) it
replays each policy up to arrived = 100 % (``--arrived 1.3``: 130 %, overload) and reports, per GPU
model: the GPUs, the share of them idle, and the GPU demand dropped so far split into pods pinned to the
model and unconstrained pods (whole-node ones apart), and the cores CPU-only pods got on the model's
nodes (CPU they take there is CPU the model's idle GPUs can no longer be fed with). For ``ours`` it
also reports how much of the pinned demand the learned mix still sees.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.placement import traces as openb
from benchmarks.placement.pinned import pin
from benchmarks.placement.protocol import prepare
from benchmarks.placement.suite import MAX_PODS, policy_factory
from vgpu.catalog import builtin
from vgpu.scheduling.fragmentation import FragmentationPolicy
from vgpu.scheduling.fragmentation import idle as idle_of
from vgpu.scheduling.replay import Cluster, Replay, ReplayConfig

WHOLE_NODE = 8 * openb.MILLI  # an unconstrained pod asking this much needs an empty 8-GPU node


@dataclass(frozen=True, slots=True)
class ModelRow:
    model: str
    gpus: int
    idle_pct: float  # of the model's GPUs, at arrived = 100 %
    dropped_pinned: float  # GPUs of demand pinned to (a set containing) this model that found no room
    dropped_free: float  # GPUs of unconstrained demand dropped (reported on the row "any")
    cpu_only_cores: float = 0.0  # cores placed CPU-only pods hold on the model's nodes


def stranding(
    traces: Path,
    trace: str,
    share: float,
    pin_seed: int,
    seed: int,
    policy: str,
    skew: float = 1.0,
    upto: float = 1.0,
) -> tuple[list[ModelRow], float]:
    """Per-model idle share and dropped demand at arrived = ``upto`` (1.0: 100 %), and the pinned share of
    the mix seen. Unconstrained demand dropped is also shown for whole-node pods alone (``any, 8-GPU``)."""
    nodes = openb.read_nodes(traces / openb.NODE_FILE)
    pods = pin(openb.read_pods(openb.pod_file(traces, trace)), nodes, share, pin_seed, skew)
    capacity = sum(n.gpus for n in nodes) * openb.MILLI
    work = prepare(pods, len(nodes), capacity, seed)
    factory, config = policy_factory(policy, pods)
    engine = Replay(
        Cluster([openb.to_node_state(n) for n in nodes], work.ranks, MAX_PODS),
        factory(),
        builtin(),
        ReplayConfig(selection=config.selection, keep=config.keep, max_pods=MAX_PODS),
    )
    dropped: dict[str, float] = defaultdict(float)
    cpu_only: dict[str, float] = defaultdict(float)
    model_of = {n.name: n.gpus[0].model if n.gpus else "-" for n in engine.cluster.nodes}
    arrived = 0
    for i, pod in enumerate(work.pods):
        if arrived + pod.gpu_request > capacity * upto:
            break
        arrived += pod.gpu_request
        node = engine.submit(openb.to_demand(pod, f"openb/{pod.name}-{i}")).node
        if node is not None and not pod.gpu_request:
            cpu_only[model_of[node]] += pod.cpu / 1000
        if node is None:
            for m in pod.gpu_spec or ("any",):
                dropped[m] += pod.gpu_request / openb.MILLI / max(1, len(pod.gpu_spec))
            if not pod.gpu_spec and pod.gpu_request >= WHOLE_NODE:
                dropped["any, 8-GPU"] += pod.gpu_request / openb.MILLI
    gpus: dict[str, int] = defaultdict(int)
    idle: dict[str, float] = defaultdict(float)
    for n in engine.cluster.nodes:
        model = n.gpus[0].model if n.gpus else "-"
        gpus[model] += len(n.gpus)
        idle[model] += sum(idle_of(g) for g in n.gpus)
    rows = [
        ModelRow(m, gpus[m], 100.0 * idle[m] / gpus[m], dropped.get(m, 0.0), 0.0, cpu_only.get(m, 0.0))
        for m in sorted(gpus, key=lambda m: gpus[m])
    ]
    rows.append(
        ModelRow(
            "any",
            sum(gpus.values()),
            100.0 * sum(idle.values()) / sum(gpus.values()),
            0.0,
            dropped["any"],
            sum(cpu_only.values()),
        )
    )
    rows.append(ModelRow("any, 8-GPU", 0, 0.0, 0.0, dropped["any, 8-GPU"]))
    seen = 0.0
    if isinstance(engine.policy, FragmentationPolicy):
        seen = engine.policy.pinned_share()
    return rows, seen


def render(policy: str, rows: Sequence[ModelRow], seen: float) -> str:
    lines = [
        f"### {policy}"
        + (f" (pinned share of the learned mix: {100 * seen:.1f} %)" if policy.startswith("ours") else ""),
        "",
        "| model | GPUs | idle % | dropped pinned GPUs | dropped unconstrained GPUs | CPU-only pods' cores |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.model} | {r.gpus} | {r.idle_pct:.1f} | {r.dropped_pinned:.1f} | {r.dropped_free:.1f}"
        f" | {r.cpu_only_cores:.0f} |"
        for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.placement.stranding", description=__doc__)
    parser.add_argument("--traces", type=Path, default=openb.DEFAULT_TRACES)
    parser.add_argument("--trace", default="default")
    parser.add_argument("--pin-share", type=float, default=0.33)
    parser.add_argument("--pin-seed", type=int, default=7)
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument("--policies", default="fgd,ours")
    parser.add_argument("--pin-skew", type=float, default=1.0, help="as in python -m benchmarks.placement")
    parser.add_argument("--arrived", type=float, default=1.0, help="replay up to this share of capacity (1.3: 130 %%)")
    args = parser.parse_args(argv)
    print(
        f"{args.trace}, pin share {args.pin_share}, pin seed {args.pin_seed}, pin skew {args.pin_skew:g},"
        f" seed {args.seed}, arrived = {100 * args.arrived:g} %\n"
    )
    for name in args.policies.split(","):
        rows, seen = stranding(
            args.traces, args.trace, args.pin_share, args.pin_seed, args.seed, name, args.pin_skew, args.arrived
        )
        print(render(name, rows, seen) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
