"""The machine a benchmark ran on, in one line, so every figure a benchmark prints says where it was taken."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def describe() -> str:
    """CPU model (from /proc/cpuinfo where there is one), CPU count, Python and OS."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()} on {platform.system()} {platform.release()}"
    )
