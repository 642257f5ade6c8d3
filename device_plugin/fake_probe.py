"""A GPU probe described by a YAML/JSON file, for tests, the demo and the end-to-end tier (no GPU).

The file is re-read whenever it changes, so a test or an operator injects faults by rewriting it:
append to ``events`` (each entry is delivered once, as an XID) or set ``fail`` on a GPU (its periodic
check then reports that text until it is removed). Format::

    gpus:
      - uuid: GPU-6b8c0e4a-0000-0000-0000-000000000000
        index: 0
        name: NVIDIA A100-SXM4-80GB     # NVML product name (TFLOPS come from the catalog)
        memoryMiB: 81920
        numa: 0                        # optional
        mig: false                     # optional
        fail: "fell off the bus"       # optional: the health check fails with this text
        utilization: 35                # optional sample figures for /metrics
        memoryUsedMiB: 2048
        temperature: 41
        powerWatts: 88.5
        processes: [{pid: 4242, memoryUsedMiB: 1024}]
    events:
      - {uuid: GPU-6b8c0e4a-0000-0000-0000-000000000000, xid: 79}
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from device_plugin.probe import GpuDevice, GpuSample, ProcessUsage, XidEvent

MIB = 1024 * 1024
_POLL_S = 0.05


class FakeProbeError(ValueError):
    """The fake GPU file is malformed; the message names the entry and field."""


class FakeProbe:
    """A :class:`~device_plugin.probe.GpuProbe` over a file; thread-safe."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._doc: Mapping[str, Any] = {}
        self._delivered = 0
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
                if gpu.get("uuid") == uuid:
                    fail = gpu.get("fail")
                    return None if fail in (None, "") else str(fail)
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
            processes=tuple(
                ProcessUsage(pid=int(p["pid"]), memory_used=int(p.get("memoryUsedMiB", 0)) * MIB)
                for p in gpu.get("processes", ())
            ),
        )

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
        self._doc, self._stamp = doc, stamp

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
    try:
        return GpuDevice(
            uuid=str(gpu["uuid"]),
            index=int(gpu.get("index", position)),
            name=str(gpu["name"]),
            memory=int(gpu["memoryMiB"]) * MIB,
            numa=None if gpu.get("numa") is None else int(gpu["numa"]),
            mig=bool(gpu.get("mig", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise FakeProbeError(f"{where}: needs uuid, name and memoryMiB ({exc!r})") from None
