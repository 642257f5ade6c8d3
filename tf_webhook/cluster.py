"""What the webhook needs from the cluster, as ports the decision can be tested against without one.

The Kubernetes implementation lives in ``tf_webhook.kube`` (the only package
allowed to import ``kubernetes``); tests pass plain dictionaries. "Not found" is a value (None),
"could not ask" is an exception, because the two deserve different answers to the user.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tf_webhook.workload import WorkloadUpsert


class ClusterUnavailable(Exception):
    """The API server could not be read or written (timeout, RBAC, 5xx); the message says which."""


class AdmissionReads(Protocol):
    """Raw JSON of the objects a pod's annotations refer to."""

    def workload_profile(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def workload(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def gpu_pools(self, *, fresh: bool = False) -> Sequence[Mapping[str, Any]]:
        """Every GPUPool, possibly from a watch's cache (a moment behind); ``fresh``: as the API server holds
        them now, which the decision asks for before it refuses a pod on what the pools say."""
        ...


class WorkloadWrites(Protocol):
    """Create a TensorFusionWorkload or merge a pod's spec into it (retrying on conflicts)."""

    def upsert_workload(self, upsert: WorkloadUpsert) -> None: ...


class AdmissionCluster(AdmissionReads, WorkloadWrites, Protocol):
    """Everything the webhook's HTTP shell needs from the cluster."""
