"""What ``tf-device-plugin --probe`` prints: this node's GPUs as the plugin would publish them.

A person on a GPU node runs it to see, without a kubelet or an API server, what the probe (NVML, or
a ``--fake-gpus`` file) discovers, which catalog model and TFLOPS each GPU would be advertised with
(``--gpu-catalog`` and ``--default-tflops`` applied), whether its health check passes, and a live
sample. Discovery goes through :func:`~device_plugin.gpus.board.discover`, the daemon's own path, so what
is shown is what the kubelet and the extender would get.
"""

from __future__ import annotations

from device_plugin.gpus.board import discover
from device_plugin.gpus.probe import GpuProbe, GpuSample
from vgpu.catalog import Catalog
from vgpu.quantity import humanize_bytes, humanize_tflops


def _or_na(value: object, unit: str = "") -> str:
    return "n/a" if value is None else f"{value}{unit}"


def _processes(probe: GpuProbe, uuid: str) -> str:
    try:
        found = probe.processes(uuid, 0)
    except Exception as exc:  # shown, not fatal: the rest of the report still tells what works
        return f"n/a ({exc})"
    return f"{len(found.processes)}" + ("" if found.sm_supported else " (memory only: no per-process utilisation)")


def _sample(sample: GpuSample, processes: str) -> str:
    used = None if sample.memory_used is None else humanize_bytes(sample.memory_used)
    return (
        f"utilization {_or_na(sample.utilization, '%')}, memory used {_or_na(used)}, "
        f"temperature {_or_na(sample.temperature, ' °C')}, power {_or_na(sample.power_watts, ' W')}, "
        f"compute processes {processes}"
    )


def report(probe: GpuProbe, catalog: Catalog, default_tflops: int) -> str:
    """One block per GPU: identity, what would be published, the health check, a live sample."""
    devices = probe.devices()
    gpus = discover(devices, catalog, default_tflops)
    names = {d.uuid: d.name for d in devices}
    lines = [f"{len(devices)} GPU(s) found"]
    for gpu in gpus:
        name = names[gpu.parent or gpu.uuid]
        model = gpu.model if catalog.lookup(name) is not None else f"{gpu.model!r} (not in the GPU catalog)"
        numa = "unknown" if gpu.numa is None else str(gpu.numa)
        problem = probe.check(gpu.uuid)
        mig = "MIG on: not scheduled, its instances are" if gpu.mig else "MIG off"
        lines += [
            f"GPU {gpu.index}  {gpu.uuid}  {name}"
            if gpu.parent is None
            else f"MIG instance of GPU {gpu.index}  {gpu.uuid}",
            f"  published as {model}: {humanize_tflops(gpu.tflops)} TFLOPS, {humanize_bytes(gpu.vram)} VRAM, "
            f"NUMA node {numa}, {mig if gpu.parent is None else 'hard-isolated'}",
            f"  health check: {'ok' if problem is None else problem}",
            f"  now: {_sample(probe.sample(gpu.uuid), _processes(probe, gpu.uuid))}",
        ]
    return "\n".join(lines) + "\n"
