"""The extender's real KubeGateway: lists, watches, pod patches, Bindings, Events and its Lease via the official client.

The only place the extender's scheduling side touches ``kubernetes``. Responses are read as raw
JSON (``_preload_content=False``) and never deserialised into the client's models: the cache reads
a few fields of each object, and model deserialisation of 50,000 pods would cost seconds and
hundreds of MB. Errors become :class:`GatewayError` with the HTTP status (410 on a watch becomes
:class:`GoneError`, no answer within the call's timeout :class:`GatewayTimeout`), so callers branch on
types and status codes, never on message strings. A response whose body is not needed is still read
to its end and released, or its connection never returns to the pool. urllib3's own retries are off:
every caller retries in its own loop, and a hidden retry would multiply a call's timeout (a GET to a
stalled API server took four timeouts, not one).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError, MaxRetryError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from scheduler_extender.gateway import (
    GatewayError,
    GatewayTimeout,
    GoneError,
    Kind,
    Listing,
    PodEvent,
    RawObject,
    WatchEvent,
    annotation_patch,
    annotation_removal,
    binding_body,
    event_body,
    eviction_body,
    nomination_patch,
)
from vgpu.names import CRD_GROUP, CRD_VERSION

log = logging.getLogger(__name__)

MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
# (connect, read) seconds for single calls; a watch reads for its own timeout plus this slack.
CALL_TIMEOUT: Final = (5.0, 15.0)
LIST_TIMEOUT: Final = (5.0, 120.0)  # a LIST of every pod in a big cluster takes a while to read
WATCH_SLACK: Final = 30.0
T = TypeVar("T")
PatchBody = RawObject | list[RawObject]  # a merge patch or a JSON patch


def api_client(kubeconfig: str | None, pool_size: int = 32) -> client.ApiClient:
    """An ApiClient from the kubeconfig at that path, else in-cluster config, else ~/.kube/config."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = pool_size
    configuration.retries = 0
    return client.ApiClient(configuration)


def _call(what: str, fn: Callable[[], T], timeout: float | tuple[float, float] = CALL_TIMEOUT) -> T:
    try:
        return fn()
    except ApiException as exc:
        if exc.status == 410:
            raise GoneError(f"{what}: {exc.reason}") from None
        raise GatewayError(f"{what}: HTTP {exc.status} {exc.reason}: {_message(exc)}", exc.status) from None
    except (HTTPError, OSError) as exc:
        cause = exc.reason if isinstance(exc, MaxRetryError) else exc
        if isinstance(cause, Urllib3Timeout | TimeoutError):
            raise GatewayTimeout(
                f"{what}: the API server did not answer within {_seconds(timeout)} (stalled?)"
            ) from None
        raise GatewayError(f"{what}: {exc.__class__.__name__}: {exc}") from None


def _seconds(timeout: float | tuple[float, float]) -> str:
    if isinstance(timeout, tuple):
        return f"{timeout[0]:g}s to connect and {timeout[1]:g}s to read"
    return f"{timeout:.1f}s"


def _drained(response: Any) -> None:
    """Read the rest of a response whose body is not needed and give its connection back to the pool."""
    try:
        response.drain_conn()
    finally:
        response.release_conn()


def _message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return str(exc.body or "")[:200]
    return str(body.get("message") or "") if isinstance(body, dict) else ""


