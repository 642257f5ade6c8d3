"""One sample per pod and per node, from the device plugins' usage documents; which samples may be served.

A pod's figures are the sums over its containers and GPUs (its grant counted once per GPU); a node's
add what no container could be found for. TFLOPS a plugin could not measure are absent, never 0, so
an HPA does not read a MIG instance or an old driver as idle. A sample is served while it is at most
two of its plugin's sampling intervals old (:func:`fresh`). The rules and why: docs/metrics.md,
section "Where the usage figures come from".

Pure: documents and the time in, plain values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vgpu.contract.usage import ContainerUsage, NodeUsage
from vgpu.names import GpuMetric
from vgpu.quantity import format_bytes, format_milli
from vgpu.timefmt import parse_rfc3339, rfc3339

STALE_AFTER_INTERVALS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampled:
    """When a figure was measured (seconds since the epoch, and as the API writes it) and over what window."""

    at: float
    timestamp: str  # RFC 3339 to the second, UTC: metav1.Time's form
    window_s: float  # the plugin's sampling interval


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSample:
    """A pod's use of its GPUs at one sample. TFLOPS in milli, memory in bytes."""

    namespace: str
    name: str
    uid: str
    node: str
    tflops_used: int
    vram_used: int
    tflops_measured: bool
    tflops_request: int
    tflops_limit: int
    vram_request: int
    vram_limit: int
    sampled: Sampled


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSample:
    """A node's GPU use at one sample, its pods' and the unattributed processes' together."""

    node: str
    tflops_used: int
    vram_used: int
    tflops_measured: bool
    sampled: Sampled


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every sample tf-metrics holds: pods by (namespace, name), nodes by name."""

    pods: Mapping[tuple[str, str], PodSample]
    nodes: Mapping[str, NodeSample]


EMPTY = Snapshot({}, {})


def sampled(usage: NodeUsage) -> Sampled:
    """When ``usage`` was sampled; ValueError naming the field when ``sampledAt`` is not RFC 3339."""
    try:
        at = parse_rfc3339(usage.sampled_at)
    except ValueError as exc:
        raise ValueError(f"sampledAt {exc}") from None
    stamp = rfc3339(int(at))
    return Sampled(at=at, timestamp=stamp, window_s=usage.interval_s)


def node_samples(usage: NodeUsage) -> tuple[NodeSample, list[PodSample]]:
    """The node's sample and its pods' (ValueError when the document's time is unreadable)."""
    when = sampled(usage)
    by_pod: dict[tuple[str, str, str], list[ContainerUsage]] = {}
    for c in usage.containers:
        by_pod.setdefault((c.namespace, c.pod, c.pod_uid), []).append(c)
    pods = [_pod(namespace, name, uid, usage.node, entries, when) for (namespace, name, uid), entries in by_pod.items()]
    node = NodeSample(
        node=usage.node,
        tflops_used=sum(c.tflops_used for c in usage.containers) + sum(u.tflops_used for u in usage.unattributed),
        vram_used=sum(c.vram_used for c in usage.containers) + sum(u.vram_used for u in usage.unattributed),
        tflops_measured=all(c.tflops_measured for c in usage.containers)
        and all(u.tflops_measured for u in usage.unattributed),
        sampled=when,
    )
    return node, pods


def _pod(namespace: str, name: str, uid: str, node: str, entries: list[ContainerUsage], when: Sampled) -> PodSample:
    per_gpu: dict[str, list[ContainerUsage]] = {}
    for c in entries:
        per_gpu.setdefault(c.gpu, []).append(c)

    def grant(field: str) -> int:
        return sum(max(getattr(c, field) for c in on_gpu) for on_gpu in per_gpu.values())

    return PodSample(
        namespace=namespace,
        name=name,
        uid=uid,
        node=node,
        tflops_used=sum(c.tflops_used for c in entries),
        vram_used=sum(c.vram_used for c in entries),
        tflops_measured=all(c.tflops_measured for c in entries),
        tflops_request=grant("tflops_request"),
        tflops_limit=grant("tflops_limit"),
        vram_request=grant("vram_request"),
        vram_limit=grant("vram_limit"),
        sampled=when,
    )


def snapshot(nodes: Iterable[NodeSample], pods: Iterable[PodSample]) -> Snapshot:
    """The samples by key; a pod reported by two nodes (it moved between their samples) keeps the newer."""
    by_key: dict[tuple[str, str], PodSample] = {}
    for pod in pods:
        held = by_key.get((pod.namespace, pod.name))
        if held is None or pod.sampled.at > held.sampled.at:
            by_key[(pod.namespace, pod.name)] = pod
    return Snapshot(by_key, {n.node: n for n in nodes})


def fresh(when: Sampled, now: float) -> bool:
    """Whether a figure sampled ``when`` may still be served at ``now``."""
    return now - when.at <= STALE_AFTER_INTERVALS * when.window_s


def pod_value(pod: PodSample, metric: GpuMetric) -> str | None:
    """The metric's value as a Kubernetes quantity; None where it has none (utilisation without a limit,
    TFLOPS the plugin could not measure)."""
    if metric is GpuMetric.VRAM_BYTES:
        return format_bytes(pod.vram_used)
    if not pod.tflops_measured:
        return None
    if metric is GpuMetric.TFLOPS:
        return format_milli(pod.tflops_used)
    if pod.tflops_limit <= 0:
        return None
    return format_milli(utilization_milli(pod.tflops_used, pod.tflops_limit))


def node_value(node: NodeSample, metric: GpuMetric) -> str | None:
    """A node's figure of use; None for utilisation, which only a pod's limit gives a meaning, and for
    TFLOPS the plugin could not measure on one of its GPUs."""
    if metric is GpuMetric.TFLOPS:
        return format_milli(node.tflops_used) if node.tflops_measured else None
    if metric is GpuMetric.VRAM_BYTES:
        return format_bytes(node.vram_used)
    return None


def utilization_milli(used: int, limit: int) -> int:
    """100 × used / limit in thousandths of a percent, rounded half up (``limit`` > 0)."""
    return (200_000 * used + limit) // (2 * limit)
