"""The flags the GPU benchmarks share (benchmarks.gpu_check, benchmarks.isolation): where the report goes
and where HAMi-core's exported source is."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchmarks.gpu_check.constants import ROOT


def gpu_parser(prog: str, doc: str | None, out_default: str, out_files: str) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line, with ``--out`` (default $OUT, else ``out_default``) for
    ``out_files`` and ``--hami-src``."""
    made = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0] if doc else None)
    made.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or out_default),
        help=f"where {out_files} go (default $OUT, else {out_default})",
    )
    made.add_argument(
        "--hami-src",
        type=Path,
        default=ROOT / ".gpu" / "hami-core",
        help="HAMi-core's exported source (default .gpu/hami-core in the repository)",
    )
    return made
