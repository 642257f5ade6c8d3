"""Section 3, HAMi-core's limits: ``libvgpu.so`` preloaded into ``hami_check`` and the PyTorch load with the
environment the device plugin gives a container (hami_runs). Checked: the memory limit, a live limit change
through the plugin's region writer, and throughput under the SM limit."""

from __future__ import annotations

import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.gpu_check.constants import GIB, SM_PERCENT, VRAM_LIMIT, WORK
from benchmarks.gpu_check.hami_build import build_hami
from benchmarks.gpu_check.hami_runs import LOAD, Runs, build_checker, container_env
from benchmarks.gpu_check.procs import Reader, step
from benchmarks.gpu_check.report import REPORT, say, section


def memory_line(label: str, limited: bool, rows: list[dict[str, Any]]) -> str:
    """One memory run as said: the device size seen, and which allocations were granted."""
    info, held, extra = step(rows, "mem_get_info"), step(rows, "held"), step(rows, "extra_while_held")
    return (
        f"{label}, {'HAMi-core 4 GiB limit' if limited else 'no preload'}: mem_get_info total "
        f"{info.get('total_mib')} MiB; 3072 MiB: {'ok' if held.get('ok') else held.get('error')}; "
        f"+2048 MiB while holding it: {'ok' if extra.get('ok') else 'refused: ' + str(extra.get('error'))}"
        + (
            f"; 2048 MiB alone: {'ok' if step(rows, 'extra_alone').get('ok') else 'refused'}"
            if step(rows, "extra_alone")
            else ""
        )
    )


def memory_checks(runs: Runs, checker: Path, result: dict[str, Any]) -> None:
    """(a) 3072 MiB, then 2048 MiB more under the 4 GiB limit and without it: the CUDA program, then
    PyTorch; after the CUDA program, the plugin's region reader on HAMi-core's real region."""
    from device_plugin.enforcement import hami_region

    for label, cmd in (
        ("hami_check mem", [str(checker), "mem", "3072", "2048"]),
        ("torch mem", [*LOAD, "mem", "--held-mib", "3072", "--extra-mib", "2048"]),
    ):
        for limited in (False, True):
            rows = runs.go(label, cmd, limited)
            result[f"{label} ({'limited' if limited else 'no preload'})"] = rows
            say(memory_line(label, limited, rows))
        if label == "hami_check mem":
            seen = hami_region.sync(runs.region, [(VRAM_LIMIT, SM_PERCENT)])
            result["region after mem"] = {
                "state": seen.region.state.value,
                "slots": seen.region.slots,
                "reason": seen.region.reason,
                "writes": len(seen.writes),
            }
            say(
                f"device_plugin.enforcement.hami_region reads HAMi-core's real region: {result['region after mem']} "
                f"(expected ready, slots (({VRAM_LIMIT}, {SM_PERCENT}),), no write)"
            )


