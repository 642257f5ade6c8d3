"""The extender's real KubeGateway: lists, watches, pod patches, Bindings, Events and its Lease.

Every call goes through :mod:`tf_shell.kube.client` (raw JSON, one error taxonomy, drained
responses, no hidden retries); this module only says which API each method calls with which body.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from kubernetes import client

from scheduler_extender.gateway import (
    Kind,
    PodEvent,
    annotation_patch,
    binding_body,
    event_body,
    eviction_body,
    nomination_patch,
)
from tf_shell.kube.api import GatewayError, Listing, RawObject, WatchEvent
from tf_shell.kube.client import (
    CALL_TIMEOUT,
    LIST_TIMEOUT,
    MERGE_PATCH,
    RAW,
    SERVICE_NAME_LABEL,
    absent_is_none,
    call,
    drained,
    items,
    json_body,
    listing,
    send,
    upsert,
    watching,
)
from vgpu.names import CRD_GROUP, CRD_VERSION
from vgpu.timefmt import rfc3339

log = logging.getLogger(__name__)

PatchBody = RawObject | list[RawObject]  # a merge patch or a JSON patch


class KubernetesGateway:
    """KubeGateway over one ApiClient (thread-safe: the informers and the bind threads share it)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.leases = client.CoordinationV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.autoscaling = client.AutoscalingV2Api(api)
        self.discovery = client.DiscoveryV1Api(api)

    def _lister(self, kind: Kind) -> Callable[..., Any]:
        return self.core.list_node if kind is Kind.NODE else self.core.list_pod_for_all_namespaces

    def list(self, kind: Kind) -> Listing:
        return listing(f"list {kind}s", self._lister(kind))

    def watch(self, kind: Kind, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        return watching(f"watch {kind}s", self._lister(kind), resource_version, timeout_seconds)

    def get_pod(self, namespace: str, name: str, *, timeout: float | None = None) -> RawObject | None:
        limit = _limit(timeout)
        try:
            return call(
                f"get pod {namespace}/{name}",
                lambda: json_body(
                    self.core.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=limit)
                ),
                limit,
            )
        except GatewayError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        uid: str,
        changes: Mapping[str, str | None],
        *,
        resource_version: str | None = None,
        timeout: float | None = None,
    ) -> None:
        body = annotation_patch(uid, changes, resource_version)
        self._patch_pod(namespace, name, body, MERGE_PATCH, timeout)

    def _patch_pod(self, namespace: str, name: str, body: PatchBody, content_type: str, timeout: float | None) -> None:
        limit = _limit(timeout)
        call(
            f"patch pod {namespace}/{name}",
            lambda: drained(
                self.core.patch_namespaced_pod(
                    name, namespace, body, _content_type=content_type, _preload_content=False, _request_timeout=limit
                )
            ),
            limit,
        )

    def get_lease(self, namespace: str, name: str, *, timeout: float | None = None) -> RawObject | None:
        limit = _limit(timeout)
        try:
            return call(
                f"get lease {namespace}/{name}",
                lambda: json_body(
                    self.leases.read_namespaced_lease(name, namespace, _preload_content=False, _request_timeout=limit)
                ),
                limit,
            )
        except GatewayError as exc:
            if exc.status == 404:
                return None
            raise

    def create_lease(self, namespace: str, body: RawObject, *, timeout: float | None = None) -> RawObject:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        return send(self.leases.api_client, "POST", path, body, f"create lease in {namespace}", _limit(timeout))

    def replace_lease(self, namespace: str, name: str, body: RawObject, *, timeout: float | None = None) -> RawObject:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        return send(self.leases.api_client, "PUT", path, body, f"update lease {namespace}/{name}", _limit(timeout))

    def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        *,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        resource_version: str | None = None,
        timeout: float | None = None,
    ) -> None:
        body = binding_body(
            namespace, name, uid, node, annotations=annotations, labels=labels, resource_version=resource_version
        )
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/binding"
        what = f"bind pod {namespace}/{name} to {node}"
        send(self.core.api_client, "POST", path, body, what, _limit(timeout))

    def record_event(self, event: PodEvent) -> None:
        now = rfc3339(time.time())
        name = f"{event.pod_name}.{time.time_ns():x}{uuid.uuid4().hex[:6]}"
        body = event_body(event, now, name)
        path = f"/api/v1/namespaces/{event.namespace}/events"
        send(self.core.api_client, "POST", path, body, f"event on pod {event.namespace}/{event.pod_name}", CALL_TIMEOUT)

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        body = eviction_body(namespace, name, uid)
        try:
            call(
                f"evict pod {namespace}/{name}",
                lambda: drained(
                    self.core.create_namespaced_pod_eviction(
                        name,
                        namespace,
                        body,  # type: ignore[arg-type]  # a plain dict: the client round-trips it through its model
                        _preload_content=False,
                        _request_timeout=CALL_TIMEOUT,
                    )
                ),
            )
        except GatewayError as exc:
            if exc.status != 404:
                raise

    def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        call(
            f"nominate {node} for pod {namespace}/{name}",
            lambda: drained(
                self.core.patch_namespaced_pod_status(
                    name,
                    namespace,
                    nomination_patch(uid, node),
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=CALL_TIMEOUT,
                )
            ),
        )

    def list_resources(self, plural: str) -> Sequence[RawObject]:
        body = call(
            f"list {plural}",
            lambda: json_body(
                self.custom.list_cluster_custom_object(
                    CRD_GROUP, CRD_VERSION, plural, _preload_content=False, _request_timeout=LIST_TIMEOUT
                )
            ),
            LIST_TIMEOUT,
        )
        return [i for i in body.get("items") or [] if isinstance(i, dict)]

    def patch_resource_status(self, plural: str, namespace: str | None, name: str, body: RawObject) -> None:
        options: dict[str, Any] = {
            "_content_type": MERGE_PATCH,
            "_preload_content": False,
            "_request_timeout": CALL_TIMEOUT,
        }

        def patch() -> Any:
            if namespace is None:
                return self.custom.patch_cluster_custom_object_status(
                    CRD_GROUP, CRD_VERSION, plural, name, body, **options
                )
            return self.custom.patch_namespaced_custom_object_status(
                CRD_GROUP, CRD_VERSION, namespace, plural, name, body, **options
            )

        where = name if namespace is None else f"{namespace}/{name}"
        call(f"patch {plural}/status {where}", lambda: drained(patch()))

    # --- the autoscaler's ----------------------------------------------------------------------------
    def get_controller(self, kind: str, namespace: str, name: str) -> RawObject | None:
        read = {
            "ReplicaSet": self.apps.read_namespaced_replica_set,
            "Deployment": self.apps.read_namespaced_deployment,
            "StatefulSet": self.apps.read_namespaced_stateful_set,
        }[kind]
        return absent_is_none(f"get {kind} {namespace}/{name}", lambda: read(name, namespace, **RAW))

    def list_endpoint_slices(self, namespace: str, service: str) -> Sequence[RawObject]:
        return items(
            f"list endpointslices of service {namespace}/{service}",
            lambda: self.discovery.list_namespaced_endpoint_slice(
                namespace,
                label_selector=f"{SERVICE_NAME_LABEL}={service}",
                _preload_content=False,
                _request_timeout=CALL_TIMEOUT,
            ),
        )

    def list_hpas(self, label_selector: str) -> Sequence[RawObject]:
        return items(
            f"list horizontalpodautoscalers {label_selector!r}",
            lambda: self.autoscaling.list_horizontal_pod_autoscaler_for_all_namespaces(
                label_selector=label_selector, _preload_content=False, _request_timeout=LIST_TIMEOUT
            ),
        )

    def upsert_hpa(self, namespace: str, body: RawObject) -> None:
        api = self.autoscaling
        upsert(
            f"horizontalpodautoscaler {namespace}/{body['metadata']['name']}",
            body,
            create=lambda b: api.create_namespaced_horizontal_pod_autoscaler(namespace, b, **RAW),  # type: ignore[arg-type]  # a plain dict: the client round-trips it through its model
            read=lambda n: api.read_namespaced_horizontal_pod_autoscaler(n, namespace, **RAW),
            replace=lambda n, b: api.replace_namespaced_horizontal_pod_autoscaler(n, namespace, b, **RAW),  # type: ignore[arg-type]  # a plain dict: the client round-trips it through its model
        )

    def delete_hpa(self, namespace: str, name: str) -> None:
        try:
            call(
                f"delete horizontalpodautoscaler {namespace}/{name}",
                lambda: drained(self.autoscaling.delete_namespaced_horizontal_pod_autoscaler(name, namespace, **RAW)),
            )
        except GatewayError as exc:
            if exc.status != 404:
                raise

    def list_config_maps(self, namespace: str, label_selector: str) -> Sequence[RawObject]:
        return items(
            f"list configmaps {label_selector!r} in {namespace}",
            lambda: self.core.list_namespaced_config_map(
                namespace, label_selector=label_selector, _preload_content=False, _request_timeout=LIST_TIMEOUT
            ),
        )

    def upsert_config_map(self, namespace: str, body: RawObject) -> None:
        core = self.core
        upsert(
            f"configmap {namespace}/{body['metadata']['name']}",
            body,
            create=lambda b: core.create_namespaced_config_map(namespace, b, **RAW),  # type: ignore[arg-type]  # a plain dict: the client round-trips it through its model
            read=lambda n: core.read_namespaced_config_map(n, namespace, **RAW),
            replace=lambda n, b: core.replace_namespaced_config_map(n, namespace, b, **RAW),  # type: ignore[arg-type]  # a plain dict: the client round-trips it through its model
        )


def _limit(timeout: float | None) -> float | tuple[float, float]:
    return CALL_TIMEOUT if timeout is None else timeout
