"""Where the GPU check finds its files and puts its builds, and the limits it grants the HAMi-core runs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root: the probe command runs from there
HERE = Path(__file__).resolve().parent  # load.py and hami_check.cu, beside this package's modules
WORK = Path("/tmp/gpu-check")  # HAMi-core's build and the compiled hami_check
MIB, GIB = 2**20, 2**30
VRAM_LIMIT = 4 * GIB  # what the HAMi-core container is granted
SM_PERCENT = 20
