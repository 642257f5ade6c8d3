"""The emulated GPU (benchmarks/isolation/emulated), built with gcc and g++ as the benchmark builds it and run
without HAMi-core (its source is not here): tenant_load.cu's host code built unchanged but for its launches,
one kernel at a time across processes, NVML seeing each process busy for the time its kernels ran, memory past
the GPU refused; the benchmark run end to end on it in shared mode; and its flags and prerequisites."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import benchmarks.isolation.__main__ as entry
from benchmarks.gpu_check import procs
from benchmarks.gpu_check import report as gpu_report
from benchmarks.isolation import bench, run
from benchmarks.isolation.driver_count import counted, sm_share
from benchmarks.isolation.emulated import build
from benchmarks.isolation.prereqs import blocked, check
from vgpu.names import IsolationMode as M

TENANT_LOAD = Path(bench.__file__).parent / "tenant_load.cu"
RUNTIME_H = build.HERE / "cuda_runtime.h"
MODEL_TFLOPS = 70.87e9 / 1.7e-3 / 1e12  # cuda_runtime.h's FP32 rate: the H200's compute load
# NVML's view of the emulated GPU from another process: each process holding a context, its utilisation.
NVML_QUERY = """
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("ts", ctypes.c_ulonglong), ("sm", ctypes.c_uint), ("mem", ctypes.c_uint),
                ("enc", ctypes.c_uint), ("dec", ctypes.c_uint)]
class Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong)]
device = ctypes.c_void_p()
assert lib.nvmlInit_v2() == 0 and lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device)) == 0
samples, n = (Sample * 16)(), ctypes.c_uint(16)
assert lib.nvmlDeviceGetProcessUtilization(device, samples, ctypes.byref(n), ctypes.c_ulonglong(0)) == 0
procs, m = (Proc * 16)(), ctypes.c_uint(16)
assert lib.nvmlDeviceGetComputeRunningProcesses(device, ctypes.byref(m), procs) == 0
print(json.dumps({"util": {s.pid: s.sm for s in samples[: n.value]}, "running": [p.pid for p in procs[: m.value]]}))
"""


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The fake driver's folder and the tenant load built against it."""
    work = tmp_path_factory.mktemp("emulated")
    driver = build.driver(work / "driver")
    return driver, build.tenant(TENANT_LOAD, driver, work / "tenant_load")


def start(machine: tuple[Path, Path], state: Path, *args: str) -> subprocess.Popen[str]:
    driver, tenant = machine
    return subprocess.Popen(
        [str(tenant), *args], stdout=subprocess.PIPE, text=True, env=build.tenant_env(driver, state)
    )


