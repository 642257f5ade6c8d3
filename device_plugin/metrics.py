"""The plugin's Prometheus metrics and ``/usage``, on its own small HTTP server (``/metrics``, ``/usage``).

One port serves both: Prometheus scrapes ``/metrics``, and whatever needs *use* rather than reservation
(the custom-metrics API, ``tfctl top``) reads the node's per-container usage document
(:mod:`vgpu.contract.usage`) at ``/usage`` without a Prometheus in between. Names and labels come from
:mod:`vgpu.metric_names` (the table in docs/metrics.md). GPU figures are collected at scrape time from
the probe (NVML calls run in the server's thread, never on the gRPC loop); per-container figures are
the usage sampler's last pass (:mod:`device_plugin.usage.sampler`). Allocate latency, how long Allocate waited
for the pod's allocation to reach the cache (the hand-off gate's cost), and errors by reason are
recorded by the servicer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import ThreadingHTTPServer
from importlib.metadata import version
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import Collector

from device_plugin.enforcement.vram_overuse import Outcome
from device_plugin.gpus.probe import GpuProbe
from tf_shell.access import Access, Gate
from vgpu import metric_names as m
from vgpu.contract import usage
from vgpu.contract.inventory import GpuInfo, Health
from vgpu.names import DISTRIBUTION

log = logging.getLogger(__name__)
HEALTHZ = "/healthz"  # open: it says the process serves, and nothing of any pod
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def _family(metric: m.Metric) -> GaugeMetricFamily:
    return GaugeMetricFamily(metric.name, metric.help, labels=metric.labels)


class PluginMetrics:
    """Counters and histograms the plugin updates, in a registry of its own (tests make fresh ones)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        ProcessCollector(registry=self.registry)
        build = Gauge(m.BUILD_INFO.name, m.BUILD_INFO.help, m.BUILD_INFO.labels, registry=self.registry)
        build.labels("device-plugin", version(DISTRIBUTION)).set(1)

        def histogram(metric: m.Metric, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(metric.name, metric.help, metric.labels, buckets=buckets, registry=self.registry)

        def counter(metric: m.Metric) -> Counter:
            return Counter(metric.name, metric.help, metric.labels, registry=self.registry)

        def gauge(metric: m.Metric) -> Gauge:
            return Gauge(metric.name, metric.help, metric.labels, registry=self.registry)

        self.allocate_seconds = histogram(m.ALLOCATE_SECONDS, _LATENCY_BUCKETS)
        self.lookup_wait_seconds = histogram(m.ALLOCATE_LOOKUP_WAIT_SECONDS, _LATENCY_BUCKETS)
        self.errors = counter(m.ERRORS)
        # Exported at 0 from the start, so that the alert on its increase sees a tenant's first tampering.
        self.errors.labels(m.WHERE_TAMPER)
        self.registrations = counter(m.REGISTRATIONS)
        self.vram_overuse = counter(m.VRAM_OVERUSE)
        for outcome in Outcome:  # at 0 from the start, for the alert on the first one
            self.vram_overuse.labels(outcome.value)
        self.compute_overuse = counter(m.COMPUTE_OVERUSE)  # unlabelled: exported at 0 from the start
        self.usage_sample_seconds = histogram(m.USAGE_SAMPLE_SECONDS, _PASS_BUCKETS)
        self.usage_skips = counter(m.USAGE_SKIPS)
        self.live_limit_writes = counter(m.LIVE_LIMIT_WRITES)
        self.usage_sampled_at = Gauge(m.USAGE_SAMPLED_AT.name, m.USAGE_SAMPLED_AT.help, registry=self.registry)
        self.envvar_guard = Gauge(
            m.ENVVAR_GUARD.name, m.ENVVAR_GUARD.help, m.ENVVAR_GUARD.labels, registry=self.registry
        )
        self.device_delivery = Gauge(
            m.DEVICE_DELIVERY.name, m.DEVICE_DELIVERY.help, m.DEVICE_DELIVERY.labels, registry=self.registry
        )

    def serve(
        self,
        port: int,
        latest: Callable[[], str | None],
        address: str = "0.0.0.0",
        *,
        node: str = "",
        gate: Gate | None = None,
    ) -> ThreadingHTTPServer:
        """``/metrics`` and ``/usage`` (``latest()``: the encoded document, None before the first pass) on
        ``port`` (0: any free one), from threads of their own; ``shutdown()`` the result to stop. Both name
        every pod on the node, so ``gate`` judges each caller off loopback as the kubelet judges its own
        ``/metrics`` and ``/stats``: ``get nodes/metrics`` and ``get nodes/stats`` of ``node``
        (tf_shell.access; None: nobody is asked, for tests). ``/healthz`` (no data) is open, for probes."""
        registry = self.registry

        class Handler(MetricsHandler):
            def do_GET(self) -> None:
                path = urlparse(self.path).path
                if path == HEALTHZ:
                    self._send(200, "text/plain", b"ok\n")
                    return
                what = "stats" if path == usage.PATH else "metrics"
                access = Access(verb="get", resource="nodes", subresource=what, name=node)
                refused = (
                    None if gate is None else gate.check(self.client_address[0], self.headers["Authorization"], access)
                )
                if refused is not None:
                    self._send(refused.code, "text/plain", f"{refused.message}\n".encode())
                    return
                if path != usage.PATH:
                    super().do_GET()
                    return
                document = latest()
                if document is None:
                    self._send(503, "text/plain", b"no usage sampled yet\n")
                else:
                    self._send(200, "application/json", document.encode())

            def _send(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        Handler.registry = registry
        server = ThreadingHTTPServer((address, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
        return server


class GpuCollector(Collector):
    """Per-GPU figures: capacity and health from the board, allocation from the usage sampler's last pass
    (``allocated``: milli-TFLOPS and bytes per GPU), live figures from the probe at scrape time."""

    def __init__(
        self,
        probe: GpuProbe,
        gpus: Callable[[], Iterable[GpuInfo]],
        node: str,
        allocated: Callable[[], Mapping[str, tuple[int, int]]],
    ) -> None:
        self._probe, self._gpus, self._node, self._allocated = probe, gpus, node, allocated

    def collect(self) -> Iterator[Metric]:
        families = {
            metric: _family(metric)
            for metric in (
                m.GPU_HEALTHY,
                m.GPU_TFLOPS_CAPACITY,
                m.GPU_TFLOPS_ALLOCATED,
                m.GPU_VRAM_CAPACITY,
                m.GPU_VRAM_ALLOCATED,
                m.GPU_UTILIZATION,
                m.GPU_VRAM_USED,
                m.GPU_TEMPERATURE,
                m.GPU_POWER,
            )
        }
        allocated = self._allocated()
        for gpu in self._gpus():
            labels = [self._node, gpu.uuid, str(gpu.index), gpu.model]
            tflops, vram = allocated.get(gpu.uuid, (0, 0))
            figures: dict[m.Metric, float | None] = {
                m.GPU_HEALTHY: 1 if gpu.health == Health.HEALTHY else 0,
                m.GPU_TFLOPS_CAPACITY: gpu.tflops / 1000,
                m.GPU_TFLOPS_ALLOCATED: tflops / 1000,
                m.GPU_VRAM_CAPACITY: gpu.vram,
                m.GPU_VRAM_ALLOCATED: vram,
            }
            try:
                sample = self._probe.sample(gpu.uuid)
            except Exception as exc:
                log.warning("cannot sample GPU %s: %s", gpu.uuid, exc)
            else:
                figures |= {
                    m.GPU_UTILIZATION: None if sample.utilization is None else sample.utilization / 100,
                    m.GPU_VRAM_USED: sample.memory_used,
                    m.GPU_TEMPERATURE: sample.temperature,
                    m.GPU_POWER: sample.power_watts,
                }
            for metric, value in figures.items():
                if value is not None:
                    families[metric].add_metric(labels, value)
        yield from families.values()


class UsageCollector(Collector):
    """Per-container and unattributed use at the usage sampler's last pass (``latest``), and which GPUs
    report per-process utilisation (``supported``)."""

    def __init__(
        self, node: str, latest: Callable[[], usage.NodeUsage | None], supported: Callable[[], Mapping[str, bool]]
    ) -> None:
        self._node, self._latest, self._supported = node, latest, supported

    def collect(self) -> Iterator[Metric]:
        families = {
            metric: _family(metric)
            for metric in (
                m.GPU_PROCESS_UTILIZATION_SUPPORTED,
                m.GPU_UNATTRIBUTED_PROCESSES,
                m.GPU_UNATTRIBUTED_TFLOPS_USED,
                m.GPU_UNATTRIBUTED_VRAM_USED,
                m.CONTAINER_TFLOPS_USED,
                m.CONTAINER_TFLOPS_REQUEST,
                m.CONTAINER_TFLOPS_LIMIT,
                m.CONTAINER_TFLOPS_USED_RATIO,
                m.CONTAINER_TFLOPS_USED_REQUEST_RATIO,
                m.CONTAINER_VRAM_USED,
                m.CONTAINER_VRAM_REQUEST,
                m.CONTAINER_VRAM_LIMIT,
                m.CONTAINER_VRAM_USED_RATIO,
                m.CONTAINER_VRAM_USED_REQUEST_RATIO,
            )
        }
        latest = self._latest()
        lost = {u.gpu: u for u in latest.unattributed} if latest is not None else {}
        for uuid, supported in sorted(self._supported().items()):  # every GPU sampled: 0 is a figure too
            u = lost.get(
                uuid, usage.Unattributed(gpu=uuid, processes=0, tflops_used=0, vram_used=0, tflops_measured=supported)
            )
            families[m.GPU_PROCESS_UTILIZATION_SUPPORTED].add_metric([self._node, uuid], 1 if supported else 0)
            families[m.GPU_UNATTRIBUTED_PROCESSES].add_metric([self._node, uuid], u.processes)
            if u.tflops_measured:  # not measured is no series, never a 0 that reads as idle
                families[m.GPU_UNATTRIBUTED_TFLOPS_USED].add_metric([self._node, uuid], u.tflops_used / 1000)
            families[m.GPU_UNATTRIBUTED_VRAM_USED].add_metric([self._node, uuid], u.vram_used)
        for c in latest.containers if latest is not None else ():
            figures: dict[m.Metric, float | None] = {
                m.CONTAINER_TFLOPS_USED: c.tflops_used / 1000 if c.tflops_measured else None,
                m.CONTAINER_TFLOPS_REQUEST: c.tflops_request / 1000,
                m.CONTAINER_TFLOPS_LIMIT: c.tflops_limit / 1000,
                m.CONTAINER_TFLOPS_USED_RATIO: _ratio(c.tflops_used, c.tflops_limit) if c.tflops_measured else None,
                m.CONTAINER_TFLOPS_USED_REQUEST_RATIO: (
                    _ratio(c.tflops_used, c.tflops_request) if c.tflops_measured else None
                ),
                m.CONTAINER_VRAM_USED: c.vram_used,
                m.CONTAINER_VRAM_REQUEST: c.vram_request,
                m.CONTAINER_VRAM_LIMIT: c.vram_limit,
                m.CONTAINER_VRAM_USED_RATIO: _ratio(c.vram_used, c.vram_limit),
                m.CONTAINER_VRAM_USED_REQUEST_RATIO: _ratio(c.vram_used, c.vram_request),
            }
            labels = [self._node, c.namespace, c.pod, c.container, c.gpu]
            for metric, value in figures.items():
                if value is not None:
                    families[metric].add_metric(labels, value)
        yield from families.values()


def _ratio(used: int, of: int) -> float | None:
    """``used`` over ``of``; None (no series) when ``of`` is 0: a zero request has no ratio."""
    return used / of if of else None
