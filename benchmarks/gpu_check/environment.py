"""Section 0, the environment: driver, CUDA, NVML, toolchain and Python versions as the report opens with
them, and ``nvidia-smi -q`` kept whole among the raw logs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu_check.procs import run
from benchmarks.gpu_check.report import REPORT, say, section
from benchmarks.gpu_check.smi import smi_xml


def first_line(cmd: list[str], *, last: bool = False) -> str:
    """A tool's version line (its first, or its last), or ``absent``."""
    lines = run(cmd).stdout.strip().splitlines() or ["absent"]
    return lines[-1] if last else lines[0]


@section("environment")
def environment(out: Path) -> dict[str, Any]:
    import pynvml

    text = run(["nvidia-smi", "-q"], timeout=60)
    (out / "nvidia-smi-q.txt").write_text(text.stdout + text.stderr)
    root = smi_xml()
    pynvml.nvmlInit()
    cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
    torch = run([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"], timeout=120)
    env = {
        "driver (nvidia-smi)": root.findtext("driver_version"),
        "CUDA (nvidia-smi)": root.findtext("cuda_version"),
        "driver (NVML)": pynvml.nvmlSystemGetDriverVersion(),
        "CUDA (NVML)": f"{cuda // 1000}.{cuda % 1000 // 10}",
        "NVML library": pynvml.nvmlSystemGetNVMLVersion(),
        "nvidia-ml-py": getattr(pynvml, "__version__", "?"),
        "nvcc": first_line(["nvcc", "--version"], last=True),
        "cmake": first_line(["cmake", "--version"]),
        "torch": torch.stdout.strip() or torch.stderr.strip()[-200:],
        "python": sys.version.split()[0],
        "kernel": os.uname().release,
        "gpus": [g.findtext("product_name") for g in root.findall("gpu")],
    }
    pynvml.nvmlShutdown()
    REPORT["environment"] = env
    for key, value in env.items():
        say(f"- {key}: {value}")
    return env