def _json(response: Any) -> RawObject:
    data = json.loads(response.data)
    if not isinstance(data, dict):
        raise GatewayError(f"unexpected response: {str(data)[:100]}")
    return data


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
        lister = self._lister(kind)
        body = _call(
            f"list {kind}s", lambda: _json(lister(_preload_content=False, _request_timeout=LIST_TIMEOUT)), LIST_TIMEOUT
        )
        items = body.get("items") or []
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        return Listing(items=[i for i in items if isinstance(i, dict)], resource_version=rv)

    def watch(self, kind: Kind, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        lister = self._lister(kind)
        limit = (5.0, timeout_seconds + WATCH_SLACK)
        response = _call(
            f"watch {kind}s",
            lambda: lister(
                watch=True,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                allow_watch_bookmarks=True,
                _preload_content=False,
                _request_timeout=limit,
            ),
            limit,
        )
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                event = json.loads(line)
                kind_of_event, obj = event.get("type"), event.get("object") or {}
                if kind_of_event == "ERROR":
                    if obj.get("code") == 410:
                        raise GoneError(str(obj.get("message") or "resourceVersion too old"))
                    raise GatewayError(f"watch {kind}s: {obj.get('message')}", obj.get("code"))
                if kind_of_event in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
                    yield WatchEvent(kind_of_event, obj)
        except (HTTPError, OSError, ValueError) as exc:
            raise GatewayError(f"watch {kind}s: {exc.__class__.__name__}: {exc}") from None
        finally:
            response.release_conn()

    def get_pod(self, namespace: str, name: str, *, timeout: float | None = None) -> RawObject | None:
        limit = CALL_TIMEOUT if timeout is None else timeout
        try:
            return _call(
                f"get pod {namespace}/{name}",
                lambda: _json(
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
        labels: Mapping[str, str] | None = None,
        resource_version: str | None = None,
        timeout: float | None = None,
    ) -> None:
        body = annotation_patch(uid, changes, resource_version, labels)
        self._patch_pod(namespace, name, body, MERGE_PATCH, timeout)

    def list_pods(self, label_selector: str, *, timeout: float | None = None) -> Sequence[RawObject]:
        limit = CALL_TIMEOUT if timeout is None else timeout
        listed = _call(
            f"list pods {label_selector}",
            lambda: _json(  # no resourceVersion: a consistent read, never a stale cache
                self.core.list_pod_for_all_namespaces(
                    label_selector=label_selector, _preload_content=False, _request_timeout=limit
                )
            ),
            limit,
        )
        return list(listed.get("items") or [])

    def remove_pod_annotation(
        self, namespace: str, name: str, uid: str, key: str, value: str, *, timeout: float | None = None
    ) -> None:
        self._patch_pod(namespace, name, annotation_removal(uid, key, value), JSON_PATCH, timeout)

    def _patch_pod(self, namespace: str, name: str, body: PatchBody, content_type: str, timeout: float | None) -> None:
        limit = CALL_TIMEOUT if timeout is None else timeout
        _call(
            f"patch pod {namespace}/{name}",
            lambda: _drained(
                self.core.patch_namespaced_pod(
                    name, namespace, body, _content_type=content_type, _preload_content=False, _request_timeout=limit
                )
            ),
            limit,
        )

    def get_lease(self, namespace: str, name: str) -> RawObject | None:
        try:
            return _call(
                f"get lease {namespace}/{name}",
                lambda: _json(
                    self.leases.read_namespaced_lease(
                        name, namespace, _preload_content=False, _request_timeout=CALL_TIMEOUT
                    )
                ),
            )
        except GatewayError as exc:
            if exc.status == 404:
                return None
            raise

    def create_lease(self, namespace: str, body: RawObject) -> None:
        _call(
            f"create lease in {namespace}",
            lambda: _drained(
                self.leases.create_namespaced_lease(
                    namespace,
                    body,  # type: ignore[arg-type]  # a plain dict is sent as is
                    _preload_content=False,
                    _request_timeout=CALL_TIMEOUT,
                )
            ),
        )

    def replace_lease(self, namespace: str, name: str, body: RawObject) -> None:
        _call(
            f"update lease {namespace}/{name}",
            lambda: _drained(
                self.leases.replace_namespaced_lease(
                    name,
                    namespace,
                    body,  # type: ignore[arg-type]  # a plain dict is sent as is
                    _preload_content=False,
                    _request_timeout=CALL_TIMEOUT,
                )
            ),
        )

    def bind(self, namespace: str, name: str, uid: str, node: str, *, timeout: float | None = None) -> None:
        body = binding_body(namespace, name, uid, node)
        limit = CALL_TIMEOUT if timeout is None else timeout
        _call(
            f"bind pod {namespace}/{name} to {node}",
            lambda: _drained(
                self.core.create_namespaced_pod_binding(
                    name,
                    namespace,
                    body,  # type: ignore[arg-type]  # a plain dict is sent as is
                    _preload_content=False,
                    _request_timeout=limit,
                )
            ),
            limit,
        )

    def record_event(self, event: PodEvent) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        name = f"{event.pod_name}.{time.time_ns():x}{uuid.uuid4().hex[:6]}"
        body = event_body(event, now, name)
        _call(
            f"event on pod {event.namespace}/{event.pod_name}",
            lambda: _drained(
                self.core.create_namespaced_event(
                    event.namespace,
                    body,  # type: ignore[arg-type]  # a plain dict is sent as is
                    _preload_content=False,
                    _request_timeout=CALL_TIMEOUT,
                )
            ),
        )

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        body = eviction_body(namespace, name, uid)
        try:
            _call(
                f"evict pod {namespace}/{name}",
                lambda: _drained(
                    self.core.create_namespaced_pod_eviction(
                        name,
                        namespace,
                        body,  # type: ignore[arg-type]  # a plain dict is sent as is
                        _preload_content=False,
                        _request_timeout=CALL_TIMEOUT,
                    )
                ),
            )
        except GatewayError as exc:
            if exc.status != 404:
                raise

    def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        _call(
            f"nominate {node} for pod {namespace}/{name}",
            lambda: _drained(
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
        body = _call(
            f"list {plural}",
            lambda: _json(
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
        _call(f"patch {plural}/status {where}", lambda: _drained(patch()))

    # --- the autoscaler's ----------------------------------------------------------------------------
    def get_controller(self, kind: str, namespace: str, name: str) -> RawObject | None:
        read = {
            "ReplicaSet": self.apps.read_namespaced_replica_set,
            "Deployment": self.apps.read_namespaced_deployment,
            "StatefulSet": self.apps.read_namespaced_stateful_set,
        }[kind]
        return _absent_is_none(f"get {kind} {namespace}/{name}", lambda: read(name, namespace, **_RAW))

    def list_endpoint_slices(self, namespace: str, service: str) -> Sequence[RawObject]:
        return _items(
            f"list endpointslices of service {namespace}/{service}",
            lambda: self.discovery.list_namespaced_endpoint_slice(
                namespace,
                label_selector=f"{SERVICE_NAME_LABEL}={service}",
                _preload_content=False,
                _request_timeout=CALL_TIMEOUT,
            ),
        )

    def list_hpas(self, label_selector: str) -> Sequence[RawObject]:
        return _items(
            f"list horizontalpodautoscalers {label_selector!r}",
            lambda: self.autoscaling.list_horizontal_pod_autoscaler_for_all_namespaces(
                label_selector=label_selector, _preload_content=False, _request_timeout=LIST_TIMEOUT
            ),
        )

    def upsert_hpa(self, namespace: str, body: RawObject) -> None:
        api = self.autoscaling
        _upsert(
            f"horizontalpodautoscaler {namespace}/{body['metadata']['name']}",
            body,
            create=lambda b: api.create_namespaced_horizontal_pod_autoscaler(namespace, b, **_RAW),  # type: ignore[arg-type]  # a plain dict is sent as is
            read=lambda n: api.read_namespaced_horizontal_pod_autoscaler(n, namespace, **_RAW),
            replace=lambda n, b: api.replace_namespaced_horizontal_pod_autoscaler(n, namespace, b, **_RAW),  # type: ignore[arg-type]  # a plain dict is sent as is
        )

    def delete_hpa(self, namespace: str, name: str) -> None:
        try:
            _call(
                f"delete horizontalpodautoscaler {namespace}/{name}",
                lambda: _drained(self.autoscaling.delete_namespaced_horizontal_pod_autoscaler(name, namespace, **_RAW)),
            )
        except GatewayError as exc:
            if exc.status != 404:
                raise

    def list_config_maps(self, namespace: str, label_selector: str) -> Sequence[RawObject]:
        return _items(
            f"list configmaps {label_selector!r} in {namespace}",
            lambda: self.core.list_namespaced_config_map(
                namespace, label_selector=label_selector, _preload_content=False, _request_timeout=LIST_TIMEOUT
            ),
        )

    def upsert_config_map(self, namespace: str, body: RawObject) -> None:
        core = self.core
        _upsert(
            f"configmap {namespace}/{body['metadata']['name']}",
            body,
            create=lambda b: core.create_namespaced_config_map(namespace, b, **_RAW),  # type: ignore[arg-type]  # a plain dict is sent as is
            read=lambda n: core.read_namespaced_config_map(n, namespace, **_RAW),
            replace=lambda n, b: core.replace_namespaced_config_map(n, namespace, b, **_RAW),  # type: ignore[arg-type]  # a plain dict is sent as is
        )


SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"  # the label tying an EndpointSlice to its Service
_RAW: Final[dict[str, Any]] = {"_preload_content": False, "_request_timeout": CALL_TIMEOUT}


def _absent_is_none(what: str, read: Callable[[], Any]) -> RawObject | None:
    try:
        return _call(what, lambda: _json(read()))
    except GatewayError as exc:
        if exc.status == 404:
            return None
        raise


def _items(what: str, lister: Callable[[], Any]) -> list[RawObject]:
    body = _call(what, lambda: _json(lister()), LIST_TIMEOUT)
    return [i for i in body.get("items") or [] if isinstance(i, dict)]


def _upsert(
    what: str,
    body: RawObject,
    *,
    create: Callable[[RawObject], Any],
    read: Callable[[str], Any],
    replace: Callable[[str, RawObject], Any],
) -> None:
    """Create ``body``; when one of its name exists, replace it at the resourceVersion just read (a 409 from
    a concurrent writer surfaces: the caller's next pass retries)."""
    try:
        _call(f"create {what}", lambda: _drained(create(body)))
        return
    except GatewayError as exc:
        if exc.status != 409:
            raise
    name = str(body["metadata"]["name"])
    current = _call(f"get {what}", lambda: _json(read(name)))
    replaced = {**body, "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
    _call(f"replace {what}", lambda: _drained(replace(name, replaced)))
