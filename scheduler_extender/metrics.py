"""The extender's Prometheus metrics: verb latency, bind outcomes, hand-off gate waits, capacity in use.

One registry per app (no prometheus_client globals), so tests and several apps in one process do
not collide. Counters and histograms are updated by the handlers; the capacity gauges (allocated
vs total TFLOPS/VRAM per pool, model and node, GPU pods waiting for a node, reservations, held
gates) are computed from the cache when Prometheus scrapes, so they can never drift from what the
scheduler decides on.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from importlib.metadata import version
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler_extender.cache import ClusterCache
from scheduler_extender.handoff import HandoffGate
from scheduler_extender.preemptor import RESULTS as PREEMPTION_RESULTS
from vgpu import metric_names
from vgpu.names import DISTRIBUTION

NS: Final = metric_names.EXTENDER
_LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_WAIT_BUCKETS: Final = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30)


class Metrics:
    """The app's metric objects, registered on its own registry."""

    def __init__(self, cache: ClusterCache, gate: HandoffGate) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        info = metric_names.BUILD_INFO
        Gauge(info.name, info.help, info.labels, registry=self.registry).labels("extender", version(DISTRIBUTION)).set(
            1
        )
        self.latency = Histogram(
            f"{NS}_request_seconds",
            "Time to answer one extender verb",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter(
            f"{NS}_errors_total",
            "Verb answers carrying an Error, and failed Kubernetes calls, by kind",
            ["verb", "kind"],
            registry=self.registry,
        )
        self.binds = Counter(f"{NS}_binds_total", "Bind outcomes", ["result"], registry=self.registry)
        self.claims = Counter(
            f"{NS}_claims_total",
            "Writes of a node's claims Lease, by outcome: written, contended (another replica wrote it since "
            "this one read it: decided again), stale-read (a claim's pod read to settle it)",
            ["result"],
            registry=self.registry,
        )
        self.gate_wait = Histogram(
            f"{NS}_bind_gate_wait_seconds",
            "How long binds waited for another pod's hand-off on the same node",
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.unschedulable = Counter(
            f"{NS}_unschedulable_total",
            "Filter calls where no offered node could take the pod, by the reason that rejected the most nodes",
            ["reason"],
            registry=self.registry,
        )
        self.filter_passes = Counter(
            f"{NS}_filter_passes_total",
            "GPU pods' filter answers by what passed: one (kube-scheduler binds it without scoring), tie (several "
            "nodes this extender rates equal: kube-scheduler's own scores choose), every (every fitting node, "
            "scored by prioritize: the pod has soft preferences, a PreferNoSchedule taint applies, or filter does "
            "not decide), none",
            ["passed"],
            registry=self.registry,
        )
        self.preemptions = Counter(
            f"{NS}_preemptions_total",
            "The extender's own preemption passes (GPU fragmentation), by outcome: evicted, nominated (pods "
            "already leaving made room), none (no plan), blocked (a PodDisruptionBudget refused), skipped, error",
            ["result"],
            registry=self.registry,
        )
        for result in PREEMPTION_RESULTS:  # a rate over them starts at 0, not at the first pass
            self.preemptions.labels(result)
        self.registry.register(CapacityCollector(cache, gate))


class CapacityCollector(Collector):
    """Allocated vs capacity, computed from the cache at scrape time."""

    def __init__(self, cache: ClusterCache, gate: HandoffGate) -> None:
        self.cache = cache
        self.gate = gate

    def collect(self) -> Iterator[Metric]:
        per_node = {
            "tflops": GaugeMetricFamily(
                f"{NS}_node_tflops", "TFLOPS per node: capacity and reserved", labels=["node", "pool", "kind"]
            ),
            "vram": GaugeMetricFamily(
                f"{NS}_node_vram_bytes", "VRAM per node: capacity and reserved", labels=["node", "pool", "kind"]
            ),
        }
        pools = GaugeMetricFamily(
            f"{NS}_pool_tflops",
            "TFLOPS per pool and GPU model: capacity and reserved",
            labels=["pool", "model", "kind"],
        )
        pools_vram = GaugeMetricFamily(
            f"{NS}_pool_vram_bytes",
            "VRAM per pool and GPU model: capacity and reserved",
            labels=["pool", "model", "kind"],
        )
        totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        broken = 0
        for node in self.cache.nodes():
            if node.inventory_error:
                broken += 1
            cap_t = used_t = cap_v = used_v = 0
            for g in node.gpus:
                cap_t, used_t, cap_v, used_v = (
                    cap_t + g.tflops,
                    used_t + g.tflops_used,
                    cap_v + g.vram,
                    used_v + g.vram_used,
                )
                row = totals[(node.pool, g.model)]
                row[0] += g.tflops
                row[1] += g.tflops_used
                row[2] += g.vram
                row[3] += g.vram_used
            if node.gpus:
                per_node["tflops"].add_metric([node.name, node.pool, "capacity"], cap_t / 1000)
                per_node["tflops"].add_metric([node.name, node.pool, "allocated"], used_t / 1000)
                per_node["vram"].add_metric([node.name, node.pool, "capacity"], cap_v)
                per_node["vram"].add_metric([node.name, node.pool, "allocated"], used_v)
        for (pool, model), (cap_t, used_t, cap_v, used_v) in sorted(totals.items()):
            pools.add_metric([pool, model, "capacity"], cap_t / 1000)
            pools.add_metric([pool, model, "allocated"], used_t / 1000)
            pools_vram.add_metric([pool, model, "capacity"], cap_v)
            pools_vram.add_metric([pool, model, "allocated"], used_v)
        yield from per_node.values()
        yield pools
        yield pools_vram
        spec = metric_names.EXTENDER_PENDING_PODS
        pending = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
        waiting = self.cache.pending_by_pool()
        for pool in sorted({node.pool for node in self.cache.nodes()} | waiting.keys()):  # a pool's 0 is a figure too
            pending.add_metric([pool], waiting[pool])
        yield pending
        yield GaugeMetricFamily(
            f"{NS}_reservations",
            "Tentative reservations (filter/prioritize) awaiting a bind",
            value=self.cache.tentative_count(),
        )
        yield GaugeMetricFamily(
            f"{NS}_handoff_gates_held", "Nodes whose hand-off gate is held", value=self.gate.held_nodes()
        )
        yield CounterMetricFamily(
            f"{NS}_handoff_gates_shared",
            "Binds that took a node's hand-off gate beside another pod in hand-off there, of other Allocate sizes",
            value=self.gate.shared(),
        )
        yield GaugeMetricFamily(
            f"{NS}_allocation_conflicts",
            "Pod allocations that could not be entered in the ledger (see logs)",
            value=len(self.cache.conflicts()),
        )
        yield GaugeMetricFamily(f"{NS}_nodes_inventory_error", "Nodes with a corrupt GPU inventory", value=broken)
