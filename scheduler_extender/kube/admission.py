"""The webhook's Kubernetes reads and writes: WorkloadProfiles, GPUPools, TensorFusionWorkloads.

Implements the ``scheduler_extender.webhook.cluster`` ports with the official client. Every call
has a short timeout because it runs inside an admission request the API server gives up on after
``timeoutSeconds``; a 404 is "not found" (None), anything else is ClusterUnavailable with a reason.
Workload updates are get → merge → replace with the resourceVersion, retried on 409, so two pods
admitted at once cannot lose each other's fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from scheduler_extender.webhook.cluster import ClusterUnavailable
from scheduler_extender.webhook.workload import WorkloadUpsert, new_object, updated_object
from vgpu.names import CRD_GROUP, CRD_VERSION, PLURAL_GPU_POOL, PLURAL_WORKLOAD, PLURAL_WORKLOAD_PROFILE

_CONFLICT_RETRIES: Final = 5


class KubeAdmission:
    """AdmissionReads + WorkloadWrites over one ApiClient (thread-safe; FastAPI calls it from a pool)."""

    def __init__(self, api: client.CustomObjectsApi, timeout_s: float) -> None:
        self._api = api
        self._timeout = timeout_s

    @classmethod
    def connect(cls, kubeconfig: str | None, timeout_s: float) -> KubeAdmission:
        """In-cluster credentials unless ``kubeconfig`` names a file (development, end-to-end tests)."""
        cfg = client.Configuration()
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cls(client.CustomObjectsApi(client.ApiClient(cfg)), timeout_s)

    def workload_profile(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._get(PLURAL_WORKLOAD_PROFILE, namespace, name)

    def workload(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._get(PLURAL_WORKLOAD, namespace, name)

    def gpu_pools(self) -> Sequence[Mapping[str, Any]]:
        try:
            listed = self._api.list_cluster_custom_object(
                CRD_GROUP, CRD_VERSION, PLURAL_GPU_POOL, _request_timeout=self._timeout
            )
        except (ApiException, HTTPError) as exc:
            raise ClusterUnavailable(f"list {PLURAL_GPU_POOL}: {_reason(exc)}") from exc
        items = listed.get("items") if isinstance(listed, Mapping) else None
        return [item for item in items or () if isinstance(item, Mapping)]

    def upsert_workload(self, upsert: WorkloadUpsert) -> None:
        where = f"{PLURAL_WORKLOAD} {upsert.namespace}/{upsert.name}"
        try:
            for _ in range(_CONFLICT_RETRIES):
                if self._attempt(upsert):
                    return
        except (ApiException, HTTPError) as exc:
            raise ClusterUnavailable(f"write {where}: {_reason(exc)}") from exc
        raise ClusterUnavailable(f"write {where}: still conflicting after {_CONFLICT_RETRIES} attempts")

    def _attempt(self, upsert: WorkloadUpsert) -> bool:
        """Create, or merge into what is there; False on a 409 (someone wrote first: read and merge again)."""
        existing = self._get(PLURAL_WORKLOAD, upsert.namespace, upsert.name)
        scope = (CRD_GROUP, CRD_VERSION, upsert.namespace, PLURAL_WORKLOAD)
        try:
            if existing is None:
                self._api.create_namespaced_custom_object(*scope, new_object(upsert), _request_timeout=self._timeout)
            elif (body := updated_object(existing, upsert)) is not None:
                self._api.replace_namespaced_custom_object(*scope, upsert.name, body, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def _get(self, plural: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            found = self._api.get_namespaced_custom_object(
                CRD_GROUP, CRD_VERSION, namespace, plural, name, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ClusterUnavailable(f"get {plural} {namespace}/{name}: {_reason(exc)}") from exc
        except HTTPError as exc:
            raise ClusterUnavailable(f"get {plural} {namespace}/{name}: {_reason(exc)}") from exc
        return found if isinstance(found, Mapping) else None


def _reason(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return exc.__class__.__name__
