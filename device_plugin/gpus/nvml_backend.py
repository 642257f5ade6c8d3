"""The real GPU probe over NVML: the one module of the device plugin that imports pynvml.

Keeping NVML behind :class:`~device_plugin.gpus.probe.GpuProbe` means every other module is tested
without a GPU, and a driver quirk is handled in one place: optional queries (NUMA node, MIG mode,
power, temperature) degrade to ``None`` instead of failing discovery, XID events come from a
blocking ``nvmlEventSetWait`` that the caller runs in a thread, and a driver without per-process
utilisation (``NOT_SUPPORTED``: older drivers and GPUs, MIG instances) still gives each process's memory.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pynvml

from device_plugin.gpus.probe import (
    ComputeMode,
    GpuDevice,
    GpuSample,
    MigUnit,
    ProbeError,
    ProcessReport,
    ProcessSample,
    XidEvent,
)

log = logging.getLogger(__name__)
_SYS_PCI = Path("/sys/bus/pci/devices")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(query: Any, *args: Any) -> Any:
    """The value of an NVML query, or None when the GPU or driver does not support it."""
    try:
        return query(*args)
    except pynvml.NVMLError:
        return None


# GPU-instance profiles from the largest: the first one the GPU supports spans all its compute slices.
_WHOLE_GPU_PROFILES = (
    "NVML_GPU_INSTANCE_PROFILE_8_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_6_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE",
)


def _mig_slices(handle: Any) -> int:
    """The compute slices of a GPU in MIG mode in all (7 on an A100/H100, 4 on an A30)."""
    for name in _WHOLE_GPU_PROFILES:
        profile = getattr(pynvml, name, None)
        info = None if profile is None else _optional(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile)
        if info is not None and int(info.sliceCount) > 0:
            return int(info.sliceCount)
    return 7


def _nvml_modes() -> dict[ComputeMode, int]:
    return {
        ComputeMode.DEFAULT: pynvml.NVML_COMPUTEMODE_DEFAULT,
        ComputeMode.EXCLUSIVE_PROCESS: pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        ComputeMode.PROHIBITED: pynvml.NVML_COMPUTEMODE_PROHIBITED,
    }


def _mig_units(handle: Any) -> tuple[MigUnit, ...]:
    """The MIG instances of a GPU in MIG mode, as the driver lists them now."""
    units = []
    for i in range(int(_optional(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0)):
        unit = _optional(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
        if unit is None:  # no instance at this index
            continue
        attributes = pynvml.nvmlDeviceGetAttributes(unit)
        units.append(
            MigUnit(
                uuid=_text(pynvml.nvmlDeviceGetUUID(unit)),
                memory=int(pynvml.nvmlDeviceGetMemoryInfo(unit).total),
                slices=int(attributes.gpuInstanceSliceCount),
            )
        )
    return tuple(units)


class NvmlProbe:
    """A :class:`~device_plugin.gpus.probe.GpuProbe` over the NVIDIA driver."""

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise ProbeError(
                f"cannot initialise NVML ({exc}): is the NVIDIA driver loaded and are the GPUs visible here?"
            ) from exc
        self._lock = threading.Lock()
        self._events: Any = None

    def devices(self) -> tuple[GpuDevice, ...]:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            mode = _optional(pynvml.nvmlDeviceGetMigMode, handle)
            mig = mode is not None and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            found.append(
                GpuDevice(
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    numa=self._numa(handle),
                    mig=mig,
                    mig_slices=_mig_slices(handle) if mig else 7,
                    units=_mig_units(handle) if mig else (),
                )
            )
        return tuple(found)

    def _numa(self, handle: Any) -> int | None:
        node = _optional(pynvml.nvmlDeviceGetNumaNodeId, handle)
        if node is not None and node >= 0:
            return int(node)
        pci = _optional(pynvml.nvmlDeviceGetPciInfo, handle)
        if pci is None:
            return None
        bus_id = _text(pci.busId).lower()[-12:]  # NVML pads the domain to 8 digits; sysfs uses 4
        try:
            value = int((_SYS_PCI / bus_id / "numa_node").read_text().strip())
        except (OSError, ValueError):
            return None
        return value if value >= 0 else None

    def _event_set(self) -> Any:
        """Register every GPU for critical XID events once; GPUs that refuse are logged, not fatal."""
        if self._events is None:
            self._events = pynvml.nvmlEventSetCreate()
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                try:
                    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
                except pynvml.NVMLError as exc:
                    log.warning("GPU %d does not report XID events (%s); only periodic checks apply", index, exc)
        return self._events

    def wait_xid(self, timeout_s: float) -> tuple[XidEvent, ...]:
        with self._lock:
            events = self._event_set()
        try:
            data = pynvml.nvmlEventSetWait_v2(events, int(timeout_s * 1000))
        except pynvml.NVMLError_Timeout:
            return ()
        uuid = _optional(pynvml.nvmlDeviceGetUUID, data.device)
        return (XidEvent(uuid=_text(uuid) if uuid is not None else "", xid=int(data.eventData)),)

    def check(self, uuid: str) -> str | None:
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
            pynvml.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as exc:
            return f"NVML: {exc}"
        return None

    def sample(self, uuid: str) -> GpuSample:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
        util = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
        memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
        power = _optional(pynvml.nvmlDeviceGetPowerUsage, handle)
        return GpuSample(
            uuid=uuid,
            utilization=None if util is None else int(util.gpu),
            memory_used=None if memory is None else int(memory.used),
            temperature=_optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            power_watts=None if power is None else power / 1000.0,
        )

    def processes(self, uuid: str, since_us: int) -> ProcessReport:
        """Memory from the running compute processes, SM share from the driver's utilisation samples
        since ``since_us`` (several per process: averaged). A process with samples but no longer running
        is listed too: its use was real, and mapping it then tells that it exited."""
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
        memory = {int(p.pid): int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        supported, samples = True, []
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
                supported = False
            elif exc.value not in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS):  # no sample since then
                raise
        shares: dict[int, list[int]] = {}
        until = since_us
        for sample in samples:
            shares.setdefault(int(sample.pid), []).append(min(100, int(sample.smUtil)))
            until = max(until, int(sample.timeStamp))
        return ProcessReport(
            processes=tuple(
                ProcessSample(
                    pid=pid,
                    sm_percent=round(sum(s) / len(s)) if (s := shares.get(pid)) else 0,
                    memory_used=memory.get(pid, 0),
                )
                for pid in sorted(memory.keys() | shares.keys())
            ),
            until_us=until,
            sm_supported=supported,
        )

    def compute_mode(self, uuid: str) -> ComputeMode:
        raw = int(pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())))
        # EXCLUSIVE_THREAD (1) is deprecated: the driver reports it as exclusive-process.
        return next((mode for mode, value in _nvml_modes().items() if value == raw), ComputeMode.EXCLUSIVE_PROCESS)

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid.encode()), _nvml_modes()[mode])

    def close(self) -> None:
        with self._lock:
            if self._events is not None:
                _optional(pynvml.nvmlEventSetFree, self._events)
                self._events = None
        _optional(pynvml.nvmlShutdown)
