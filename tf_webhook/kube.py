"""The webhook's Kubernetes reads and writes: WorkloadProfiles, GPUPools, TensorFusionWorkloads.

Implements the ``tf_webhook.cluster`` ports through :mod:`tf_shell.kube.client`. Every call has a
short timeout because it runs inside an admission request the API server gives up on after
``timeoutSeconds``; a 404 is "not found" (None), any other failure is ClusterUnavailable with a reason.
GPUPools are read from the watch-backed cache while it is trusted (``pool_cache.py``, fed by
:class:`PoolSource`), else listed.
Workload updates are get → merge → replace with the resourceVersion, retried on 409, so two pods
admitted at once cannot lose each other's fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, Final, TypeVar

from kubernetes import client

from tf_shell.kube.api import GatewayError, Listing, WatchEvent
from tf_shell.kube.client import (
    api_client,
    call,
    drained,
    json_body,
    listing,
    watching,
)
from tf_webhook.cluster import ClusterUnavailable
from tf_webhook.pool_cache import PoolCache
from tf_webhook.workload import WorkloadUpsert, new_object, updated_object
from vgpu.names import CRD_GROUP, CRD_VERSION, PLURAL_GPU_POOL, PLURAL_WORKLOAD, PLURAL_WORKLOAD_PROFILE

_CONFLICT_RETRIES: Final = 5
T = TypeVar("T")


class KubeAdmission:
    """AdmissionReads + WorkloadWrites over one ApiClient (thread-safe; FastAPI calls it from a pool).
    ``pools``: the cache GPUPools are read from while it is trusted; without it every read lists them."""

    def __init__(self, api: client.CustomObjectsApi, timeout_s: float, pools: PoolCache | None = None) -> None:
        self._api = api
        self._timeout = timeout_s
        self._raw: dict[str, Any] = {"_preload_content": False, "_request_timeout": timeout_s}
        self._pools = pools

    @classmethod
    def connect(cls, kubeconfig: str | None, timeout_s: float, pools: PoolCache | None = None) -> KubeAdmission:
        """In-cluster credentials unless ``kubeconfig`` names a file (development, end-to-end tests)."""
        return cls(client.CustomObjectsApi(api_client(kubeconfig)), timeout_s, pools)

    def pool_source(self) -> PoolSource:
        """What the pool cache's informer lists and watches, over this client."""
        return PoolSource(self._api)

    def workload_profile(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._get(PLURAL_WORKLOAD_PROFILE, namespace, name)

    def workload(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._get(PLURAL_WORKLOAD, namespace, name)

    def gpu_pools(self, *, fresh: bool = False) -> Sequence[Mapping[str, Any]]:
        held = None if fresh or self._pools is None else self._pools.held()
        if held is not None:
            return held
        what = f"list {PLURAL_GPU_POOL}"
        try:
            return listing(what, partial(_pools, self._api), self._timeout).items
        except GatewayError as exc:
            raise ClusterUnavailable(_reason(what, exc)) from exc

    def upsert_workload(self, upsert: WorkloadUpsert) -> None:
        where = f"{PLURAL_WORKLOAD} {upsert.namespace}/{upsert.name}"
        try:
            for _ in range(_CONFLICT_RETRIES):
                if self._attempt(upsert):
                    return
        except GatewayError as exc:
            raise ClusterUnavailable(_reason(f"write {where}", exc)) from exc
        raise ClusterUnavailable(f"write {where}: still conflicting after {_CONFLICT_RETRIES} attempts")

    def _attempt(self, upsert: WorkloadUpsert) -> bool:
        """Create, or merge into what is there; False on a 409 (someone wrote first: read and merge again)."""
        existing = self._get(PLURAL_WORKLOAD, upsert.namespace, upsert.name)
        scope = (CRD_GROUP, CRD_VERSION, upsert.namespace, PLURAL_WORKLOAD)
        try:
            if existing is None:
                body = new_object(upsert)
                self._call(
                    f"create {PLURAL_WORKLOAD}",
                    lambda: drained(self._api.create_namespaced_custom_object(*scope, body, **self._raw)),
                )
            elif (changed := updated_object(existing, upsert)) is not None:
                self._call(
                    f"replace {PLURAL_WORKLOAD}",
                    lambda: drained(
                        self._api.replace_namespaced_custom_object(*scope, upsert.name, changed, **self._raw)
                    ),
                )
        except GatewayError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def _get(self, plural: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        what = f"get {plural} {namespace}/{name}"
        try:
            return self._call(
                what,
                lambda: json_body(
                    self._api.get_namespaced_custom_object(CRD_GROUP, CRD_VERSION, namespace, plural, name, **self._raw)
                ),
            )
        except GatewayError as exc:
            if exc.status == 404:
                return None
            raise ClusterUnavailable(_reason(what, exc)) from exc

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        return call(what, fn, self._timeout)


class PoolSource:
    """Every GPUPool, listed and watched: the :class:`tf_shell.kube.list_watch.Source` of the pool cache."""

    def __init__(self, api: client.CustomObjectsApi) -> None:
        self._api = api

    def list(self) -> Listing:
        return listing(f"list {PLURAL_GPU_POOL}", partial(_pools, self._api))

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        return watching(f"watch {PLURAL_GPU_POOL}", partial(_pools, self._api), resource_version, timeout_seconds)


def _pools(api: client.CustomObjectsApi, **options: Any) -> Any:
    """The GPUPool collection's LIST (or watch, with ``watch=True``), unread: ``options`` say how."""
    return api.list_cluster_custom_object(CRD_GROUP, CRD_VERSION, PLURAL_GPU_POOL, **options)


def _reason(what: str, exc: GatewayError) -> str:
    """``what``, then the HTTP status and reason (or why there was none), once."""
    text = str(exc)
    return text if text.startswith(what) else f"{what}: {text}"
