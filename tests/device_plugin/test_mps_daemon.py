"""The MPS control daemon under ``--backend=mps``: the pure plan (table tests), then the whole plugin
(Daemon) running ``tests/device_plugin/fake_mps_control.py`` as its control program — started with its GPUs
and defaults, restarted when killed, its GPUs unhealthy (with a node Event) while it cannot run and healthy
again after, told to quit at exit."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from device_plugin.daemon import Daemon
from device_plugin.enforcement.mps_daemon import alive, read_pid
from device_plugin.enforcement.mps_plan import (
    Ceiling,
    ModeVerdict,
    MpsConfig,
    backoff,
    ceiling,
    ceiling_commands,
    compute_mode_verdict,
    plan,
    problems,
    served,
    server_pids,
)
from device_plugin.gpus.probe import ComputeMode
from device_plugin.gpus.slices import slice_id
from tests.device_plugin.fakes import (
    A100_TFLOPS,
    GIB,
    GPU0,
    GPU1,
    FakeKube,
    allocation,
    gpu_file,
    grant,
    make_pod,
    uid_of,
)
from tests.device_plugin.harness import plugin, run, until
from vgpu.contract.allocation import decode
from vgpu.contract.inventory import GpuInfo, Health
from vgpu.names import IsolationMode, SystemAnnotation

ALLOC = SystemAnnotation.ALLOCATION.value

FAKE_CONTROL = Path(__file__).with_name("fake_mps_control.py")
MIB = 1024 * 1024
WHOLE = GpuInfo(uuid=GPU0, index=0, model="A100", tflops=1, vram=81920 * MIB)
SECOND = GpuInfo(uuid=GPU1, index=3, model="A100", tflops=1, vram=40960 * MIB)
MIG_GPU = GpuInfo(uuid="GPU-mig", index=2, model="A100", tflops=1, vram=1, mig=True)
MIG_UNIT = GpuInfo(uuid="MIG-unit", index=2, model="A100 MIG 1g.10gb", tflops=1, vram=1, parent="GPU-mig")


# --- the plan -----------------------------------------------------------------------------------------------
def test_one_daemon_serves_the_whole_gpus_by_uuid_with_its_directories_and_defaults() -> None:
    got = plan((WHOLE, MIG_GPU, MIG_UNIT, SECOND), MpsConfig(control="/bin/mps", pipe_dir="/p", log_dir="/l"))
    assert got.gpus == (GPU0, GPU1)
    assert got.env == {
        "CUDA_VISIBLE_DEVICES": f"{GPU0},{GPU1}",
        "CUDA_MPS_PIPE_DIRECTORY": "/p",
        "CUDA_MPS_LOG_DIRECTORY": "/l",
    }
    assert (got.start, got.command, got.pid_file) == (
        ("/bin/mps", "-d"),
        ("/bin/mps",),
        "/p/nvidia-cuda-mps-control.pid",
    )
    # Devices numbered as the servers see them: their place in CUDA_VISIBLE_DEVICES, not the node's index.
    assert got.defaults == (
        "set_default_active_thread_percentage 100",
        "set_default_device_pinned_mem_limit 0 81920M",
        "set_default_device_pinned_mem_limit 1 40960M",
    )
    assert served((MIG_GPU, MIG_UNIT)) == ()


@pytest.mark.parametrize(
    ("error", "now", "verdict"),
    [
        (None, ComputeMode.EXCLUSIVE_PROCESS, ModeVerdict()),
        ("no permission", ComputeMode.EXCLUSIVE_PROCESS, ModeVerdict(warning="setting compute mode Exclusive_Process "
                                                                            "failed (no permission); it already is")),
        ("no permission", ComputeMode.DEFAULT, "it is Default"),
        ("no permission", None, "it is unreadable"),
    ],
)  # fmt: skip
def test_a_compute_mode_that_cannot_be_set_is_a_problem_unless_it_already_is_exclusive(
    error: str | None, now: ComputeMode | None, verdict: ModeVerdict | str
) -> None:
    got = compute_mode_verdict(error, now)
    if isinstance(verdict, ModeVerdict):
        assert got == verdict
    else:
        assert got.problem is not None and verdict in got.problem and "without MPS" in got.problem


@pytest.mark.parametrize(("failures", "delay"), [(1, 0.5), (2, 1.0), (3, 2.0), (8, 60.0), (100, 60.0)])
def test_restarts_back_off_doubling_up_to_a_minute(failures: int, delay: float) -> None:
    assert backoff(failures, 0.5) == delay


def test_a_gpus_problem_is_its_compute_modes_else_the_daemons() -> None:
    modes = {GPU0: "compute mode refused", GPU1: None}
    assert problems((GPU0, GPU1), None, modes) == {GPU0: "compute mode refused", GPU1: None}
    assert problems((GPU0, GPU1), "daemon exited", modes) == {GPU0: "compute mode refused", GPU1: "daemon exited"}


# --- the plugin running the stand-in -------------------------------------------------------------------------
def hard(uid: str, *gpus: tuple[str, int, int], isolation: IsolationMode | None = None) -> Any:
    """A grant of (GPU, percent of an A100, GiB of VRAM limit) per GPU, decoded."""
    made = [grant(u, tflops=A100_TFLOPS * pct // 100, vram=gib * GIB) for u, pct, gib in gpus]
    return decode(allocation(uid, gpus=made, isolation=isolation))


CONFIG = MpsConfig(control="/bin/mps", pipe_dir="/p", log_dir="/l")


def test_the_ceiling_is_the_widest_cap_and_per_gpu_the_largest_vram_limit_granted() -> None:
    daemon = plan((WHOLE, SECOND), CONFIG)
    grants = [hard("a", (GPU0, 25, 4)), hard("b", (GPU0, 10, 12), (GPU1, 50, 2)), hard("c", (GPU1, 30, 8))]
    assert ceiling(daemon, grants) == Ceiling(50, (12 * 1024, 8 * 1024))
    # A GPU without a grant keeps its whole memory (no container is given its device); a grant elsewhere
    # (a MIG unit's, not served) does not count; under isolation shared the compute cap is the whole GPU.
    assert ceiling(daemon, [hard("a", (GPU0, 25, 4)), hard("m", ("MIG-unit", 90, 70))]) == Ceiling(25, (4096, 40960))
    assert ceiling(daemon, [hard("s", (GPU1, 25, 4), isolation=IsolationMode.SHARED)]) == Ceiling(100, (81920, 4096))
    assert ceiling(daemon, []) is None and ceiling(daemon, [hard("m", ("MIG-unit", 90, 70))]) is None


def test_the_ceiling_is_set_as_the_default_and_on_each_running_server() -> None:
    assert ceiling_commands(Ceiling(30, (4096, 8192)), (41, 42)) == (
        "set_default_active_thread_percentage 30",
        "set_default_device_pinned_mem_limit 0 4096M",
        "set_default_device_pinned_mem_limit 1 8192M",
        "set_active_thread_percentage 41 30",
        "set_device_pinned_mem_limit 41 0 4096M",
        "set_device_pinned_mem_limit 41 1 8192M",
        "set_active_thread_percentage 42 30",
        "set_device_pinned_mem_limit 42 0 4096M",
        "set_device_pinned_mem_limit 42 1 8192M",
    )
    assert server_pids("4242\n4343\n") == (4242, 4343) and server_pids("") == () and server_pids("none\n") == ()


@pytest.fixture
def mps_dirs() -> Iterator[Path]:
    """Short directories (a unix socket's path is at most 107 bytes); any daemon left behind is killed."""
    root = Path(tempfile.mkdtemp(prefix="mps-"))
    try:
        yield root
    finally:
        pid = read_pid(str(root / "pipe" / "nvidia-cuda-mps-control.pid"))
        if pid is not None and alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


STARTS = 20.0  # seconds to wait for a few starts of the stand-in control program


def mps_settings(root: Path) -> dict[str, Any]:
    return {
        "backend": "mps",
        "mps_control": str(FAKE_CONTROL),
        "mps_pipe_host": str(root / "pipe"),
        "mps_log_dir": str(root / "log"),
        "mps_shm_host": str(root / "shm"),
        "mps_restart_backoff": 0.05,
        "health_recovery": 0,
    }


def records(root: Path) -> list[dict[str, Any]]:
    path = root / "log" / "fake-mps-control.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def starts(root: Path) -> list[dict[str, Any]]:
    return [r for r in records(root) if r["event"] == "start"]


def commands(root: Path, pid: int) -> list[str]:
    """The commands daemon ``pid`` received."""
    return [r["command"] for r in records(root) if r["event"] == "command" and r["pid"] == pid]


def health(daemon: Daemon) -> dict[str, Health]:
    return {g.uuid: g.health for g in daemon.board.gpus()}


def errors(daemon: Daemon) -> float:
    return daemon.metrics.registry.get_sample_value("tf_device_plugin_errors_total", {"where": "mps_daemon"}) or 0


DEFAULTS = [
    "set_default_active_thread_percentage 100",
    "set_default_device_pinned_mem_limit 0 81920M",
    "set_default_device_pinned_mem_limit 1 81920M",
]
BOTH_HEALTHY = {GPU0: Health.HEALTHY, GPU1: Health.HEALTHY}


def test_the_daemon_starts_for_the_gpus_with_the_defaults_and_quits_when_the_plugin_stops(
    tmp_path: Path, mps_dirs: Path
) -> None:
    kube = FakeKube()

    async def scenario() -> int:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), **mps_settings(mps_dirs)) as (daemon, _):
            assert daemon.mps is not None and daemon.mps.pid is not None  # started before the kubelet heard of us
            pid = daemon.mps.pid
            assert alive(pid) and starts(mps_dirs)[0]["pid"] == pid
            assert starts(mps_dirs)[0]["env"] == {
                "CUDA_VISIBLE_DEVICES": f"{GPU0},{GPU1}",
                "CUDA_MPS_PIPE_DIRECTORY": str(mps_dirs / "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": str(mps_dirs / "log"),
            }
            assert commands(mps_dirs, pid) == DEFAULTS
            assert {u: daemon.probe.compute_mode(u) for u in (GPU0, GPU1)} == dict.fromkeys(
                (GPU0, GPU1), ComputeMode.EXCLUSIVE_PROCESS
            )
            assert health(daemon) == BOTH_HEALTHY
            return pid

    pid = run(scenario())
    assert commands(mps_dirs, pid)[-1] == "quit" and not alive(pid)
    assert not (mps_dirs / "pipe" / "nvidia-cuda-mps-control.pid").exists()
    assert kube.node_events == []


def test_a_killed_daemon_is_restarted_and_its_gpus_are_unhealthy_until_it_runs_again(
    tmp_path: Path, mps_dirs: Path
) -> None:
    kube = FakeKube()

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), **mps_settings(mps_dirs)) as (daemon, _):
            assert daemon.mps is not None
            first = daemon.mps.pid
            assert first is not None
            (mps_dirs / "pipe" / "fake-fail-start").write_text("no GPU for MPS")  # it stays down a while
            os.kill(first, signal.SIGKILL)
            # Each start runs the stand-in control program (a Python process): slow on a loaded machine.
            await until(lambda: set(health(daemon).values()) == {Health.UNHEALTHY}, timeout=STARTS)
            await until(lambda: errors(daemon) >= 3, timeout=STARTS)  # the death, then two starts that failed
            assert set(health(daemon).values()) == {Health.UNHEALTHY}
            (mps_dirs / "pipe" / "fake-fail-start").unlink()
            await until(lambda: daemon.mps is not None and daemon.mps.pid not in (None, first), timeout=STARTS)
            await until(lambda: health(daemon) == BOTH_HEALTHY, timeout=STARTS)
            second = daemon.mps.pid
            assert second is not None and alive(second)
            assert commands(mps_dirs, second) == DEFAULTS  # sent again: the defaults die with the daemon

    run(scenario())
    unhealthy = [m for _, reason, m, warning in kube.node_events if reason == "GpuUnhealthy" and warning]
    # Once each way per GPU: no GPU came back while the daemon could not run.
    assert len(unhealthy) == 2 and all("the MPS control daemon" in m and "exited" in m for m in unhealthy)
    assert [e[1] for e in kube.node_events].count("GpuHealthy") == 2


