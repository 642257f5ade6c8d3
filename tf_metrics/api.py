"""The custom metrics API's documents, as ``k8s.io/metrics`` defines them and the adapters write them.

Discovery: the APIGroup, and per version an APIResourceList with one resource per metric and kind
of object (``pods/gpu_utilization``, verbs ``get``, kind ``MetricValueList``), which is how
``sigs.k8s.io/custom-metrics-apiserver`` lists them. A read answers a MetricValueList in the version
asked: v1beta1 items carry ``metricName``, ``window`` and ``selector``; v1beta2 items ``metric
{name, selector}`` and ``windowSeconds``. A named object answers a list of one. Errors are Status
documents with that library's messages: an unknown metric, or a named object without a sample, is
a 404 ``the server could not find the metric …``; a wildcard read of objects without samples is an
empty list.

Pure: what to answer, from the query, the samples and the time.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from vgpu.names import CUSTOM_METRICS_GROUP, CUSTOM_METRICS_VERSIONS, GpuMetric
from vgpu.usage_samples import (
    NodeSample,
    PodSample,
    Sampled,
    Snapshot,
    fresh,
    node_value,
    pod_value,
)

ALL: Final = "*"  # every object (as a name) or every namespace
# The metrics per resource, and whether the resource is namespaced.
METRICS: Final[Mapping[str, tuple[tuple[GpuMetric, ...], bool]]] = {
    "pods": (tuple(GpuMetric), True),
    "nodes": ((GpuMetric.TFLOPS, GpuMetric.VRAM_BYTES), False),
}
KINDS: Final = {"pods": "Pod", "nodes": "Node"}
Document = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP status and the JSON document to send with it."""

    code: int
    body: Document


@dataclass(frozen=True, slots=True, kw_only=True)
class Query:
    """One metric read: ``namespace`` is None for a cluster-scoped resource, ALL for every namespace."""

    version: str
    resource: str
    namespace: str | None
    name: str
    metric: str


def group_version(version: str) -> str:
    return f"{CUSTOM_METRICS_GROUP}/{version}"


def api_group() -> Document:
    versions = [{"groupVersion": group_version(v), "version": v} for v in CUSTOM_METRICS_VERSIONS]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": CUSTOM_METRICS_GROUP,
        "versions": versions,
        "preferredVersion": versions[0],
    }


def resource_list(version: str) -> Answer:
    if version not in CUSTOM_METRICS_VERSIONS:
        return no_such_path()
    resources = [
        {"name": f"{resource}/{metric}", "singularName": "", "namespaced": namespaced, "kind": "MetricValueList",
         "verbs": ["get"]}
        for resource, (metrics, namespaced) in METRICS.items()
        for metric in metrics
    ]  # fmt: skip
    return Answer(
        200,
        {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version(version), "resources": resources},
    )


def status(code: int, reason: str, message: str) -> Document:
    """A failure Status, as the API server and every aggregated API server write it."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


def no_such_path() -> Answer:
    return Answer(404, status(404, "NotFound", "the server could not find the requested resource"))


def bad_request(message: str) -> Answer:
    return Answer(400, status(400, "BadRequest", message))


def metric_not_found(query: Query, named: bool) -> Answer:
    what = f"{query.resource} {query.name}" if named else query.resource
    return Answer(404, status(404, "NotFound", f"the server could not find the metric {query.metric} for {what}"))


def check(query: Query, metric_label_selector: str) -> Answer | None:
    """The error a query gets before any sample is read, or None: an unknown version, resource, metric or
    scope is a 404; a metric label selector a 400 (these metrics carry no labels to select by)."""
    if query.version not in CUSTOM_METRICS_VERSIONS:
        return no_such_path()
    metrics, namespaced = METRICS.get(query.resource, ((), False))
    if query.metric not in metrics or namespaced != (query.namespace is not None):
        return metric_not_found(query, named=False)
    if metric_label_selector:
        return bad_request(
            f"metricLabelSelector {metric_label_selector!r}: the GPU metrics carry no labels to select; "
            "leave the metric's selector empty"
        )
    return None


def answer(query: Query, snapshot: Snapshot, now: float, uids: Collection[str] | None = None) -> Answer:
    """The MetricValueList for a :func:`check`-ed query: the fresh samples it names, of the pods whose UIDs
    are ``uids`` when a label selector chose them. A named object without one is a 404."""
    metric = GpuMetric(query.metric)
    values: list[tuple[PodSample | NodeSample, str]] = []
    if query.resource == "pods":
        for (namespace, name), pod in sorted(snapshot.pods.items()):
            if query.namespace not in (ALL, namespace) or query.name not in (ALL, name):
                continue
            value = pod_value(pod, metric)
            if value is not None and fresh(pod.sampled, now) and (uids is None or pod.uid in uids):
                values.append((pod, value))
    else:
        for node_name, node in sorted(snapshot.nodes.items()):
            value = node_value(node, metric)
            if query.name in (ALL, node_name) and value is not None and fresh(node.sampled, now):
                values.append((node, value))
    if query.name != ALL and not values:
        return metric_not_found(query, named=True)
    return Answer(
        200, value_list(query.version, metric, [(_described(obj), value, obj.sampled) for obj, value in values])
    )


def _described(obj: PodSample | NodeSample) -> Document:
    if isinstance(obj, PodSample):
        return {"kind": KINDS["pods"], "namespace": obj.namespace, "name": obj.name, "apiVersion": "v1"}
    return {"kind": KINDS["nodes"], "name": obj.node, "apiVersion": "v1"}


def value_list(version: str, metric: GpuMetric, items: Sequence[tuple[Document, str, Sampled]]) -> Document:
    """A MetricValueList of ``metric`` in ``version``: (describedObject, value, when) per item."""
    return {
        "kind": "MetricValueList",
        "apiVersion": group_version(version),
        "metadata": {},
        "items": [_item(version, metric, described, value, when) for described, value, when in items],
    }


def _item(version: str, metric: GpuMetric, described: Document, value: str, when: Sampled) -> Document:
    window = max(1, round(when.window_s))
    if version == "v1beta1":
        return {"describedObject": described, "metricName": metric.value, "timestamp": when.timestamp,
                "window": window, "value": value, "selector": None}  # fmt: skip
    return {"describedObject": described, "metric": {"name": metric.value, "selector": None},
            "timestamp": when.timestamp, "windowSeconds": window, "value": value}  # fmt: skip
