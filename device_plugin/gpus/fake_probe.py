"""A GPU probe described by a YAML/JSON file, for tests, the demo and the end-to-end tier (no GPU).

The file is re-read whenever it changes, so a test or an operator injects faults by rewriting it
(``events``: XIDs delivered once; ``fail``: a failing health check; ``computeModeFixed``: a compute mode the
driver refuses to change, with why). It scripts GPU use too: each
``usage`` entry is one process of a pod's container on a GPU, with a synthetic PID
(``FAKE_PID_BASE`` + its position) that the probe, as a
:class:`~device_plugin.usage.process_owner.ProcessResolver`, maps to that pod and container, so the
whole usage loop runs without a GPU. The file format and the usage profiles (constant, ramp, step):
docs/design-notes.md, section ``device_plugin/gpus/fake_probe.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from device_plugin.gpus.probe import (
    ComputeMode,
    GpuDevice,
    GpuSample,
    MigUnit,
    ProcessReport,
    ProcessSample,
    XidEvent,
)
from device_plugin.usage.process_kill import KillRefused
from device_plugin.usage.process_owner import ProcessOwner

MIB = 1024 * 1024
FAKE_PID_BASE: Final = 5_000_000  # above Linux's largest PID (2**22): a scripted process is never a real one
_POLL_S = 0.05
_PROFILES = (
    "a number, {constant: N}, {ramp: {from: N, to: N, seconds: S}} or {step: {before: N, after: N, atSeconds: S}}"
)
_USAGE_KEYS = frozenset({"pod", "container", "gpu", "smPercent", "vramMiB"})


class FakeProbeError(ValueError):
    """The fake GPU file is malformed; the message names the entry and field."""


@dataclass(frozen=True, slots=True)
class Profile:
    """A scripted figure over the seconds since the file was written: ``start`` until ``at``, then
    linearly to ``end`` over ``seconds`` (0: at once), then ``end``."""

    start: float
    end: float
    at: float = 0.0
    seconds: float = 0.0

    def value(self, elapsed: float) -> float:
        if elapsed < self.at:
            return self.start
        if elapsed >= self.at + self.seconds:
            return self.end
        return self.start + (self.end - self.start) * (elapsed - self.at) / self.seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class Scripted:
    """One ``usage`` entry: a process of ``container`` in ``pod`` on GPU ``gpu`` (a UUID)."""

    pid: int
    pod: str
    container: str
    gpu: str
    sm_percent: Profile
    vram_mib: Profile

    @property
    def owner(self) -> ProcessOwner:
        return ProcessOwner(pod=self.pod, container=self.container)


class FakeProbe:
    """A :class:`~device_plugin.gpus.probe.GpuProbe` over a file, and the
    :class:`~device_plugin.usage.process_owner.ProcessResolver` of its scripted processes; thread-safe.
    ``clock`` is the wall clock the file's modification time is measured against."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._doc: Mapping[str, Any] = {}
        self._written = 0.0
        self._supported: dict[str, bool] = {}  # GPU or MIG UUID → per-process SM share reported
        self._by_gpu: dict[str, list[Scripted]] = {}
        self._by_pid: dict[int, Scripted] = {}
        self._delivered = 0
        self._modes: dict[str, ComputeMode] = {}  # compute modes set, as a driver keeps them (not in the file)
        self._refresh()
        self._delivered = len(self._events())  # events already in the file at start are history

    def devices(self) -> tuple[GpuDevice, ...]:
        with self._lock:
            self._refresh()
            return tuple(sorted((_device(g, i) for i, g in enumerate(self._gpus())), key=lambda d: d.index))

    def wait_xid(self, timeout_s: float) -> tuple[XidEvent, ...]:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                self._refresh()
                events = self._events()
                fresh = events[self._delivered :]
                self._delivered = len(events)
            if fresh or time.monotonic() >= deadline:
                return fresh
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    def check(self, uuid: str) -> str | None:
        with self._lock:
            self._refresh()
            for gpu in self._gpus():
                units = [u for u in gpu.get("migDevices") or () if u.get("uuid") == uuid]
                if gpu.get("uuid") == uuid or units:
                    fail = next((f for f in (*(u.get("fail") for u in units), gpu.get("fail")) if f), None)
                    return None if fail is None else str(fail)
        return "GPU is gone from the fake GPU file"

    def sample(self, uuid: str) -> GpuSample:
        with self._lock:
            self._refresh()
            gpu = next((g for g in self._gpus() if g.get("uuid") == uuid), {})
        used = gpu.get("memoryUsedMiB")
        return GpuSample(
            uuid=uuid,
            utilization=gpu.get("utilization"),
            memory_used=None if used is None else int(used) * MIB,
            temperature=gpu.get("temperature"),
            power_watts=None if gpu.get("powerWatts") is None else float(gpu["powerWatts"]),
        )

    def processes(self, uuid: str, since_us: int) -> ProcessReport:  # noqa: ARG002
        """The scripted processes on ``uuid``, their figures as the profiles give them now; the
        timestamp does not matter (a script has a value at every moment)."""
        with self._lock:
            self._refresh()
            supported = self._supported.get(uuid)
            scripted = tuple(self._by_gpu.get(uuid, ()))
            written = self._written
        if supported is None:
            raise FakeProbeError(f"GPU {uuid} is not in the fake GPU file")
        now = self._clock()
        return ProcessReport(
            processes=tuple(
                ProcessSample(
                    pid=p.pid,
                    sm_percent=round(p.sm_percent.value(now - written)) if supported else 0,
                    memory_used=round(p.vram_mib.value(now - written) * MIB),
                )
                for p in scripted
            ),
            until_us=int(now * 1_000_000),
            sm_supported=supported,
        )

    def owner(self, pid: int) -> ProcessOwner | None:
        """The pod and container a scripted process belongs to; None for any other PID, or one killed."""
        with self._lock:
            self._refresh()
            scripted = self._by_pid.get(pid)
        return None if scripted is None else scripted.owner

    def kill(self, pid: int, owner: ProcessOwner) -> bool:
        """A scripted process leaves the reports, as a killed one leaves the driver's list, until the file is
        written again; False for a PID that is not (or no longer) scripted. The
        :class:`~device_plugin.usage.process_kill.ProcessKiller` of the scripted processes."""
        with self._lock:
            self._refresh()
            scripted = self._by_pid.get(pid)
            if scripted is None:
                return False
            if scripted.owner != owner:
                raise KillRefused(f"process {pid} belongs to another container")
            del self._by_pid[pid]
            self._by_gpu[scripted.gpu].remove(scripted)
            return True

    def compute_mode(self, uuid: str) -> ComputeMode:
        """The mode last set, else the file's ``computeMode`` (nvidia-smi's names; default ``Default``)."""
        with self._lock:
            self._refresh()
            gpu = self._gpu(uuid)
            return self._modes.get(uuid) or ComputeMode(gpu.get("computeMode", ComputeMode.DEFAULT))

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        """Kept in memory, as the driver keeps it; a GPU with ``computeModeFixed`` refuses with that text."""
        with self._lock:
            self._refresh()
            fixed = self._gpu(uuid).get("computeModeFixed")
            if fixed:
                raise FakeProbeError(str(fixed))
            self._modes[uuid] = mode

    def close(self) -> None:
        return None

    # --- file handling ----------------------------------------------------------------------------

    def _refresh(self) -> None:
        stat = self._path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        doc = yaml.safe_load(self._path.read_text(encoding="utf-8")) or {}
        if not isinstance(doc, Mapping) or not isinstance(doc.get("gpus", []), list):
            raise FakeProbeError(f"{self._path}: must be a mapping with a list 'gpus'")
        gpus = [g for g in doc.get("gpus") or [] if isinstance(g, Mapping)]  # others fail devices(), named
        supported = {}
        for gpu in gpus:
            for uuid in (gpu.get("uuid"), *(u.get("uuid") for u in gpu.get("migDevices") or ())):
                supported[str(uuid)] = bool(gpu.get("processUtilization", True))
        scripted = _usage(doc.get("usage") or [], gpus, supported.keys())
        self._doc, self._stamp, self._written, self._supported = doc, stamp, stat.st_mtime, supported
        self._by_pid = {p.pid: p for p in scripted}
        self._by_gpu = {}
        for p in scripted:
            self._by_gpu.setdefault(p.gpu, []).append(p)

    def _gpu(self, uuid: str) -> Mapping[str, Any]:
        gpu = next((g for g in self._gpus() if g.get("uuid") == uuid), None)
        if gpu is None:
            raise FakeProbeError(f"GPU {uuid} is not in the fake GPU file")
        return gpu

    def _gpus(self) -> list[Mapping[str, Any]]:
        gpus: list[Mapping[str, Any]] = self._doc.get("gpus") or []
        return gpus

    def _events(self) -> tuple[XidEvent, ...]:
        raw = self._doc.get("events") or []
        try:
            return tuple(XidEvent(str(e["uuid"]), int(e["xid"])) for e in raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise FakeProbeError(f"{self._path}: events: each needs uuid and xid ({exc})") from None


def _device(gpu: Mapping[str, Any], position: int) -> GpuDevice:
    where = f"gpus[{position}]"
    units = tuple(_unit(u, f"{where}.migDevices[{i}]") for i, u in enumerate(gpu.get("migDevices") or ()))
    try:
        return GpuDevice(
            uuid=str(gpu["uuid"]),
            index=int(gpu.get("index", position)),
            name=str(gpu["name"]),
            memory=int(gpu["memoryMiB"]) * MIB,
            numa=None if gpu.get("numa") is None else int(gpu["numa"]),
            mig=bool(gpu.get("mig", False)),
            mig_slices=int(gpu.get("migSlices", 7)),
            units=units,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise FakeProbeError(f"{where}: needs uuid, name and memoryMiB ({exc!r})") from None


def _unit(unit: Mapping[str, Any], where: str) -> MigUnit:
    try:
        return MigUnit(uuid=str(unit["uuid"]), memory=int(unit["memoryMiB"]) * MIB, slices=int(unit["slices"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise FakeProbeError(f"{where}: needs uuid, slices and memoryMiB ({exc!r})") from None


def _profile(raw: Any, where: str, top: float | None) -> Profile:
    """A figure of a ``usage`` entry: a number or a profile (see the module's docstring), 0 to ``top``."""
    profile = None
    try:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            profile = Profile(float(raw), float(raw))
        elif isinstance(raw, Mapping) and len(raw) == 1:
            ((kind, args),) = raw.items()
            if kind == "constant":
                profile = Profile(float(args), float(args))
            elif kind == "ramp":
                profile = Profile(float(args["from"]), float(args["to"]), 0.0, float(args["seconds"]))
            elif kind == "step":
                profile = Profile(float(args["before"]), float(args["after"]), float(args["atSeconds"]))
    except (KeyError, TypeError, ValueError):
        profile = None
    bounds = "0 or more" if top is None else f"from 0 to {top:g}"
    if (
        profile is None
        or profile.seconds < 0
        or not all(v >= 0 and (top is None or v <= top) for v in (profile.start, profile.end))
    ):
        raise FakeProbeError(f"{where}: must be {_PROFILES}, each figure {bounds}; got {raw!r}")
    return profile


def _usage(raw: Any, gpus: Sequence[Mapping[str, Any]], known: Iterable[str]) -> tuple[Scripted, ...]:
    """The ``usage`` entries, with their GPU given by index resolved to its UUID."""
    if not isinstance(raw, list):
        raise FakeProbeError("usage: must be a list")
    by_index = {str(g.get("index", i)): str(g.get("uuid")) for i, g in enumerate(gpus)}
    uuids = frozenset(known)
    scripted = []
    for i, entry in enumerate(raw):
        where = f"usage[{i}]"
        if not isinstance(entry, Mapping) or not {"pod", "container", "gpu"} <= entry.keys():
            raise FakeProbeError(f"{where}: needs pod, container and gpu")
        unknown = sorted(set(entry) - _USAGE_KEYS)
        if unknown:
            raise FakeProbeError(f"{where}.{unknown[0]}: unknown field; known: {', '.join(sorted(_USAGE_KEYS))}")
        gpu = by_index.get(str(entry["gpu"]), str(entry["gpu"]))
        if gpu not in uuids:
            raise FakeProbeError(f"{where}.gpu: {entry['gpu']!r} is the index or UUID of no GPU in the file")
        scripted.append(
            Scripted(
                pid=FAKE_PID_BASE + i,
                pod=str(entry["pod"]),
                container=str(entry["container"]),
                gpu=gpu,
                sm_percent=_profile(entry.get("smPercent", 0), f"{where}.smPercent", 100),
                vram_mib=_profile(entry.get("vramMiB", 0), f"{where}.vramMiB", None),
            )
        )
    return tuple(scripted)
