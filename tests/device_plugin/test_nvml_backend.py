"""The NVML probe against a fake ``pynvml`` (every call the backend makes, with the real error classes
and constants), and, where a real NVIDIA GPU and driver exist, ``tf-device-plugin --probe`` on it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from device_plugin.gpus import nvml_backend
from device_plugin.gpus.board import DeviceBoard, HealthMonitor, discover
from device_plugin.gpus.health import HealthPolicy
from device_plugin.gpus.nvml_backend import NvmlProbe
from device_plugin.gpus.probe import GpuDevice, GpuSample, MigUnit, ProbeError, ProcessReport, ProcessSample, XidEvent
from device_plugin.main import main
from tests.device_plugin.harness import run
from vgpu.catalog import builtin

MIB = 1024 * 1024
UUIDS = [f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-0000-0000-0000-00000000h100" for i in range(4)]


def unsupported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


@dataclass
class Gpu:
    """One fake GPU; ``None`` for a query means the driver answers NOT_SUPPORTED."""

    uuid: str
    name: str | bytes = "NVIDIA H100 80GB HBM3"
    total: int = 81559 * MIB
    numa: int | None = None
    bus_id: bytes = b"00000000:18:00.0"
    mig: list[int] | None = field(default_factory=lambda: [0, 0])
    xid_events: bool = True
    utilization: int | None = None
    used: int | None = None
    temperature: int | None = None
    milliwatts: int | None = None
    processes: list[Any] | None = None
    samples: list[Any] | None = None  # per-process utilisation samples; None: an older driver (NOT_SUPPORTED)
    lost: bool = False
    units: list[Mig | None] | None = None  # MIG instances by index (None: no instance there); None: no MIG
    profiles: dict[int, int] = field(default_factory=dict)  # GPU-instance profile -> its slice count


@dataclass
class Mig:
    """One fake MIG instance."""

    uuid: str
    total: int
    slices: int


class FakeNvml:
    """Stands in for the ``pynvml`` module: the functions the backend calls, nothing else."""

    NVMLError = pynvml.NVMLError
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    NVML_GPU_INSTANCE_PROFILE_7_SLICE = pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE
    NVML_GPU_INSTANCE_PROFILE_4_SLICE = pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE

    def __init__(self, gpus: list[Gpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = False
        self.event_sets: list[list[Gpu]] = []  # each created set: the GPUs registered in it
        self.freed: list[int] = []
        self.pending: list[tuple[Any, int]] = []  # (device handle, XID) delivered by the next wait
        self.wait_error: int | None = None
        self.waits: list[int] = []  # timeouts (ms) the backend waited with
        self.since: list[int] = []  # timestamps the backend asked utilisation samples since

    def _gpu(self, handle: Any) -> Gpu:
        assert self.initialised, "NVML called before nvmlInit"
        if not isinstance(handle, Gpu):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if handle.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle

    def _query(self, handle: Any, value: Callable[[Gpu], Any]) -> Any:
        result = value(self._gpu(handle))
        if result is None:
            raise unsupported()
        return result

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        assert self.initialised
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Gpu:
        assert self.initialised
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Gpu:
        assert self.initialised
        text = uuid.decode() if isinstance(uuid, bytes) else uuid  # pynvml takes either
        found = next((g for g in self.gpus if g.uuid == text), None)
        if found is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return found

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return handle.uuid if isinstance(handle, Mig) else self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        if isinstance(handle, Mig):
            return SimpleNamespace(total=handle.total, used=0, free=handle.total)
        gpu = self._gpu(handle)
        return SimpleNamespace(total=gpu.total, used=gpu.used if gpu.used is not None else 0, free=0)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return len(self._query(handle, lambda g: g.units))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Mig:
        unit = (self._gpu(handle).units or [])[index]
        if unit is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return unit

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int) -> Any:
        return SimpleNamespace(sliceCount=self._query(handle, lambda g: g.profiles.get(profile)))

    def nvmlDeviceGetAttributes(self, handle: Mig) -> Any:
        return SimpleNamespace(gpuInstanceSliceCount=handle.slices)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return self._query(handle, lambda g: g.mig)  # type: ignore[no-any-return]

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return self._query(handle, lambda g: g.numa)  # type: ignore[no-any-return]

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return SimpleNamespace(busId=self._gpu(handle).bus_id)

    def nvmlEventSetCreate(self) -> int:
        self.event_sets.append([])
        return len(self.event_sets) - 1

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: int) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        gpu = self._gpu(handle)
        if not gpu.xid_events:
            raise unsupported()
        self.event_sets[event_set].append(gpu)

    def nvmlEventSetWait_v2(self, event_set: int, timeout_ms: int) -> Any:
        assert event_set not in self.freed
        self.waits.append(timeout_ms)
        if self.wait_error is not None:
            raise pynvml.NVMLError(self.wait_error)
        if not self.pending:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        device, xid = self.pending.pop(0)
        return SimpleNamespace(device=device, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid)

    def nvmlEventSetFree(self, event_set: int) -> None:
        self.freed.append(event_set)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return SimpleNamespace(gpu=self._query(handle, lambda g: g.utilization), memory=0)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._query(handle, lambda g: g.milliwatts)  # type: ignore[no-any-return]

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._query(handle, lambda g: g.temperature)  # type: ignore[no-any-return]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._query(handle, lambda g: g.processes)  # type: ignore[no-any-return]

    def nvmlDeviceGetProcessUtilization(self, handle: Any, time_stamp: int) -> list[Any]:
        """The samples newer than ``time_stamp``; NOT_FOUND when there is none (the driver's answer)."""
        self.since.append(time_stamp)
        newer = [s for s in self._query(handle, lambda g: g.samples) if s.timeStamp > time_stamp]
        if not newer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return newer


def util(pid: int, at: int, sm: int) -> Any:
    """One per-process utilisation sample as pynvml returns it (c_nvmlProcessUtilizationSample_t)."""
    return SimpleNamespace(pid=pid, timeStamp=at, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake /sys/bus/pci/devices."""
    monkeypatch.setattr(nvml_backend, "_SYS_PCI", tmp_path)
    return tmp_path


def numa_file(sysfs: Path, bus: str, text: str) -> None:
    (sysfs / bus).mkdir()
    (sysfs / bus / "numa_node").write_text(text + "\n")


def fake(monkeypatch: pytest.MonkeyPatch, gpus: list[Gpu], **kw: Any) -> FakeNvml:
    nvml = FakeNvml(gpus, **kw)
    monkeypatch.setattr(nvml_backend, "pynvml", nvml)
    return nvml


def test_devices_with_numa_from_nvml_then_sysfs_and_mig_from_the_current_mode(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    gpus = [
        Gpu(UUIDS[0], numa=1, mig=[1, 1]),  # NVML knows its NUMA node; MIG on
        Gpu(UUIDS[1], name=b"NVIDIA A100-SXM4-80GB", bus_id=b"00000000:3B:00.0", mig=[0, 1]),  # MIG only pending
        Gpu(UUIDS[2], numa=-1, bus_id=b"00000000:86:00.0", mig=None),  # -1 from NVML and sysfs; no MIG support
        Gpu(UUIDS[3], bus_id=b"00000000:AF:00.0"),  # nothing in sysfs either
    ]
    numa_file(sysfs, "0000:3b:00.0", "0")  # sysfs spells the domain with 4 digits, lower case
    numa_file(sysfs, "0000:86:00.0", "-1")
    nvml = fake(monkeypatch, gpus)
    probe = NvmlProbe()
    assert nvml.initialised
    assert probe.devices() == (
        GpuDevice(uuid=UUIDS[0], index=0, name="NVIDIA H100 80GB HBM3", memory=81559 * MIB, numa=1, mig=True),
        GpuDevice(uuid=UUIDS[1], index=1, name="NVIDIA A100-SXM4-80GB", memory=81559 * MIB, numa=0, mig=False),
        GpuDevice(uuid=UUIDS[2], index=2, name="NVIDIA H100 80GB HBM3", memory=81559 * MIB, numa=None, mig=False),
        GpuDevice(uuid=UUIDS[3], index=3, name="NVIDIA H100 80GB HBM3", memory=81559 * MIB, numa=None, mig=False),
    )
    models = [(g.model, g.tflops) for g in discover(probe.devices(), builtin(), 0)]
    assert models[1] == ("A100-SXM4-80GB", 312_000)  # the NVML name (bytes from old bindings) hits the catalog
    probe.close()
    assert not nvml.initialised


def test_a_gpu_in_mig_mode_lists_its_instances_sized_by_their_slices(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    one, two = Mig("MIG-aaaaaaaa-0000-0000-0000-000000000000", 9984 * MIB, 1), Mig("MIG-bb", 20096 * MIB, 2)
    seven = pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE
    gpus = [
        Gpu(UUIDS[0], mig=[1, 1], units=[one, None, two], profiles={seven: 7}),
        Gpu(UUIDS[1], mig=[1, 1], units=[], profiles={pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: 4}),  # an A30
        Gpu(UUIDS[2], mig=[0, 0], units=[one]),  # MIG off: whatever the driver lists is not looked at
    ]
    fake(monkeypatch, gpus)
    devices = NvmlProbe().devices()
    assert devices[0].units == (
        MigUnit(uuid=one.uuid, memory=9984 * MIB, slices=1),
        MigUnit(uuid="MIG-bb", memory=20096 * MIB, slices=2),
    )
    assert (devices[0].mig_slices, devices[1].mig_slices, devices[1].units) == (7, 4, ())
    assert devices[2].units == ()
    published = discover(devices, builtin(), 0)
    units = [(g.uuid, g.model, g.tflops, g.parent) for g in published if g.parent]
    assert units == [
        (one.uuid, "H100 SXM5 MIG 1g.10gb", 989_000 // 7, UUIDS[0]),
        ("MIG-bb", "H100 SXM5 MIG 2g.20gb", 989_000 * 2 // 7, UUIDS[0]),
    ]


def test_wait_xid_times_out_empty_and_reports_events_by_gpu(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gpus = [Gpu(UUIDS[0]), Gpu(UUIDS[1], xid_events=False), Gpu(UUIDS[2])]
    nvml = fake(monkeypatch, gpus)
    probe = NvmlProbe()
    with caplog.at_level(logging.WARNING):
        assert probe.wait_xid(0.25) == ()
    assert nvml.waits == [250]
    assert nvml.event_sets == [[gpus[0], gpus[2]]]  # GPU 1 refused: logged, not fatal
    assert "GPU 1 does not report XID events" in caplog.text
    nvml.pending = [(gpus[2], 79)]
    assert probe.wait_xid(1) == (XidEvent(UUIDS[2], 79),)
    gpus[2].lost = True  # the driver cannot name the GPU: an empty UUID, which faults every GPU
    nvml.pending = [(gpus[2], 48)]
    assert probe.wait_xid(1) == (XidEvent("", 48),)
    assert len(nvml.event_sets) == 1, "the event set is created once"
    probe.close()
    assert nvml.freed == [0] and not nvml.initialised


def test_health_check_reports_a_lost_or_missing_gpu(monkeypatch: pytest.MonkeyPatch, sysfs: Path) -> None:
    gpus = [Gpu(UUIDS[0]), Gpu(UUIDS[1], lost=True)]
    fake(monkeypatch, gpus)
    probe = NvmlProbe()
    assert probe.check(UUIDS[0]) is None
    assert probe.check(UUIDS[1]) == "NVML: GPU is lost"
    assert probe.check(UUIDS[3]) == "NVML: Not Found"


def test_sample_reports_what_the_driver_supports_and_none_for_the_rest(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    full = Gpu(UUIDS[0], utilization=35, used=2048 * MIB, temperature=41, milliwatts=88_500)
    bare = Gpu(UUIDS[1])  # utilisation, temperature and power: NOT_SUPPORTED
    fake(monkeypatch, [full, bare])
    probe = NvmlProbe()
    assert probe.sample(UUIDS[0]) == GpuSample(
        uuid=UUIDS[0], utilization=35, memory_used=2048 * MIB, temperature=41, power_watts=88.5
    )
    assert probe.sample(UUIDS[1]) == GpuSample(uuid=UUIDS[1], memory_used=0)


def test_processes_average_each_pids_samples_since_the_timestamp_and_keep_the_newest_for_next_time(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    running = [SimpleNamespace(pid=4242, usedGpuMemory=1024 * MIB), SimpleNamespace(pid=4343, usedGpuMemory=None)]
    samples = [util(4242, 100, 30), util(4242, 200, 50), util(4545, 150, 10), util(4242, 50, 99)]
    gpu = Gpu(UUIDS[0], processes=running, samples=samples)
    nvml = fake(monkeypatch, [gpu])
    probe = NvmlProbe()
    assert probe.processes(UUIDS[0], 60) == ProcessReport(
        processes=(
            ProcessSample(4242, 40, 1024 * MIB),  # (30 + 50) / 2; the sample at 50 is older than asked
            ProcessSample(4343, 0, 0),  # running, idle since then; no memory figure (MIG, WDDM): 0
            ProcessSample(4545, 10, 0),  # exited since its sample: its use was real, mapping tells it is gone
        ),
        until_us=200,
    )
    gpu.samples.append(util(4343, 300, 250))  # a driver's nonsense above 100 %
    assert probe.processes(UUIDS[0], 200) == ProcessReport(
        processes=(ProcessSample(4242, 0, 1024 * MIB), ProcessSample(4343, 100, 0)), until_us=300
    )
    # Nothing new since the last sample: NOT_FOUND from the driver, every process idle, the timestamp kept.
    assert probe.processes(UUIDS[0], 300) == ProcessReport(
        processes=(ProcessSample(4242, 0, 1024 * MIB), ProcessSample(4343, 0, 0)), until_us=300
    )
    assert nvml.since == [60, 200, 300]


def test_processes_without_per_process_utilisation_are_memory_only_and_a_failing_gpu_raises(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    running = [SimpleNamespace(pid=4242, usedGpuMemory=1024 * MIB)]
    old = Gpu(UUIDS[0], processes=running)  # an older driver: per-process utilisation NOT_SUPPORTED
    lost = Gpu(UUIDS[1], processes=running, samples=[], lost=True)
    listless = Gpu(UUIDS[2])  # not even the process list
    fake(monkeypatch, [old, lost, listless])
    probe = NvmlProbe()
    assert probe.processes(UUIDS[0], 7) == ProcessReport(
        processes=(ProcessSample(4242, 0, 1024 * MIB),), until_us=7, sm_supported=False
    )
    with pytest.raises(pynvml.NVMLError, match="GPU is lost"):
        probe.processes(UUIDS[1], 0)
    with pytest.raises(pynvml.NVMLError, match="Not Supported"):
        probe.processes(UUIDS[2], 0)


def test_without_a_driver_the_probe_says_what_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, [], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(ProbeError, match=r"cannot initialise NVML .*NVIDIA driver"):
        NvmlProbe()
    with pytest.raises(SystemExit, match="tf-device-plugin: cannot initialise NVML"):
        main(["--probe"])


def test_a_broken_event_wait_does_not_stop_the_periodic_checks(monkeypatch: pytest.MonkeyPatch, sysfs: Path) -> None:
    gpus = [Gpu(UUIDS[0]), Gpu(UUIDS[1])]
    nvml = fake(monkeypatch, gpus)
    nvml.wait_error = pynvml.NVML_ERROR_UNKNOWN
    probe = NvmlProbe()

    async def scenario() -> None:
        board = DeviceBoard(discover(probe.devices(), builtin(), 0), 1, HealthPolicy())
        monitor = asyncio.create_task(HealthMonitor(probe, board, check_interval_s=0.02).run())
        await asyncio.sleep(0.1)
        gpus[1].lost = True
        while board.health.healthy(UUIDS[1]):
            assert not monitor.done(), monitor
            await asyncio.sleep(0.01)
        assert board.health.states[UUIDS[1]].reason == "NVML: GPU is lost"
        assert board.health.healthy(UUIDS[0])
        assert len(nvml.waits) >= 2, "the monitor kept waiting for events after the failure"
        monitor.cancel()

    run(scenario(), timeout=10)


def test_probe_prints_what_nvml_finds(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = [
        Gpu(UUIDS[0], numa=0, utilization=7, used=MIB, temperature=30, milliwatts=70_000, processes=[], samples=[]),
        Gpu(UUIDS[1], name="Mystery GPU", processes=[]),  # an older driver: no per-process utilisation
        Gpu(UUIDS[2]),  # nor a process list
    ]
    nvml = fake(monkeypatch, gpus)
    assert main(["--probe", "--default-tflops", "5"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "3 GPU(s) found",
        f"GPU 0  {UUIDS[0]}  NVIDIA H100 80GB HBM3",
        "  published as H100 SXM5: 989 TFLOPS, 79.6Gi VRAM, NUMA node 0, MIG off",
        "  health check: ok",
        "  now: utilization 7%, memory used 1Mi, temperature 30 °C, power 70.0 W, compute processes 0",
        f"GPU 1  {UUIDS[1]}  Mystery GPU",
        "  published as 'Mystery GPU' (not in the GPU catalog): 5 TFLOPS, 79.6Gi VRAM, NUMA node unknown, MIG off",
        "  health check: ok",
        "  now: utilization n/a, memory used 0B, temperature n/a, power n/a, compute processes 0 "
        "(memory only: no per-process utilisation)",
        f"GPU 2  {UUIDS[2]}  NVIDIA H100 80GB HBM3",
        "  published as H100 SXM5: 989 TFLOPS, 79.6Gi VRAM, NUMA node unknown, MIG off",
        "  health check: ok",
        "  now: utilization n/a, memory used 0B, temperature n/a, power n/a, compute processes n/a (Not Supported)",
    ]
    assert not nvml.initialised, "the probe shut NVML down"


def _real_nvml() -> str | None:
    """Why the real NVML cannot be used here, or None when it can."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"no NVIDIA driver/GPU: {exc}"
    try:
        return None if pynvml.nvmlDeviceGetCount() > 0 else "NVML sees no GPU"
    finally:
        pynvml.nvmlShutdown()


NO_GPU = _real_nvml()


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))
def test_probe_on_a_real_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    """``tf-device-plugin --probe`` on this machine's GPUs: the operator's first check on a node."""
    assert main(["--probe"]) == 0
    out = capsys.readouterr().out
    print(out)  # shown with -s: what this node would publish
    probe = NvmlProbe()
    try:
        devices = probe.devices()
        assert out.startswith(f"{len(devices)} GPU(s) found\n")
        for d in devices:
            assert d.uuid.startswith(("GPU-", "MIG-")) and d.name and d.memory > 0
            assert f"GPU {d.index}  {d.uuid}  {d.name}" in out
            assert probe.check(d.uuid) is None, f"GPU {d.index} fails its health check"
            assert probe.sample(d.uuid).memory_used is not None
        assert probe.wait_xid(0.1) == ()  # a healthy idle node has no critical XID within 100 ms
    finally:
        probe.close()