def test_a_daemon_that_cannot_start_keeps_its_gpus_out_of_service_with_the_reason(
    tmp_path: Path, mps_dirs: Path
) -> None:
    kube = FakeKube()
    (mps_dirs / "pipe").mkdir()
    (mps_dirs / "pipe" / "fake-fail-start").write_text("MPS is not supported on this GPU")

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), **mps_settings(mps_dirs)) as (daemon, _):
            # Faulted before the kubelet first listed the slices: never advertised healthy.
            assert set(health(daemon).values()) == {Health.UNHEALTHY}
            assert daemon.mps is not None and daemon.mps.pid is None
            problem = daemon.mps.problem(GPU0)
            assert problem is not None and "MPS is not supported on this GPU" in problem
            (mps_dirs / "pipe" / "fake-fail-start").unlink()
            await until(lambda: health(daemon) == BOTH_HEALTHY)
            assert daemon.mps.pid is not None and alive(daemon.mps.pid)

    run(scenario())
    (first, *_) = [m for _, reason, m, _ in kube.node_events if reason == "GpuUnhealthy"]
    assert "did not start" in first and "MPS is not supported on this GPU" in first


def test_a_gpu_whose_compute_mode_cannot_be_made_exclusive_is_unhealthy_the_others_serve(
    tmp_path: Path, mps_dirs: Path
) -> None:
    kube = FakeKube()
    path = gpu_file(tmp_path / "gpus.yaml")
    doc = yaml.safe_load(path.read_text())
    doc["gpus"][0] |= {"computeModeFixed": "Insufficient Permissions", "computeMode": "Exclusive_Process"}
    doc["gpus"][1] |= {"computeModeFixed": "Insufficient Permissions"}  # and left in Default
    path.write_text(yaml.safe_dump(doc))

    async def scenario() -> None:
        async with plugin(tmp_path, kube, path, **mps_settings(mps_dirs)) as (daemon, _):
            assert health(daemon) == {GPU0: Health.HEALTHY, GPU1: Health.UNHEALTHY}
            assert daemon.mps is not None and daemon.mps.pid is not None  # GPU0 is served
            problem = daemon.mps.problem(GPU1)
            assert problem is not None and "Insufficient Permissions" in problem and "it is Default" in problem

    run(scenario())
    assert [(e[1], GPU1 in e[2]) for e in kube.node_events] == [("GpuUnhealthy", True)]


