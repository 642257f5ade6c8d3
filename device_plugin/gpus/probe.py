"""The seam between the device plugin and the GPUs it manages: what a GPU is, and how it is probed.

Everything above this module (slices, health, inventory, metrics) talks to a :class:`GpuProbe`, so
the same plugin runs on real NVML (:mod:`device_plugin.gpus.nvml_backend`, the one module that imports
pynvml) and on a file-described fake (:mod:`device_plugin.gpus.fake_probe`) in tests, the demo and the
end-to-end tier, where no GPU exists. The values are plain frozen dataclasses; probes block, so
callers run them in a thread, never on the gRPC event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class ProbeError(RuntimeError):
    """The probe cannot reach the GPUs at all (no driver, no device nodes); the message says what to check."""


class ComputeMode(StrEnum):
    """A GPU's compute mode, as nvidia-smi names it: who may hold a CUDA context on it. MPS wants
    ``EXCLUSIVE_PROCESS``: then only the MPS server holds one, and a process that bypasses MPS gets none."""

    DEFAULT = "Default"
    EXCLUSIVE_PROCESS = "Exclusive_Process"
    PROHIBITED = "Prohibited"


@dataclass(frozen=True, slots=True, kw_only=True)
class MigUnit:
    """One MIG instance of a GPU in MIG mode: its UUID, memory (bytes) and compute slices."""

    uuid: str
    memory: int
    slices: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuDevice:
    """One physical GPU as the driver reports it. ``memory`` in bytes; ``name`` is NVML's product name.

    In MIG mode (``mig``), ``units`` are its instances and ``mig_slices`` its compute slices in all
    (7 on an A100 or H100, 4 on an A30): a unit's share of the GPU is its slices over these.
    """

    uuid: str
    index: int
    name: str
    memory: int
    numa: int | None = None
    mig: bool = False
    mig_slices: int = 7
    units: tuple[MigUnit, ...] = ()


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical-error event from the driver: XID ``xid`` on GPU ``uuid``."""

    uuid: str
    xid: int


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process's use of a GPU: its SM share (percent of the GPU's time, averaged over the driver's
    samples since the timestamp asked for) and the device memory (bytes) it holds now."""

    pid: int
    sm_percent: int
    memory_used: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessReport:
    """Every process using one GPU, since a timestamp (microseconds, the driver's clock).

    ``until_us`` is the newest sample's time: the ``since_us`` of the next call. Where the driver has no
    per-process utilisation (an older driver or GPU, a MIG instance), ``sm_supported`` is False and every
    ``sm_percent`` is 0: memory only."""

    processes: tuple[ProcessSample, ...]
    until_us: int
    sm_supported: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSample:
    """Live figures for one GPU; ``None`` where the driver does not report them."""

    uuid: str
    utilization: int | None = None  # percent of time a kernel ran
    memory_used: int | None = None  # bytes
    temperature: int | None = None  # degrees Celsius
    power_watts: float | None = None


class GpuProbe(Protocol):
    """What the plugin needs from a GPU driver. Every method may block."""

    def devices(self) -> tuple[GpuDevice, ...]:
        """Every GPU on this node, in index order."""
        ...

    def wait_xid(self, timeout_s: float) -> tuple[XidEvent, ...]:
        """Block up to ``timeout_s`` for critical-error events; an empty tuple when none came."""
        ...

    def check(self, uuid: str) -> str | None:
        """A periodic health check of one GPU: ``None`` when healthy, else what is wrong."""
        ...

    def sample(self, uuid: str) -> GpuSample:
        """Utilisation, memory, temperature and power of one GPU, for metrics."""
        ...

    def processes(self, uuid: str, since_us: int) -> ProcessReport:
        """Each process on one GPU: its SM share since ``since_us`` and the memory it holds now."""
        ...

    def compute_mode(self, uuid: str) -> ComputeMode:
        """One GPU's compute mode now."""
        ...

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        """Set one GPU's compute mode (root only); raises, saying why, when the driver refuses."""
        ...

    def close(self) -> None:
        """Release driver resources."""
        ...