def live_change(runs: Runs, checker: Path, result: dict[str, Any]) -> None:
    """(c) 5120 MiB refused under 4 GiB, the limit raised to 8 GiB through the plugin's region writer while
    the process runs, then 5120 MiB again."""
    from device_plugin.enforcement import hami_region

    runs.region.unlink(missing_ok=True)
    live = subprocess.Popen(
        [str(checker), "live", "5120"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=runs.limited_env,
    )
    reader = Reader(live)
    if reader.wait_for("step", "waiting", 60) is not None:
        synced = hami_region.sync(runs.region, [(8 * GIB, SM_PERCENT)])
        assert live.stdin is not None
        live.stdin.write("go\n")
        live.stdin.flush()
    else:
        synced = None
    err = reader.finish(60)
    runs.log.append(
        f"### hami_check live 5120 (preload: True) rc {live.returncode}\n--- stdout\n"
        f"{''.join(reader.raw)}\n--- stderr (tail)\n{err[-5000:]}\n"
    )
    before, after = step(reader.rows, "before"), step(reader.rows, "after")
    infos = [r for r in reader.rows if r.get("step") == "mem_get_info"]
    result["live"] = {
        "rows": reader.rows,
        "sync": None
        if synced is None
        else {
            "state": synced.region.state.value,
            "slots": synced.region.slots,
            "writes": [str(w) for w in synced.writes],
        },
    }
    say(
        f"live limit: 5120 MiB under 4 GiB: {'ok' if before.get('ok') else 'refused ' + str(before.get('error'))}; "
        f"hami_region.sync to 8 GiB: {result['live']['sync']}; then 5120 MiB: "
        f"{'ok' if after.get('ok') else 'refused ' + str(after.get('error'))}; mem_get_info totals "
        f"{[i.get('total_mib') for i in infos]} MiB"
    )


def rate(rows: list[dict[str, Any]], key: str, total_step: str, settle: float) -> tuple[Any, Any]:
    """``key`` overall (the ``total_step`` row's) and steady (the mean of the per-second rows after
    ``settle`` seconds)."""
    overall = step(rows, total_step).get(key)
    per_second = [r[key] for r in rows if r.get("step") in ("burn_second", "second") and r.get("t", 99) > settle]
    steady = statistics.fmean(per_second) if per_second else None
    return overall, steady


def kernel_throughput(runs: Runs, checker: Path, result: dict[str, Any]) -> dict[str, Any]:
    """(b) the compute kernel loop without the preload, then under the SM limit (watched); the latter run."""
    free = {"rows": runs.go("hami_check burn", [str(checker), "burn", "6"], False, 6 + 90)}
    capped = runs.watched("hami_check burn", [str(checker), "burn", "16"], 16)
    (b_all, b_steady), (c_all, c_steady) = (
        rate(free["rows"], "kernels_per_s", "burn", 1),
        rate(capped["rows"], "kernels_per_s", "burn", 6),
    )
    series = [r["kernels_per_s"] for r in capped["rows"] if r.get("step") == "burn_second"]
    result["burn"] = {"baseline": free, "limited": capped}
    if b_all and c_all:
        say(
            f"compute kernel loop: {b_all} kernels/s without the preload; under CUDA_DEVICE_SM_LIMIT "
            f"{SM_PERCENT}: {c_all} overall, {c_steady and round(c_steady, 1)} after 6 s: ratio "
            f"{c_all / b_all:.3f} overall, {(c_steady or 0) / (b_steady or b_all):.3f} steady; per second "
            f"{series}; sampled SM share of the limited PID per 1 s {capped['sampled_sm_percent']}"
        )
    else:
        say(f"compute kernel loop: baseline {b_all}, limited {c_all} (see hami-runs.log)")
    return capped


def torch_throughput(runs: Runs, result: dict[str, Any]) -> dict[str, Any]:
    """(b) the PyTorch matmul loop without the preload, then under the SM limit (watched); the latter run."""
    t_free = runs.go("torch matmul", [*LOAD, "matmul", "--seconds", "6"], False, 120)
    capped_torch = runs.watched("torch matmul", [*LOAD, "matmul", "--seconds", "16"], 16)
    t_capped = capped_torch["rows"]
    tb_all, tc_all = step(t_free, "matmul").get("tflops"), step(t_capped, "matmul").get("tflops")
    t0 = next((r["t"] for r in t_capped), 0)
    steady_rows = [r["tflops"] for r in t_capped if r.get("step") == "second" and r["t"] - t0 > 6]
    result["torch matmul"] = {"baseline": t_free, "limited": capped_torch}
    if tb_all and tc_all:
        tc_late = statistics.fmean(steady_rows) if steady_rows else None
        say(
            f"PyTorch bf16 8192³ matmul loop: {tb_all} TFLOP/s without the preload; {tc_all} under the limit "
            f"(ratio {tc_all / tb_all:.3f}); after 6 s {tc_late and round(tc_late, 1)} "
            f"(ratio {(tc_late or 0) / tb_all:.3f}); per second "
            f"{[r['tflops'] for r in t_capped if r.get('step') == 'second']}; sampled SM share of the limited "
            f"PID per 1 s {capped_torch['sampled_sm_percent']}"
        )
    else:
        say(f"PyTorch matmul: baseline {tb_all}, limited {tc_all} (see hami-runs.log)")
    return capped_torch


def prepare(out: Path, src: Path) -> tuple[dict[str, Any], Path | None]:
    """The section's result (its source's commit in it), and HAMi-core built from ``src``: None when it did
    not build (said). No source there is an error, before anything is recorded."""
    WORK.mkdir(parents=True, exist_ok=True)
    if not (src / "src" / "libvgpu.c").exists():
        raise RuntimeError(f"no HAMi-core source at {src} (export it there first: see the module docstring)")
    result: dict[str, Any] = REPORT.setdefault("hami", {})
    commit = src / "COMMIT"
    result["commit"] = commit.read_text().strip() if commit.exists() else "unknown"
    return result, build_hami(src, out)


@section("HAMi-core limits")
def hami(out: Path, src: Path) -> dict[str, Any]:
    from device_plugin.gpus.board import discover
    from device_plugin.gpus.nvml_backend import NvmlProbe
    from vgpu.catalog import builtin
    from vgpu.names import HAMI_REGION_FILE, LIVE_LIMITS_DIR

    result, lib = prepare(out, src)
    if lib is None:
        return result
    checker = build_checker()
    probe = NvmlProbe()
    gpu = discover(probe.devices()[:1], builtin(), 0)[0]
    envs = container_env(gpu.uuid, gpu.tflops)
    result["container_env"] = envs
    say("container environment from device_plugin.enforcement.envs.build (hami-core, live limits on):")
    for key in sorted(envs):
        say(f"    {key}={envs[key]}")
    region = Path(LIVE_LIMITS_DIR) / HAMI_REGION_FILE
    region.parent.mkdir(parents=True, exist_ok=True)
    Path("/tmp/vgpulock").mkdir(exist_ok=True)  # HAMi-core's lock directory outside its images
    base_env = dict(os.environ)
    limited_env = {**base_env, **envs, "LD_PRELOAD": str(lib)}  # LD_PRELOAD: what /etc/ld.so.preload does there
    runs = Runs(region, base_env, limited_env, probe, gpu.uuid)
    try:
        memory_checks(runs, checker, result)
        live_change(runs, checker, result)
        capped = kernel_throughput(runs, checker, result)
        capped_torch = torch_throughput(runs, result)
        for name, seen in (("hami_check burn", capped), ("torch matmul", capped_torch)):
            say(
                f"HAMi-core under the limit, {name}: {seen['hami_lines'][:6]}; watcher lines {seen['watcher_lines']}, "
                f"e.g. {seen['watcher_sample'][2:4]} ... {seen['watcher_sample'][-2:]}"
            )
    finally:
        probe.close()
        (out / "hami-runs.log").write_text("\n".join(runs.log))
    return result
