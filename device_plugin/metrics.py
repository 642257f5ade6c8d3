"""The plugin's Prometheus metrics on its own small HTTP server (``/metrics``).

GPU figures are collected at scrape time from the probe (NVML calls run in the scrape thread, never
on the gRPC loop); per-pod GPU memory maps NVML's process list to pods through each process's
cgroup (which names the pod UID) and the pod cache. Allocate latency, how long Allocate waited for
the pod's allocation to reach the cache (the hand-off gate's cost), and errors by reason are
recorded by the servicer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from device_plugin.probe import GpuProbe
from vgpu.contract.inventory import GpuInfo

log = logging.getLogger(__name__)
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def pod_uid_of_pid(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The pod UID in a process's cgroup path (cgroupfs ``pod<uid>`` or systemd ``pod<uid_with_underscores>``)."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _POD_UID.search(text)
    return match[1].replace("_", "-") if match else None


class PluginMetrics:
    """Counters and histograms the plugin updates, in a registry of its own (tests make fresh ones)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.allocate_seconds = Histogram(
            "tf_device_plugin_allocate_seconds",
            "Allocate RPC latency by outcome.",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.lookup_wait_seconds = Histogram(
            "tf_device_plugin_allocate_lookup_wait_seconds",
            "How long Allocate waited for the pod's allocation to reach the pod cache.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter(
            "tf_device_plugin_errors_total", "Errors by where they happened.", ["where"], registry=self.registry
        )
        self.registrations = Counter(
            "tf_device_plugin_registrations_total", "Successful registrations with the kubelet.", registry=self.registry
        )

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)


class GpuCollector(Collector):
    """Per-GPU and per-pod figures, sampled from the probe at scrape time."""

    def __init__(
        self,
        probe: GpuProbe,
        gpus: Callable[[], Iterable[GpuInfo]],
        pods: Callable[[], Mapping[str, tuple[str, str]]],
        pid_to_pod: Callable[[int], str | None] = pod_uid_of_pid,
    ) -> None:
        self._probe, self._gpus, self._pods, self._pid_to_pod = probe, gpus, pods, pid_to_pod

    def collect(self) -> Iterator[Metric]:
        labels = ["gpu", "index", "model"]
        util = GaugeMetricFamily("tf_gpu_utilization_percent", "GPU utilisation (percent of time busy).", labels=labels)
        used = GaugeMetricFamily("tf_gpu_memory_used_bytes", "GPU memory in use.", labels=labels)
        total = GaugeMetricFamily("tf_gpu_memory_total_bytes", "GPU memory capacity.", labels=labels)
        temp = GaugeMetricFamily("tf_gpu_temperature_celsius", "GPU temperature.", labels=labels)
        power = GaugeMetricFamily("tf_gpu_power_watts", "GPU power draw.", labels=labels)
        healthy = GaugeMetricFamily("tf_gpu_healthy", "1 when the GPU is advertised healthy.", labels=labels)
        pod_mem = GaugeMetricFamily(
            "tf_pod_gpu_memory_used_bytes", "GPU memory held by a pod's processes.", labels=["namespace", "pod", "gpu"]
        )
        pods = self._pods()
        for gpu in self._gpus():
            values = [gpu.uuid, str(gpu.index), gpu.model]
            total.add_metric(values, gpu.vram)
            healthy.add_metric(values, 1 if gpu.health.value == "Healthy" else 0)
            try:
                sample = self._probe.sample(gpu.uuid)
            except Exception as exc:
                log.warning("cannot sample GPU %s: %s", gpu.uuid, exc)
                continue
            for family, value in ((util, sample.utilization), (used, sample.memory_used)):
                if value is not None:
                    family.add_metric(values, value)
            if sample.temperature is not None:
                temp.add_metric(values, sample.temperature)
            if sample.power_watts is not None:
                power.add_metric(values, sample.power_watts)
            by_pod: dict[tuple[str, str], int] = {}
            for proc in sample.processes:
                uid = self._pid_to_pod(proc.pid)
                if uid is not None and uid in pods:
                    by_pod[pods[uid]] = by_pod.get(pods[uid], 0) + proc.memory_used
            for (namespace, name), memory in sorted(by_pod.items()):
                pod_mem.add_metric([namespace, name, gpu.uuid], memory)
        yield from (util, used, total, temp, power, healthy, pod_mem)
