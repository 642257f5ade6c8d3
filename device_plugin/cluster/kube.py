"""The real :class:`~device_plugin.cluster.gateway.KubeGateway`: the one device-plugin module importing ``kubernetes``.

Every call goes through :mod:`tf_shell.kube.client` (raw JSON, the one error taxonomy, drained
responses, no hidden retries), so the plugin reduces exactly what the API server sent, the same
shape the fake gateway serves in tests. Every call blocks; callers run them in threads.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from functools import partial
from typing import Final

from kubernetes import client

from tf_shell.kube.api import Listing, RawObject, WatchEvent
from tf_shell.kube.client import CALL_TIMEOUT, api_client, call, drained, json_body, listing, watching
from vgpu.timefmt import rfc3339

# (connect, read) seconds. Allocate waits on the pod LIST (and concurrent Allocates share it), so a
# hung API server must turn into an error the allocator falls back from, quickly; other calls are
# off the kubelet's path and may take the shared CALL_TIMEOUT.
LIST_TIMEOUT: Final = (2.0, 5.0)
EVENT_COMPONENT: Final = "tensor-fusion-device-plugin"


def connect(kubeconfig: str | None) -> KubeApi:
    """The gateway over the kubeconfig at that path, else in-cluster config, else ~/.kube/config."""
    return KubeApi(api_client(kubeconfig))


class KubeApi:
    """KubeGateway over one ApiClient (thread-safe: the pod informer and the loop's worker threads share it)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)

    def list_pods(self, node: str) -> Listing:
        pods = partial(self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
        return listing(f"list pods on node {node}", pods, LIST_TIMEOUT)

    def watch_pods(self, node: str, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        pods = partial(self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
        return watching(f"watch pods on node {node}", pods, resource_version, timeout_seconds)

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> RawObject:
        body = {"metadata": {"annotations": dict(annotations)}}
        return call(
            f"patch pod {namespace}/{name}",
            lambda: json_body(
                self._core.patch_namespaced_pod(
                    name, namespace, body, _preload_content=False, _request_timeout=CALL_TIMEOUT
                )
            ),
        )

    def get_node(self, name: str) -> RawObject:
        return call(
            f"get node {name}",
            lambda: json_body(self._core.read_node(name, _preload_content=False, _request_timeout=CALL_TIMEOUT)),
        )

    def patch_node(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> None:
        body = {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}}
        call(
            f"patch node {name}",
            lambda: drained(self._core.patch_node(name, body, _preload_content=False, _request_timeout=CALL_TIMEOUT)),
        )

    def patch_node_resources(self, name: str, resources: Mapping[str, str]) -> None:
        body = {"status": {"capacity": dict(resources), "allocatable": dict(resources)}}
        call(
            f"patch node {name} status",
            lambda: drained(
                self._core.patch_node_status(name, body, _preload_content=False, _request_timeout=CALL_TIMEOUT)
            ),
        )

    def record_node_event(self, node: str, reason: str, message: str, *, warning: bool, key: str) -> None:
        call(
            f"event on node {node}",
            lambda: drained(
                self._core.create_namespaced_event(
                    "default",
                    node_event(node, reason, message, warning=warning, key=key),  # type: ignore[arg-type]  # a plain dict: the client round-trips it through its model
                    _preload_content=False,
                    _request_timeout=CALL_TIMEOUT,
                )
            ),
        )

    def record_pod_event(
        self, namespace: str, name: str, uid: str, node: str, reason: str, message: str, *, warning: bool, key: str
    ) -> None:
        call(
            f"event on pod {namespace}/{name}",
            lambda: drained(
                self._core.create_namespaced_event(
                    namespace,
                    pod_event(namespace, name, uid, node, reason, message, warning=warning, key=key),  # type: ignore[arg-type]  # a plain dict: the client round-trips it through its model
                    _preload_content=False,
                    _request_timeout=CALL_TIMEOUT,
                )
            ),
        )


def pod_event(
    namespace: str, name: str, uid: str, node: str, reason: str, message: str, *, warning: bool, key: str
) -> RawObject:
    """The Event posted about the pod ``namespace/name`` (``uid``), from the plugin on ``node``, in its namespace,
    named ``<pod>.<key>``."""
    involved = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}
    return _event(namespace, name, involved, node, reason, message, warning=warning, key=key)


def node_event(node: str, reason: str, message: str, *, warning: bool, key: str) -> RawObject:
    """The Event posted about ``node``, in the ``default`` namespace, named ``<node>.<key>``."""
    involved = {"apiVersion": "v1", "kind": "Node", "name": node}
    return _event("default", node, involved, node, reason, message, warning=warning, key=key)


def _event(
    namespace: str, about: str, involved: RawObject, node: str, reason: str, message: str, *, warning: bool, key: str
) -> RawObject:
    now = rfc3339(time.time())
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{about}.{key}", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": "Warning" if warning else "Normal",
        "source": {"component": EVENT_COMPONENT, "host": node},
        "reportingComponent": EVENT_COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
