"""The GPU check's command line: its flags, and the sections run in order (environment, probe, sampling,
HAMi-core), the report written whatever happened. ``scripts/gpu-check`` runs this from the repository root."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import benchmarks.gpu_check as package
from benchmarks.gpu_check.constants import WORK
from benchmarks.gpu_check.environment import environment
from benchmarks.gpu_check.flags import gpu_parser
from benchmarks.gpu_check.hami_limits import hami
from benchmarks.gpu_check.probe_check import probe_check
from benchmarks.gpu_check.procs import set_budget
from benchmarks.gpu_check.report import exit_status, write_report
from benchmarks.gpu_check.sampling import sampling


def parser() -> argparse.ArgumentParser:
    made = gpu_parser("gpu-check", package.__doc__, "gpu-check-out", "report.md, report.json and the raw logs")
    made.add_argument("--skip-hami", action="store_true", help="leave out the HAMi-core limits section")
    made.add_argument("--budget", type=float, default=3600.0, help="seconds: every wait ends by then")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    set_budget(args.budget)
    args.out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    try:
        environment(args.out)
        probe_check(args.out)
        sampling()
        if not args.skip_hami:
            hami(args.out, args.hami_src.resolve())
    finally:
        write_report(args.out)
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