def ceiling_sent(root: Path, pid: int) -> list[str]:
    """The ceiling commands daemon ``pid`` received, the server list queries left out."""
    return [c for c in commands(root, pid) if "_percentage" in c or "pinned_mem" in c][len(DEFAULTS) :]


def test_the_ceiling_follows_the_grants_raised_before_allocate_answers_and_lowered_when_a_pod_goes(
    tmp_path: Path, mps_dirs: Path
) -> None:
    """A tenant that edits its own variables gets at most the ceiling: at start the node's grants set it
    (on the running server too), an Allocate raises it before its answer, and a pod's end lowers it."""
    small = make_pod("small", alloc=allocation("pending"))
    small["metadata"]["annotations"][ALLOC] = allocation(uid_of(small), gpus=[grant(GPU0, tflops=A100_TFLOPS // 4)])
    big = make_pod("big", alloc=allocation("pending"))
    wide = grant(GPU1, tflops=A100_TFLOPS * 9 // 10, vram=8 * GIB)
    big["metadata"]["annotations"][ALLOC] = allocation(uid_of(big), gpus=[wide])
    kube = FakeKube([small])
    (mps_dirs / "pipe").mkdir(parents=True)
    (mps_dirs / "pipe" / "fake-servers").write_text("4242\n")

    async def scenario() -> None:
        settings = mps_settings(mps_dirs) | {"health_check_interval": 0.05}
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), **settings) as (daemon, kubelet):
            assert daemon.mps is not None and daemon.mps.pid is not None
            pid = daemon.mps.pid
            await until(lambda: daemon.mps is not None and daemon.mps.held == Ceiling(25, (4096, 81920)))
            assert ceiling_sent(mps_dirs, pid) == list(ceiling_commands(Ceiling(25, (4096, 81920)), (4242,)))

            await kubelet.allocate(slice_id(GPU0, 0), pod="small")
            assert daemon.mps.held == Ceiling(25, (4096, 81920))  # within the ceiling: nothing sent
            assert len(ceiling_sent(mps_dirs, pid)) == 6

            # The big pod arrives; its Allocate raises the ceiling before the answer goes back.
            kube.put(big)
            await kubelet.allocate(slice_id(GPU1, 0), pod="big")
            assert daemon.mps.held == Ceiling(90, (4096, 8192))
            assert ceiling_sent(mps_dirs, pid)[-6:] == list(ceiling_commands(Ceiling(90, (4096, 8192)), (4242,)))

            # It goes: the next look lowers the ceiling to what is left.
            kube.delete(uid_of(big))
            await until(lambda: daemon.mps is not None and daemon.mps.held == Ceiling(25, (4096, 81920)), 10)
            assert ceiling_sent(mps_dirs, pid)[-6:] == list(ceiling_commands(Ceiling(25, (4096, 81920)), (4242,)))

    run(scenario())
