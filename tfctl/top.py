"""``tfctl top pods|nodes``: what each GPU pod reserved, may use and uses now; each GPU node's capacity, grants and use.

Like ``kubectl top``, through the API server as the user of the kubeconfig: the grants come from the
pods' allocations (what the extender reserved at bind: request and limit per GPU, summed over the
pod's GPUs) and the capacity from the nodes' inventories, the use from the custom metrics API that
tf-metrics serves — the figures an HPA reads, so what ``top`` shows is what autoscaling sees. A pod
or node without a fresh sample shows ``-`` (its plugin has not measured it within two intervals).
When the metrics API cannot be read, ``top`` says why and how to fix it, and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tf_shell.kube.api import GatewayError, RawObject
from tf_shell.kube.reads import MetricsCluster
from vgpu.contract import allocation, inventory
from vgpu.errors import DomainError
from vgpu.names import CUSTOM_METRICS_GROUP, CUSTOM_METRICS_VERSIONS, LABEL_ENABLED, GpuMetric, SystemAnnotation
from vgpu.quantity import humanize_bytes, humanize_tflops, parse_bytes, parse_milli

VERSION: Final = CUSTOM_METRICS_VERSIONS[0]
API: Final = f"/apis/{CUSTOM_METRICS_GROUP}/{VERSION}"
NONE: Final = "-"
TERMINAL: Final = ("Succeeded", "Failed")


class MetricsUnavailable(Exception):
    """The custom metrics API could not be read; the message says why and what to do."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """What a pod holds on its node, summed over its GPUs: TFLOPS in milli, VRAM in bytes."""

    namespace: str
    pod: str
    node: str
    tflops_request: int
    tflops_limit: int
    vram_request: int
    vram_limit: int


def add_subcommand(subparsers: Any) -> None:
    """Register ``top`` on tfctl's sub-parsers."""
    p = subparsers.add_parser("top", help="GPU use of pods or nodes, beside what they reserved (like kubectl top)")
    p.add_argument("what", choices=("pods", "nodes"), help="pods: per GPU pod; nodes: per GPU node")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", default="default", help="the pods' namespace (default: default)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="the pods of every namespace")
    p.add_argument("-l", "--selector", default="", help="only pods with these labels (a label selector)")
    p.add_argument("--kubeconfig", help="kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        cluster = MetricsCluster.connect(args.kubeconfig)
        text = top_pods(cluster, args) if args.what == "pods" else top_nodes(cluster)
    except (GatewayError, MetricsUnavailable) as exc:
        print(f"tfctl top: {exc}", file=sys.stderr)
        return 2
    except DomainError as exc:
        print(f"tfctl top: the custom metrics API answered a value that is not a quantity: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


def top_pods(cluster: MetricsCluster, args: argparse.Namespace) -> str:
    namespace = None if args.all_namespaces else args.namespace
    selector = ",".join(s for s in (f"{LABEL_ENABLED}=true", args.selector) if s)
    grants = pod_grants(cluster.pods(namespace, selector))
    where = f"{API}/namespaces/{namespace or '*'}/pods/*"
    used = {metric: read_metric(cluster, f"{where}/{metric}", args.selector) for metric in GpuMetric}
    return pods_table(grants, used)


def top_nodes(cluster: MetricsCluster) -> str:
    capacity = node_capacity(cluster.nodes())
    grants = pod_grants(cluster.pods(None, f"{LABEL_ENABLED}=true"))
    used = {
        metric: read_metric(cluster, f"{API}/nodes/*/{metric}") for metric in (GpuMetric.TFLOPS, GpuMetric.VRAM_BYTES)
    }
    return nodes_table(capacity, grants, used)


def read_metric(cluster: MetricsCluster, path: str, selector: str = "") -> dict[tuple[str, str], str]:
    """The metric's value by (namespace, name) of the object it describes ('' namespace for a node)."""
    status, body = cluster.get(path, [("labelSelector", selector)] if selector else [])
    if status != 200:
        raise MetricsUnavailable(unavailable(status, body))
    return values(body)


def values(body: bytes) -> dict[tuple[str, str], str]:
    """A MetricValueList's values by (namespace, name); MetricsUnavailable when it is not one."""
    try:
        listed = json.loads(body)
        return {
            (str(i["describedObject"].get("namespace") or ""), str(i["describedObject"]["name"])): str(i["value"])
            for i in listed["items"]
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        raise MetricsUnavailable(f"the custom metrics API answered no MetricValueList: {body[:200]!r}") from None


def unavailable(status: int, body: bytes) -> str:
    """Why the metrics API could not be read, and what to do."""
    try:
        message = str(json.loads(body).get("message") or "")
    except (ValueError, AttributeError):
        message = body[:200].decode("utf-8", "replace")
    service = f"kubectl get apiservice {VERSION}.{CUSTOM_METRICS_GROUP}"
    if status == 404:
        return (
            f"the custom metrics API ({CUSTOM_METRICS_GROUP}/{VERSION}) is not served in this cluster ({message}): "
            "install tf-metrics with the tensor-fusion chart (metricsApi.enabled, on by default), then check "
            f"`{service}`"
        )
    if status == 503:
        return (
            f"the custom metrics API is registered but does not answer ({message}): check `{service}`, tf-metrics' pods"
        )
    if status in (401, 403):
        return (
            f"not allowed to read the custom metrics API: {message} (the chart's <release>-metrics-reader ClusterRole "
            "grants it; namespace viewers have it through the view role)"
        )
    return f"the custom metrics API answered HTTP {status}: {message}"


def pod_grants(pods: Iterable[RawObject]) -> list[Grant]:
    """The grants of the pods that hold one (bound, not finished, with an allocation that decodes)."""
    grants = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        text = (meta.get("annotations") or {}).get(SystemAnnotation.ALLOCATION.value)
        if not text or status.get("phase") in TERMINAL:
            continue
        try:
            granted = allocation.decode(text)
        except DomainError:
            continue  # the extender and the admission policy keep these out; nothing to show
        gpus = granted.gpus
        grants.append(
            Grant(
                namespace=str(meta.get("namespace") or ""),
                pod=str(meta.get("name") or ""),
                node=granted.node,
                tflops_request=sum(g.tflops_request for g in gpus),
                tflops_limit=sum(g.tflops_limit for g in gpus),
                vram_request=sum(g.vram_request for g in gpus),
                vram_limit=sum(g.vram_limit for g in gpus),
            )
        )
    return sorted(grants, key=lambda g: (g.namespace, g.pod))


def inventories(nodes: Iterable[RawObject]) -> Iterator[tuple[RawObject, inventory.NodeInventory]]:
    """Each node with a readable GPU inventory, and that inventory (an unreadable one is skipped)."""
    for node in nodes:
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(SystemAnnotation.NODE_INVENTORY.value)
        if not text:
            continue
        try:
            yield node, inventory.decode(text)
        except DomainError:
            continue


def node_capacity(nodes: Iterable[RawObject]) -> dict[str, tuple[int, int, int]]:
    """(GPUs, milli-TFLOPS, VRAM bytes) of each node with an inventory: its schedulable GPUs (MIG units, not
    the GPUs in MIG mode that hold them)."""
    found = {}
    for _, published in inventories(nodes):
        gpus = [g for g in published.gpus if not g.mig]
        found[published.node] = (len(gpus), sum(g.tflops for g in gpus), sum(g.vram for g in gpus))
    return found


def pods_table(grants: Sequence[Grant], used: Mapping[GpuMetric, Mapping[tuple[str, str], str]]) -> str:
    """One line per pod: its grant, its use and its use as a share of its TFLOPS limit."""
    if not grants:
        return "no GPU pod holds a grant here"
    rows = [("NAMESPACE", "POD", "NODE", "TFLOPS REQ/LIMIT", "TFLOPS USED", "VRAM REQ/LIMIT", "VRAM USED", "GPU%")]
    for g in grants:
        key = (g.namespace, g.pod)
        tflops, vram, share = (
            used.get(m, {}).get(key) for m in (GpuMetric.TFLOPS, GpuMetric.VRAM_BYTES, GpuMetric.UTILIZATION)
        )
        rows.append((
            g.namespace, g.pod, g.node,
            f"{humanize_tflops(g.tflops_request)}/{humanize_tflops(g.tflops_limit)}",
            NONE if tflops is None else humanize_tflops(parse_milli(tflops)),
            f"{humanize_bytes(g.vram_request)}/{humanize_bytes(g.vram_limit)}",
            NONE if vram is None else humanize_bytes(parse_bytes(vram)),
            NONE if share is None else f"{round(parse_milli(share) / 1000)}%",
        ))  # fmt: skip
    return table(rows)


def nodes_table(
    capacity: Mapping[str, tuple[int, int, int]],
    grants: Sequence[Grant],
    used: Mapping[GpuMetric, Mapping[tuple[str, str], str]],
) -> str:
    """One line per GPU node: what its GPUs offer, what pods reserved there, what they (and any process) use."""
    if not capacity:
        return "no node publishes a GPU inventory (is the device plugin running on the GPU nodes?)"
    rows = [("NODE", "GPUS", "TFLOPS RESERVED/CAPACITY", "TFLOPS USED", "VRAM RESERVED/CAPACITY", "VRAM USED")]
    for node, (gpus, tflops_cap, vram_cap) in sorted(capacity.items()):
        on_node = [g for g in grants if g.node == node]
        tflops, vram = (used.get(m, {}).get(("", node)) for m in (GpuMetric.TFLOPS, GpuMetric.VRAM_BYTES))
        rows.append((
            node, str(gpus),
            f"{humanize_tflops(sum(g.tflops_request for g in on_node))}/{humanize_tflops(tflops_cap)}",
            NONE if tflops is None else humanize_tflops(parse_milli(tflops)),
            f"{humanize_bytes(sum(g.vram_request for g in on_node))}/{humanize_bytes(vram_cap)}",
            NONE if vram is None else humanize_bytes(parse_bytes(vram)),
        ))  # fmt: skip
    return table(rows)


def table(rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart, as kubectl prints."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)
