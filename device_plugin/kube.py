"""The real :class:`~device_plugin.gateway.KubeGateway`: the one device-plugin module importing ``kubernetes``.

Pods are read as raw JSON (``_preload_content=False`` and the watch's ``raw_object``) so that the
plugin reduces exactly what the API server sent, the same shape the fake gateway serves in tests.
Every call blocks; callers run them in threads.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client
from kubernetes import config as _config
from kubernetes import watch as _watch
from kubernetes.client.exceptions import ApiException

from device_plugin.gateway import Json, WatchExpired, WatchKind

_WATCH_TIMEOUT_S = 60
# (connect, read) seconds. Allocate waits on the pod LIST (and concurrent Allocates share it), so a
# hung API server must turn into an error the allocator falls back from, quickly; other calls are
# off the kubelet's path and may take longer.
_LIST_TIMEOUT = (2.0, 5.0)
_CALL_TIMEOUT = (5.0, 15.0)
# The client's config loaders and watch helper are untyped; use them through Any.
config: Any = _config
watch: Any = _watch
_KINDS: frozenset[str] = frozenset({"ADDED", "MODIFIED", "DELETED"})
EVENT_COMPONENT = "tensor-fusion-device-plugin"


def _load(kubeconfig: str | None) -> None:
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
        return
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


class KubeApi:
    def __init__(self, kubeconfig: str | None = None) -> None:
        _load(kubeconfig)
        self._api = client.ApiClient()
        self._core = client.CoreV1Api(self._api)

    def _plain(self, obj: Any) -> Json:
        sanitize: Any = self._api.sanitize_for_serialization
        return cast(Json, sanitize(obj))

    def list_pods(self, node: str) -> tuple[list[Json], str]:
        response: Any = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False, _request_timeout=_LIST_TIMEOUT
        )
        data = json.loads(response.data)
        return list(data.get("items") or []), str(data["metadata"]["resourceVersion"])

    def watch_pods(self, node: str, resource_version: str, stop: threading.Event) -> Iterator[tuple[WatchKind, Json]]:
        w = watch.Watch()
        try:
            for event in w.stream(
                self._core.list_pod_for_all_namespaces,
                field_selector=f"spec.nodeName={node}",
                resource_version=resource_version,
                timeout_seconds=_WATCH_TIMEOUT_S,
                allow_watch_bookmarks=True,
            ):
                if stop.is_set():
                    return
                kind, raw = event["type"], event["raw_object"]
                if kind == "ERROR":
                    if raw.get("code") == 410:
                        raise WatchExpired(raw.get("message", "resource version expired"))
                    raise RuntimeError(f"pod watch error: {raw}")
                if kind in _KINDS:
                    yield cast(WatchKind, kind), raw
        except ApiException as exc:
            if exc.status == 410:
                raise WatchExpired(str(exc.reason)) from None
            raise
        finally:
            w.stop()

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> Json:
        body = {"metadata": {"annotations": dict(annotations)}}
        return self._plain(self._core.patch_namespaced_pod(name, namespace, body, _request_timeout=_CALL_TIMEOUT))

    def get_node(self, name: str) -> Json:
        return self._plain(self._core.read_node(name, _request_timeout=_CALL_TIMEOUT))

    def patch_node(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> None:
        self._core.patch_node(
            name,
            {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}},
            _request_timeout=_CALL_TIMEOUT,
        )

    def patch_node_resources(self, name: str, resources: Mapping[str, str]) -> None:
        body = {"status": {"capacity": dict(resources), "allocatable": dict(resources)}}
        self._core.patch_node_status(name, body, _request_timeout=_CALL_TIMEOUT)

    def record_node_event(self, node: str, reason: str, message: str, *, warning: bool) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{node}.{uuid.uuid4().hex[:12]}", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
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
        # Not read back as a model (the client's Event model is strict); the answer is drained so the
        # pooled connection is reused.
        core: Any = self._core  # a plain dict is sent as is; the raw answer is not a model
        response = core.create_namespaced_event("default", body, _preload_content=False, _request_timeout=_CALL_TIMEOUT)
        response.read()
        response.release_conn()
