"""The isolation benchmark's command line: its flags, the budget planned (and refused where it cannot hold
the runs: exit status 2, as for any bad flag), the plan printed, then the run (a SIGTERM ends it as an
error would: what it changed on the GPU is put back). ``scripts/isolation-bench``
runs this from the repository root."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

import benchmarks.isolation as package
from benchmarks.gpu_check.flags import gpu_parser
from benchmarks.isolation.plan import (
    EMULATED_ORDER,
    ISSUE_SCENARIOS,
    ORDER,
    SCENARIOS,
    SINGLE_S,
    BudgetError,
    plan,
    render_plan,
)
from benchmarks.isolation.run import run_all
from device_plugin.hami_build.changes import CHANGES, in_order
from vgpu.names import IsolationMode


def modes(text: str) -> tuple[IsolationMode, ...]:
    """``shared,soft``: the modes named (at least one, each a known one)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in set(IsolationMode)]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown mode {', '.join(unknown)}" if unknown else "no mode named")
    return tuple(IsolationMode(n) for n in names)


def scenarios(text: str) -> tuple[str, ...]:
    """``pair,memory``: the scenarios named (at least one, each a known one), in the order they run."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(SCENARIOS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown scenario {', '.join(unknown)}" if unknown else "no scenario named")
    return tuple(s for s in SCENARIOS if s in names)


def parser() -> argparse.ArgumentParser:
    made = gpu_parser("isolation-bench", package.__doc__, "isolation-out", "isolation.json, isolation.md and runs.log")
    made.add_argument("--budget", type=float, default=480.0, help="seconds for everything, builds included")
    made.add_argument(
        "--modes",
        type=modes,
        help=f"comma-separated, of {','.join(ORDER)} (default all; with --emulated, {','.join(EMULATED_ORDER)})",
    )
    made.add_argument(
        "--scenarios",
        type=scenarios,
        default=ISSUE_SCENARIOS,
        help=f"comma-separated, of {','.join(SCENARIOS)} (default the issue's five: {','.join(ISSUE_SCENARIOS)})",
    )
    made.add_argument(
        "--hami-change",
        dest="hami_changes",
        action="append",
        choices=CHANGES,
        default=[],
        help="a change soft's HAMi-core is built with (repeatable; none: stock): device_plugin/hami_build",
    )
    made.add_argument(
        "--single-s",
        type=float,
        default=SINGLE_S,
        help=f"seconds of each capped single-tenant run (default {SINGLE_S:g}; longer shows a limiter settle)",
    )
    made.add_argument(
        "--emulated",
        action="store_true",
        help="no GPU: HAMi-core's own code on an emulated GPU (benchmarks/isolation/emulated); the model's figures",
    )
    made.add_argument("--dry-run", action="store_true", help="print the plan and stop; touches no GPU")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.budget <= 0:
        cli.error(f"--budget must be a positive number of seconds, not {args.budget:g}")
    if args.single_s < SINGLE_S:
        cli.error(f"--single-s must be at least {SINGLE_S:g} s (the first second is warm-up), not {args.single_s:g}")
    asked = args.modes or (EMULATED_ORDER if args.emulated else ORDER)
    if args.emulated and (beyond := [m for m in asked if m not in EMULATED_ORDER]):
        cli.error(
            f"--emulated runs {','.join(EMULATED_ORDER)}; {','.join(beyond)} needs a real GPU "
            "(hard: NVIDIA's MPS daemon; partitioned: MIG)"
        )
    if args.hami_changes and IsolationMode.SOFT not in asked:
        cli.error(f"--hami-change changes soft's HAMi-core, and --modes {','.join(asked)} has no soft")
    try:
        made = plan(args.budget, asked, args.scenarios, args.single_s)
    except BudgetError as exc:
        cli.error(str(exc))
    if args.single_s != SINGLE_S and not any(s.scenario == "single" and s.targets for s in made.steps):
        cli.error(
            "--single-s lengthens capped single-tenant runs, and this plan has none (they run in soft and hard, "
            "with --scenarios single or tampering)"
        )
    print(render_plan(made))
    if args.dry_run:
        return 0
    # A timeout's SIGTERM unwinds like an error, so that the MPS daemon is quit and the compute mode restored.
    before = signal.signal(signal.SIGTERM, terminated)
    try:
        changes = in_order(args.hami_changes)
        return run_all(
            args.out, args.hami_src.resolve(), args.budget, asked, changes, args.scenarios, args.single_s, args.emulated
        )
    finally:
        signal.signal(signal.SIGTERM, before)


def terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
