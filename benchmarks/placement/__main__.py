"""``python -m benchmarks.placement``: reproduce the openb comparison table in one command.

``--all`` runs every trace × seeds 42–51 × (BestFit, FGD, ours, ours-raw) plus the floor;
``--quick`` two traces × two seeds for iteration. Tasks (trace, seed) run in ``--jobs`` processes.
``--pin-share 0,0.1,0.2 --pin-seed 7`` (or ``--pinned``: every share of the family) replays
model-pinned variants of the traces instead (:mod:`benchmarks.placement.pinned`), one table row per
(trace, share, pin seed).
Prints the hardware, the trace → core mapping, the tables at arrived = 100 % and 130 %, replay
timings, the per-decision latency of /prioritize over 1,000 nodes, the policy's bind latency while
a mix refresh runs beside it, and the total runtime.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

from benchmarks.hardware import describe
from benchmarks.placement.latency import latency_report
from benchmarks.placement.pinned import SHARES
from benchmarks.placement.protocol import SEEDS
from benchmarks.placement.report import table, timings
from benchmarks.placement.suite import ALL_POLICIES, DEFAULT_POLICIES, TaskResult, run_task
from benchmarks.placement.traces import DEFAULT_TRACES, MAPPING_NOTE, NODE_FILE, TRACE_NAMES, pod_file

QUICK_TRACES = ("default", "multigpu50")
QUICK_SEEDS = (42, 43)
_SHARES = ",".join(f"{x:g}" for x in SHARES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.placement", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--all", action="store_true", help="every trace, seeds 42-51 (the full table)")
    mode.add_argument("--quick", action="store_true", help="default + multigpu50, seeds 42-43")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="folder with the openb CSVs")
    parser.add_argument("--trace", action="append", choices=TRACE_NAMES, help="only this trace (repeatable)")
    parser.add_argument("--seeds", type=_ints, help="comma-separated seeds")
    parser.add_argument("--policies", default=None, help=f"comma-separated, from {','.join(ALL_POLICIES)}")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes over (trace, seed) tasks")
    parser.add_argument("--no-latency", action="store_true", help="skip the per-decision latency measurement")
    parser.add_argument("--json", type=Path, help="also write per-run results here")
    parser.add_argument(
        "--pin-share", type=_floats, help="comma-separated shares of GPU pods pinned to a model (e.g. 0,0.1,0.33)"
    )
    parser.add_argument("--pinned", action="store_true", help=f"the pinned family: --pin-share {_SHARES}")
    parser.add_argument("--pin-seed", type=_ints, default=[7], help="comma-separated seeds of the pinned variants")
    parser.add_argument(
        "--pin-skew", type=float, default=1.0,
        help="models drawn with weight (GPUs that could host the pod) ** skew: 1 proportional, 0 uniform",
    )  # fmt: skip
    args = parser.parse_args(argv)

    if not (args.traces / NODE_FILE).is_file():
        parser.error(f"no openb node list under {args.traces} (use --traces)")
    traces = args.trace or (list(QUICK_TRACES) if args.quick else list(TRACE_NAMES))
    seeds = args.seeds or (list(QUICK_SEEDS) if args.quick else list(SEEDS))
    policies = tuple(args.policies.split(",")) if args.policies else (ALL_POLICIES if args.quick else DEFAULT_POLICIES)
    traces = [t for t in traces if pod_file(args.traces, t).is_file()]

    start = time.perf_counter()
    print(f"hardware: {describe()}")
    print(MAPPING_NOTE)
    shares = list(SHARES) if args.pinned else args.pin_share
    pinnings: list[tuple[float, int, float] | None] = (
        [(x, p, args.pin_skew) for x in shares for p in args.pin_seed] if shares else [None]
    )
    print(f"traces {traces}, seeds {seeds}, policies {list(policies)}, jobs {args.jobs}", flush=True)
    if shares:
        print(f"pinned variants: shares {shares} × pin seeds {args.pin_seed} (benchmarks/placement/pinned.py)")
    tasks = [(args.traces, t, s, policies, pinning) for t in traces for pinning in pinnings for s in seeds]
    results: list[TaskResult] = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_task, *task) for task in tasks]
        for done, future in enumerate(futures, 1):
            task = future.result()
            results.append(task)
            cells = " ".join(f"{r.policy}={r.curve.unallocated(100):.2f}" for r in task.runs)
            print(f"[{done}/{len(tasks)}] {task.trace} seed {task.seed}: {cells} floor={task.floor100:.2f}", flush=True)

    print("\n## Unallocated GPU % at arrived = 100 %\n")
    print(table(results, policies, 100))
    print("\n## Unallocated GPU % at arrived = 130 %\n")
    print(table(results, policies, 130))
    print("\n## Replay cost\n")
    print(timings(results))
    if not args.no_latency:
        print(latency_report(args.traces))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1, default=str))
    print(f"\ntotal runtime {time.perf_counter() - start:.0f} s on {describe()}")
    return 0


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


if __name__ == "__main__":
    sys.exit(main())
