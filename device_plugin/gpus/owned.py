"""The GPUs this plugin manages, on a node it shares with NVIDIA's device plugin.

Two device plugins that advertise the same GPU each hand it to their own pods, and neither ledger
knows the other's: the GPU is double-booked. So on a shared node every GPU must be advertised by
exactly one plugin: ours manages the GPUs listed in ``--gpus`` (indexes or UUIDs), NVIDIA's is given
the others (``NVIDIA_VISIBLE_DEVICES`` on its DaemonSet; docs/troubleshooting.md, "Running beside
NVIDIA's GPU Operator or device plugin"), and the kubelet then never gives one GPU to both.
:class:`OwnedProbe` wraps the real probe so that discovery, health, metrics and the layout watch all
see only the managed GPUs; a GPU in MIG mode brings its MIG instances along.
"""

from __future__ import annotations

from collections.abc import Sequence

from device_plugin.gpus.probe import (
    ComputeMode,
    GpuDevice,
    GpuProbe,
    GpuSample,
    ProbeError,
    ProcessReport,
    XidEvent,
)


def parse(text: str) -> tuple[str, ...]:
    """The entries of a ``--gpus`` value (comma-separated indexes or UUIDs); () for all GPUs."""
    return tuple(e.strip() for e in text.split(",") if e.strip())


def select(devices: Sequence[GpuDevice], entries: Sequence[str]) -> tuple[GpuDevice, ...]:
    """The devices named by ``entries`` (all when none); ProbeError naming an entry no GPU answers to."""
    if not entries:
        return tuple(devices)
    known = {str(d.index): d.uuid for d in devices} | {d.uuid: d.uuid for d in devices}
    unknown = [e for e in entries if e not in known]
    if unknown:
        have = ", ".join(f"{d.index} ({d.uuid})" for d in devices) or "none"
        raise ProbeError(f"--gpus names {', '.join(unknown)}, which no GPU of this node is; it has: {have}")
    chosen = {known[e] for e in entries}
    return tuple(d for d in devices if d.uuid in chosen)


class OwnedProbe:
    """A :class:`~device_plugin.gpus.probe.GpuProbe` that shows only the managed GPUs of ``inner``."""

    def __init__(self, inner: GpuProbe, entries: Sequence[str]) -> None:
        self._inner, self._entries = inner, tuple(entries)
        select(inner.devices(), self._entries)  # an entry that names no GPU stops the plugin at start

    def devices(self) -> tuple[GpuDevice, ...]:
        return select(self._inner.devices(), self._entries)

    def wait_xid(self, timeout_s: float) -> tuple[XidEvent, ...]:
        mine = {d.uuid for d in self.devices()}
        return tuple(e for e in self._inner.wait_xid(timeout_s) if e.uuid in mine or not e.uuid)

    def check(self, uuid: str) -> str | None:
        return self._inner.check(uuid)

    def sample(self, uuid: str) -> GpuSample:
        return self._inner.sample(uuid)

    def processes(self, uuid: str, since_us: int) -> ProcessReport:
        return self._inner.processes(uuid, since_us)

    def compute_mode(self, uuid: str) -> ComputeMode:
        return self._inner.compute_mode(uuid)

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        self._inner.set_compute_mode(uuid, mode)

    def close(self) -> None:
        self._inner.close()