def rows(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return [json.loads(line) for line in out.splitlines()]


def nvml(machine: tuple[Path, Path], state: Path) -> dict[str, Any]:
    driver, _ = machine
    said = subprocess.run(
        [sys.executable, "-c", NVML_QUERY, str(driver / "libnvidia-ml.so.1")],
        env=build.tenant_env(driver, state),
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(said.stdout)
    return {"util": {int(k): v for k, v in seen["util"].items()}, "running": seen["running"]}


def wait_ready(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    ready: dict[str, Any] = json.loads(proc.stdout.readline())
    assert ready["step"] == "ready", ready
    return ready


def alone(machine: tuple[Path, Path], state: Path, kernel: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """One tenant running ``kernel`` for 2 s alone: its PID, NVML's view a second into it, its last row."""
    tenant = start(machine, state, kernel, "2")
    pid = wait_ready(tenant)["pid"]
    time.sleep(1.2)
    seen = nvml(machine, state)
    return pid, seen, rows(tenant)[-1]


def test_each_launch_of_the_tenant_load_becomes_a_call_the_emulated_runtime_defines() -> None:
    cuda = TENANT_LOAD.read_text()
    host = build.host_source(cuda)
    launched = re.findall(r"(\w+)<<<", cuda)
    assert launched and "<<<" not in host and ">>>" not in host
    assert re.findall(r"tf_launch_(\w+)\(", host) == launched
    assert set(launched) <= set(re.findall(r"static void tf_launch_(\w+)\(", RUNTIME_H.read_text()))


def test_a_tenant_alone_keeps_the_gpu_busy_at_no_more_than_the_models_rate(
    machine: tuple[Path, Path], tmp_path: Path
) -> None:
    state = tmp_path / "gpu.state"
    pid, seen, done = alone(machine, state, "compute")
    assert seen["running"] == [pid] and seen["util"][pid] >= 80, seen
    # One kernel at a time: never faster than the model; slower only by the launches' own cost.
    assert done["step"] == "done" and 0.5 * MODEL_TFLOPS <= done["rate"] <= 1.01 * MODEL_TFLOPS, done
    assert nvml(machine, state)["running"] == []  # gone with its process


def test_two_tenants_take_turns_and_together_never_exceed_the_gpu(machine: tuple[Path, Path], tmp_path: Path) -> None:
    state = tmp_path / "gpu.state"
    tenants = [start(machine, state, "compute", "3") for _ in range(2)]
    pids = [wait_ready(t)["pid"] for t in tenants]
    time.sleep(1.5)
    seen = nvml(machine, state)
    done = [rows(t)[-1]["rate"] for t in tenants]
    assert sorted(seen["running"]) == sorted(pids)
    assert sum(seen["util"].values()) <= 101 and all(seen["util"][p] >= 25 for p in pids), seen
    assert sum(done) <= 1.01 * MODEL_TFLOPS and min(done) >= 0.25 * MODEL_TFLOPS, done


def test_a_graph_runs_all_its_kernels_in_one_launch(machine: tuple[Path, Path], tmp_path: Path) -> None:
    pid, seen, done = alone(machine, tmp_path / "gpu.state", "graph")
    # A launch lasts its 16 kernels: as busy as one kernel at a time can be, no faster than the model.
    assert seen["util"][pid] >= 80 and 0.5 * MODEL_TFLOPS <= done["rate"] <= 1.01 * MODEL_TFLOPS, (seen, done)


def test_memory_past_the_gpu_is_refused_as_cuda_refuses_it(machine: tuple[Path, Path], tmp_path: Path) -> None:
    said = {r["step"]: r for r in rows(start(machine, tmp_path / "gpu.state", "alloc", "1024", "200000"))}
    assert said["mem_get_info"]["total_mib"] == 141 * 1024
    assert said["within"]["ok"] is True
    assert (said["over"]["ok"], said["over"]["error"]) == (False, "cudaErrorMemoryAllocation")


def test_a_tenant_held_at_its_fill_is_counted_by_the_plugins_own_nvml_probe(
    machine: tuple[Path, Path], tmp_path: Path
) -> None:
    """The memory scenario's driver count, through the device plugin's NvmlProbe (pynvml) on the fake NVML."""
    driver, _ = machine
    state = tmp_path / "gpu.state"
    tenant = start(machine, state, "fill", "64", "1000", "3")
    assert tenant.stdout is not None
    filled = json.loads(tenant.stdout.readline())
    assert (filled["step"], filled["mib"], filled["stopped"]) == ("filled", 960, "most")  # 15 chunks of 64 MiB
    uuid = build.gpu(driver).uuid
    # The driver counts the context too: the model's 512 MiB (fake_gpu.c, CONTEXT_MEMORY), which HAMi-core
    # measures at its start and counts against the limit; the VRAM guard's tolerance is for what it does not.
    seen = counted(uuid, filled["pid"], build.tenant_env(driver, state))
    assert seen == {"driver_mib": 960 + 512, "matched": "pid"}
    tenant.communicate(timeout=30)
    assert counted(uuid, filled["pid"], build.tenant_env(driver, state))["driver_mib"] is None  # gone with it


def test_a_running_tenants_sm_share_is_read_by_the_plugins_own_nvml_probe(
    machine: tuple[Path, Path], tmp_path: Path
) -> None:
    """The compute scenario's driver reading, through the device plugin's NvmlProbe (pynvml) on the fake NVML: a
    tenant alone keeps the model's SMs busy, and is found by its PID; one not running is not found."""
    driver, _ = machine
    state = tmp_path / "gpu.state"
    tenant = start(machine, state, "compute", "3")
    pid = wait_ready(tenant)["pid"]
    uuid = build.gpu(driver).uuid
    seen = sm_share(uuid, pid, build.tenant_env(driver, state), 1.0)
    assert seen["matched"] == "pid" and seen["driver_sm"] >= 80, seen
    rows(tenant)
    assert sm_share(uuid, pid + 1, build.tenant_env(driver, state), 0.5)["driver_sm"] is None


def test_the_benchmark_runs_end_to_end_on_the_emulated_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "WORK", tmp_path / "work")
    monkeypatch.setattr(bench, "HAMI_LOG", tmp_path / "vgpulog")
    monkeypatch.setattr(gpu_report, "SUMMARY", [])
    kept = procs.DEADLINE[0]
    try:
        code = run.run_all(tmp_path / "out", tmp_path / "no-hami", 70.0, (M.SHARED,), (), ("pair",), emulated=True)
    finally:
        procs.DEADLINE[0] = kept
    result = json.loads((tmp_path / "out" / "isolation.json").read_text())
    assert code == 0, result.get("error")
    assert result["gpu"]["name"].startswith("NVIDIA H200, emulated") and result["gpu"]["tflops"] == 989_000
    assert result["notes"][0].startswith("EMULATED GPU")
    assert [s["kernel"] for s in result["baseline"]["single"]] == ["compute"]
    # The uncapped tenant's SM share, read while it ran by the plugin's own probe: the whole (model) GPU.
    (driver,) = [s["driver"] for s in result["baseline"]["single"]]
    assert driver["matched"] == "pid" and driver["driver_sm"] >= 80, driver
    for pair in result["modes"]["shared"]["pairs"]:
        # No limit: two busy tenants take turns, about half the GPU each, all of it together (a little more than
        # one alone, whose own launches leave the GPU idle between its kernels).
        assert all(35 <= s <= 65 for s in pair["shares"]) and 85 <= pair["total"] <= 110, pair
    assert "EMULATED GPU" in (tmp_path / "out" / "isolation.md").read_text()


@pytest.mark.parametrize("modes", ["hard", "shared,partitioned"])
def test_the_emulated_gpu_refuses_the_modes_it_cannot_run(
    modes: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(entry, "run_all", lambda *a: pytest.fail("ran"))
    with pytest.raises(SystemExit) as stopped:
        entry.main(["--emulated", "--modes", modes, "--dry-run"])
    assert stopped.value.code == 2
    assert "--emulated runs shared,soft;" in capsys.readouterr().err


def test_with_emulated_the_default_modes_are_the_two_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.main(["--emulated", "--dry-run", "--budget", "400"]) == 0
    assert capsys.readouterr().out.startswith("plan for --budget 400 s, modes shared, soft:\n")


def test_on_the_emulated_gpu_the_compilers_and_headers_are_needed_not_nvidia_smi(tmp_path: Path) -> None:
    def never(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        raise AssertionError(f"no GPU is asked: {cmd}")

    source = tmp_path / "hami"
    (source / "src").mkdir(parents=True)
    (source / "src" / "libvgpu.c").write_text("")
    needs = check(
        (M.SHARED, M.SOFT),
        source,
        which=lambda p: None if p == "g++" else f"/usr/bin/{p}",
        run=never,
        emulated=True,
        headers=lambda: [],
    )
    assert [n.what for n in needs if not n.ok] == [
        "g++ (builds the tenant load's host code, tenant_load.cu)",
        "cuda.h and nvml.h (HAMi-core's build)",
    ]
    assert blocked(needs, M.SHARED) == ["g++ (builds the tenant load's host code, tenant_load.cu): not on PATH"]
    assert len(blocked(needs, M.SOFT)) == 2
    assert not any("nvcc" in n.what or "nvidia-smi" in n.what for n in needs)
