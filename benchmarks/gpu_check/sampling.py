"""Section 2, per-process sampling: a PyTorch load (``load.py``) watched once a second by
``NvmlProbe.processes`` and a real ``UsageSampler``; its PID, memory and SM share as sampled against what
the load reports of itself, and the cost of each sampling call on the real driver."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from benchmarks.gpu_check.constants import GIB, HERE, MIB
from benchmarks.gpu_check.procs import Reader, run
from benchmarks.gpu_check.report import REPORT, say, section

if TYPE_CHECKING:
    from device_plugin.gpus.nvml_backend import NvmlProbe
    from device_plugin.gpus.probe import GpuSample, ProcessReport
    from device_plugin.usage.sampler import UsageSampler

LOAD = [sys.executable, str(HERE / "load.py"), "sample", "--gib", "6", "--full", "12", "--duty", "12"]
SMI_AT = (3, 9, 16)  # nvidia-smi's compute apps listed at these samples
COST_AT = 4  # the calls timed here: inside the full phase, so that the load is listed while they are timed
PASS_AT = 10  # a sampler pass covering ~5 s of full load since the timed ones


def timed(calls: int, fn: Callable[[], object], cap_s: float = 1.5) -> dict[str, float]:
    """Wall (percentiles) and CPU time per call of ``fn``: ``calls`` calls, or fewer (at least 20) once
    ``cap_s`` has passed, so that a slow driver call does not eat the load's phases."""
    wall: list[float] = []
    cpu0, start = time.process_time(), time.perf_counter()
    while len(wall) < calls and (len(wall) < 20 or time.perf_counter() - start < cap_s):
        t0 = time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu0
    calls = len(wall)
    wall.sort()
    return {
        "calls": calls,
        "wall_mean_us": round(1e6 * statistics.fmean(wall), 1),
        "wall_p50_us": round(1e6 * wall[len(wall) // 2], 1),
        "wall_p99_us": round(1e6 * wall[int(len(wall) * 0.99)], 1),
        "cpu_mean_us": round(1e6 * cpu / calls, 1),
    }


def sampling_cost(probe: NvmlProbe, uuid: str, sampler: UsageSampler) -> dict[str, Any]:
    """What each NVML call behind a sample, the probe's call and a sampler pass cost on this driver."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
    recent = [int(time.time() * 1e6) - 1_000_000]

    def utilisation() -> None:
        try:
            pynvml.nvmlDeviceGetProcessUtilization(handle, recent[0])
        except pynvml.NVMLError as exc:  # NOT_FOUND: no sample since then; the call's cost is what counts
            if exc.value != pynvml.NVML_ERROR_NOT_FOUND:
                raise

    since = [recent[0]]

    def processes() -> None:
        since[0] = probe.processes(uuid, since[0]).until_us

    return {
        "nvmlDeviceGetComputeRunningProcesses": timed(300, lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle)),
        "nvmlDeviceGetProcessUtilization": timed(300, utilisation),
        "NvmlProbe.processes (handle by UUID + both calls)": timed(300, processes),
        "UsageSampler.sample pass (1 GPU, no pods)": timed(100, lambda: sampler.sample([])),
    }


@dataclass
class Watched:
    """What was seen while the load ran."""

    samples: list[dict[str, Any]] = field(default_factory=list)  # one a second
    smi: list[dict[str, Any]] = field(default_factory=list)  # nvidia-smi's compute apps, now and then
    cost: dict[str, Any] = field(default_factory=dict)
    pass_seen: dict[str, Any] = field(default_factory=dict)


def sample_row(now: float, report: ProcessReport, whole: GpuSample) -> dict[str, Any]:
    return {
        "t": now,
        "sm_supported": report.sm_supported,
        "gpu_util": whole.utilization,
        "processes": [
            {"pid": p.pid, "sm_percent": p.sm_percent, "memory_used": p.memory_used} for p in report.processes
        ],
    }


def sampler_pass(sampler: UsageSampler) -> dict[str, Any]:
    """One pass of the sampler, as its unattributed entries (the load belongs to no pod) and containers."""
    usage = sampler.sample([])
    return {
        "unattributed": [
            {
                "gpu": u.gpu,
                "processes": u.processes,
                "tflops_used_milli": u.tflops_used,
                "vram_used": u.vram_used,
                "tflops_measured": u.tflops_measured,
            }
            for u in usage.unattributed
        ],
        "containers": len(usage.containers),
    }


def watch(proc: subprocess.Popen[str], probe: NvmlProbe, uuid: str, sampler: UsageSampler) -> Watched:
    """Sample the GPU once a second while the load runs (a minute at most)."""
    seen = Watched()
    since = probe.processes(uuid, 0).until_us
    started = time.time()
    while proc.poll() is None and time.time() - started < 60:
        time.sleep(1.0)
        now = time.time()
        report = probe.processes(uuid, since)
        since = report.until_us
        seen.samples.append(sample_row(now, report, probe.sample(uuid)))
        if len(seen.samples) in SMI_AT:
            q = run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
            seen.smi.append({"t": now, "rows": q.stdout.strip().splitlines()})
        if len(seen.samples) == COST_AT and not seen.cost:
            sampler.sample([])  # the sampler's own first pass (since 0), so the timed ones are steady passes
            seen.cost = sampling_cost(probe, uuid, sampler)
        if len(seen.samples) == PASS_AT and not seen.pass_seen:
            seen.pass_seen = sampler_pass(sampler)
    return seen


def start_load() -> tuple[Reader, dict[str, Any]]:
    """The load, started and holding its memory: its reader and its ``ready`` line."""
    proc = subprocess.Popen(LOAD, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    load = Reader(proc)
    ready = load.wait_for("phase", "ready", 120)
    if ready is None:
        raise RuntimeError(f"the load did not start: {load.finish(10)[-2000:]}")
    return load, ready


def phase_window(samples: list[dict[str, Any]], phases: dict[str, dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The samples wholly inside the load's phase ``name``: each covers the second before it, so the first
    counted is the one after a sample taken at least half a second into the phase."""
    lo, hi = phases.get(f"{name}_start", {}).get("t"), phases.get(f"{name}_end", {}).get("t")
    if lo is None or hi is None:
        return []
    return [s for i, s in enumerate(samples) if i > 0 and samples[i - 1]["t"] >= lo + 0.5 and s["t"] <= hi]


def own_process(sample: dict[str, Any], pid: int) -> dict[str, Any] | None:
    return next((p for p in sample["processes"] if p["pid"] == pid), None)


def phase_figures(
    samples: list[dict[str, Any]], phases: dict[str, dict[str, Any]], name: str, pid: int
) -> dict[str, Any]:
    """The load's own busy share in phase ``name``, and the SM shares and GPU utilisation sampled in it."""
    inside = phase_window(samples, phases, name)
    return {
        "load_busy_percent": phases.get(f"{name}_end", {}).get("busy_percent"),
        "sampled_sm_percent": [m["sm_percent"] for s in inside if (m := own_process(s, pid))],
        "gpu_util": [s["gpu_util"] for s in inside if s["gpu_util"] is not None],
    }


def say_phase(name: str, figures: dict[str, Any], pid: int) -> None:
    shares, whole, truth = figures["sampled_sm_percent"], figures["gpu_util"], figures["load_busy_percent"]
    if shares:
        say(
            f"{name} phase: the load measured the GPU busy {truth} % of wall time (CUDA events); sampled SM "
            f"share per 1 s {shares} (mean {statistics.fmean(shares):.0f}); whole-GPU utilisation mean "
            f"{statistics.fmean(whole) if whole else float('nan'):.0f}"
        )
    else:
        say(f"{name} phase: no samples of PID {pid} inside the phase")


def summarise(ready: dict[str, Any], seen: Watched, load: Reader, err: str, gpu_tflops: int) -> dict[str, Any]:
    """The section's result from what was sampled and what the load said; its findings said."""
    pid = ready["pid"]
    samples = seen.samples
    phases = {r["phase"]: r for r in load.rows if "phase" in r}
    seen_pids = sorted({p["pid"] for s in samples for p in s["processes"]})
    memory = [m["memory_used"] for s in samples if (m := own_process(s, pid)) and m["memory_used"]]
    result: dict[str, Any] = {
        "pid": pid,
        "pids_seen": seen_pids,
        "pid_seen": pid in seen_pids,
        "held_bytes": ready["held_bytes"],
        "torch_memory_allocated": ready["memory_allocated"],
        "torch_memory_reserved": ready["memory_reserved"],
        "nvml_memory_used": max(memory) if memory else None,
        "nvidia_smi_compute_apps": seen.smi,
        "phases": {},
        "cost": seen.cost,
        "sampler_pass": seen.pass_seen,
        "samples": samples,
        "load_stderr_tail": err[-1500:],
    }
    if memory:
        say(
            f"PID seen by NvmlProbe.processes: {pid in seen_pids} (PIDs listed: {seen_pids}); memory used "
            f"{max(memory) / MIB:.0f} MiB vs torch reserved {ready['memory_reserved'] / MIB:.0f} MiB "
            f"(+{(max(memory) - ready['memory_reserved']) / MIB:.0f} MiB: CUDA context and cuBLAS workspace); "
            f"nvidia-smi: {seen.smi[0]['rows'] if seen.smi else 'n/a'}"
        )
    say(f"driver reports per-process utilisation (sm_supported): {sorted({s['sm_supported'] for s in samples})}")
    for name in ("full", "duty"):
        result["phases"][name] = phase_figures(samples, phases, name, pid)
        say_phase(name, result["phases"][name], pid)
    for name, figures in seen.cost.items():
        say(f"cost of {name}: {figures}")
    if seen.pass_seen:
        say(f"UsageSampler pass during the full phase: {seen.pass_seen} (GPU {gpu_tflops / 1000:g} TFLOPS)")
    return result


@section("per-process sampling")
def sampling() -> dict[str, Any]:
    from device_plugin.gpus.board import discover
    from device_plugin.gpus.nvml_backend import NvmlProbe
    from device_plugin.metrics import PluginMetrics
    from device_plugin.usage.process_owner import ProcResolver
    from device_plugin.usage.sampler import UsageSampler
    from vgpu.catalog import builtin

    probe = NvmlProbe()
    gpu = discover(probe.devices()[:1], builtin(), 0)[0]
    sampler = UsageSampler(
        probe, ProcResolver(), lambda: [gpu], lambda: [], PluginMetrics(), node="gpu-check", interval_s=5.0
    )
    load, ready = start_load()
    say(
        f"load PID {ready['pid']}: holds {ready['held_bytes'] / GIB:g} GiB; torch memory_allocated "
        f"{ready['memory_allocated'] / MIB:.0f} MiB, memory_reserved {ready['memory_reserved'] / MIB:.0f} MiB"
    )
    seen = watch(load.proc, probe, gpu.uuid, sampler)
    err = load.finish(30)
    probe.close()
    result = summarise(ready, seen, load, err, gpu.tflops)
    REPORT["sampling"] = result
    return result
