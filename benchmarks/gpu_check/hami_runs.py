"""How the HAMi-core checks run their programs: the environment the device plugin gives a container granted
4 GiB and 20 % of the GPU, ``hami_check`` compiled, and each run with or without the preload (a limited one
from a fresh region, a watched one sampled each second), logged for hami-runs.log."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.gpu_check.constants import HERE, SM_PERCENT, VRAM_LIMIT, WORK
from benchmarks.gpu_check.grant import one_gpu_allocation
from benchmarks.gpu_check.procs import Reader, bounded, lines_of, run
from benchmarks.gpu_check.report import say

if TYPE_CHECKING:
    from device_plugin.gpus.nvml_backend import NvmlProbe

LOAD = [sys.executable, str(HERE / "load.py")]


def container_env(uuid: str, gpu_tflops: int) -> dict[str, str]:
    """What the device plugin's Allocate gives a hami-core container granted 4 GiB and 20 % of this GPU."""
    from device_plugin.enforcement.envs import EnforcementPaths, LiveMount, Target, build
    from vgpu.names import LIVE_LIMITS_DIR, EnforcementBackend

    made = build(
        one_gpu_allocation(uuid, gpu_tflops, gpu_tflops * SM_PERCENT // 100, VRAM_LIMIT, node="gpu-check"),
        Target(namespace="gpu-check", pod="hami", container="main"),
        EnforcementBackend.HAMI_CORE,
        EnforcementPaths(),
        LiveMount(host_dir=LIVE_LIMITS_DIR),
    )
    return dict(made.envs)


def nvcc_build(source: Path, output: Path) -> Path:
    """``source`` compiled with nvcc for the H100/H200 (sm_90; shared cudart, as PyTorch and most
    applications link it) into ``output``; a failure raised with nvcc's messages."""
    nvcc = run(["nvcc", "-O2", "-arch=sm_90", "-cudart", "shared", str(source), "-o", str(output)], timeout=180)
    if nvcc.returncode != 0:
        raise RuntimeError(f"nvcc {source.name}: {nvcc.stderr[-2000:]}")
    return output


def build_checker() -> Path:
    """hami_check.cu compiled with nvcc."""
    return nvcc_build(HERE / "hami_check.cu", WORK / "hami_check")


@dataclass
class Runs:
    """The section's runs of one GPU, with and without the preload; each limited run starts from a fresh
    region (a fresh container's starts from the environment), and every run is logged for hami-runs.log."""

    region: Path
    base_env: dict[str, str]
    limited_env: dict[str, str]
    probe: NvmlProbe
    uuid: str
    log: list[str] = field(default_factory=list)

    def go(self, label: str, cmd: list[str], limited: bool, timeout: float = 120) -> list[dict[str, Any]]:
        """``cmd`` to its end; its JSON lines."""
        if limited:
            self.region.unlink(missing_ok=True)  # a fresh container: its region starts from the environment
        done = run(cmd, env=self.limited_env if limited else self.base_env, timeout=timeout)
        self.log.append(
            f"### {label} (preload: {limited}) rc {done.returncode}\n$ {' '.join(cmd)}\n--- stdout\n"
            f"{done.stdout}\n--- stderr (tail)\n{done.stderr[-5000:]}\n"
        )
        rows = lines_of(done.stdout)
        if done.returncode != 0:
            say(f"{label}: rc {done.returncode}; stderr tail: {done.stderr.strip()[-600:]}")
        return rows

    def watched(self, label: str, cmd: list[str], seconds: float) -> dict[str, Any]:
        """A limited run while NvmlProbe.processes samples its PID each second; HAMi-core logs at info
        level (LIBCUDA_LOG_LEVEL=3, a log switch only) so that its utilisation watcher's view is kept."""
        self.region.unlink(missing_ok=True)
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**self.limited_env, "LIBCUDA_LOG_LEVEL": "3"},
        )
        reader = Reader(proc)
        since, seen = int(time.time() * 1e6), []
        stop = time.time() + bounded(seconds + 60)
        while proc.poll() is None and time.time() < stop:
            time.sleep(1.0)
            rep = self.probe.processes(self.uuid, since)
            since = rep.until_us
            seen.append(next((p.sm_percent for p in rep.processes if p.pid == proc.pid), None))
        err = reader.finish(seconds + 90)
        watcher = [line.strip() for line in err.splitlines() if "userutil=" in line]
        notable = hami_lines(err)
        self.log.append(
            f"### {label} {seconds} s (preload: True, LIBCUDA_LOG_LEVEL=3) rc {proc.returncode}\n"
            f"$ {' '.join(cmd)}\n"
            f"--- stdout\n{''.join(reader.raw)}\n--- HAMi-core lines\n" + "\n".join(notable[:20]) + "\n"
            f"--- its utilisation watcher ({len(watcher)} lines; every 8th)\n" + "\n".join(watcher[::8]) + "\n"
            f"--- stderr (tail)\n{err[-3000:]}\n"
        )
        return {
            "rows": reader.rows,
            "sampled_sm_percent": seen,
            "hami_lines": notable[:20],
            "watcher_lines": len(watcher),
            "watcher_sample": watcher[::8][:60],
        }


def hami_lines(err: str) -> list[str]:
    """HAMi-core's log lines worth keeping: its PID and limit set-up, and any OOM."""
    keys = ("SET PID", "SET_TASK_PID", "setspec", "core utilization limit", "OOM")
    return [line.strip() for line in err.splitlines() if any(k in line for k in keys)]
