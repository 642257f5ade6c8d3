"""The port through which the extender talks to the Kubernetes API, and the bodies it sends.

The app, the binder and the informers depend on this Protocol only; ``scheduler_extender.kube`` is
the one real implementation and the tests use an in-memory fake that speaks the same protocol. Its
errors are the shared ones of :mod:`tf_shell.kube.api`. Request bodies are built by pure helpers
here, so both sides agree on them exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol

from tf_shell.kube.api import Listing, RawObject, WatchEvent


class Kind(StrEnum):
    """The kinds the extender lists and watches."""

    NODE = "Node"
    POD = "Pod"


@dataclass(frozen=True, slots=True, kw_only=True)
class PodEvent:
    """A Kubernetes Event about a pod (what ``kubectl describe pod`` shows)."""

    namespace: str
    pod_name: str
    pod_uid: str
    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Warning"
    component: str = field(default="tensor-fusion-scheduler")


class KubeGateway(Protocol):
    """Everything the extender asks of the API server."""

    def list(self, kind: Kind) -> Listing:
        """All objects of a kind, with the resourceVersion of the list."""
        ...

    def watch(self, kind: Kind, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Changes since ``resource_version`` until the server ends the watch. Raises GoneError on 410.

        BOOKMARK events carry only a newer resourceVersion to resume from.
        """
        ...

    # ``timeout``: the most seconds the call may take in all (GatewayTimeout after it); None: the
    # gateway's own default. The binder cuts it from its deadline (scheduler_extender/deadline.py).

    def get_pod(self, namespace: str, name: str, *, timeout: float | None = None) -> RawObject | None:
        """One pod, or None when it does not exist."""
        ...

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
        """Merge-patch annotations (None removes one), with the UID as precondition
        (409 if it differs) and, when given, the resourceVersion the pod was read at (409 if it changed since)."""
        ...

    def get_lease(self, namespace: str, name: str, *, timeout: float | None = None) -> RawObject | None:
        """A coordination.k8s.io/v1 Lease, or None when it does not exist."""
        ...

    def create_lease(self, namespace: str, body: RawObject, *, timeout: float | None = None) -> RawObject:
        """Create a Lease (409 when one of that name exists); returns it as stored."""
        ...

    def replace_lease(self, namespace: str, name: str, body: RawObject, *, timeout: float | None = None) -> RawObject:
        """Replace a Lease; ``body`` carries the resourceVersion it was read at (409 if it changed since).
        Returns it as stored."""
        ...

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
        """POST the Binding of the pod to the node (``pods/binding``). The API server copies its
        ``annotations`` (and, from Kubernetes 1.35, its ``labels``) onto the pod in the same write that sets
        ``spec.nodeName``; the UID and, when given, the ``resource_version`` the pod was read at are
        preconditions (409 when either differs)."""
        ...

    def record_event(self, event: PodEvent) -> None:
        """Create a core/v1 Event on the pod."""
        ...

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Evict the pod through the Eviction API (``pods/eviction``), which honours PodDisruptionBudgets:
        429 when one forbids it now; nothing when the pod is already gone (404)."""
        ...

    def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Set the pod's ``status.nominatedNodeName`` (``pods/status``), as kube-scheduler's preemption does."""
        ...

    def list_resources(self, plural: str) -> Sequence[RawObject]:
        """Every object of one of our CRDs (``vgpu.names.PLURAL_*``), in all namespaces."""
        ...

    def patch_resource_status(self, plural: str, namespace: str | None, name: str, body: RawObject) -> None:
        """Merge-patch the ``status`` subresource of one of our objects (``namespace`` None: cluster-scoped);
        404 if it does not exist."""
        ...

    # --- the autoscaler's (scheduler_extender/autoscaler) -------------------------------------------
    def get_controller(self, kind: str, namespace: str, name: str) -> RawObject | None:
        """An apps/v1 ReplicaSet, Deployment or StatefulSet (a pod's controller and what owns it), or None."""
        ...

    def list_endpoint_slices(self, namespace: str, service: str) -> Sequence[RawObject]:
        """The EndpointSlices of a Service (the device plugins' metrics Service: where /usage is)."""
        ...

    def list_hpas(self, label_selector: str) -> Sequence[RawObject]:
        """autoscaling/v2 HorizontalPodAutoscalers in all namespaces matching ``label_selector``."""
        ...

    def upsert_hpa(self, namespace: str, body: RawObject) -> None:
        """Create the HPA, or replace the one of that name (at the resourceVersion just read)."""
        ...

    def delete_hpa(self, namespace: str, name: str) -> None:
        """Delete an HPA; nothing when it is gone already."""
        ...

    def list_config_maps(self, namespace: str, label_selector: str) -> Sequence[RawObject]:
        """ConfigMaps of one namespace matching ``label_selector``."""
        ...

    def upsert_config_map(self, namespace: str, body: RawObject) -> None:
        """Create the ConfigMap, or replace the one of that name (at the resourceVersion just read)."""
        ...


def annotation_patch(uid: str, changes: Mapping[str, str | None], resource_version: str | None = None) -> RawObject:
    """The merge-patch body for annotation changes; ``metadata.uid`` makes the API server check the UID,
    ``metadata.resourceVersion`` (when given) that the pod did not change since it was read."""
    meta: RawObject = {"uid": uid, "annotations": dict(changes)}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


def eviction_body(namespace: str, name: str, uid: str) -> RawObject:
    """A policy/v1 Eviction of exactly this pod (a UID precondition: never a successor of the same name)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }


def nomination_patch(uid: str, node: str) -> RawObject:
    """The merge patch of ``pods/status`` nominating ``node``, checked against the pod's UID."""
    return {"metadata": {"uid": uid}, "status": {"nominatedNodeName": node}}


def binding_body(
    namespace: str,
    name: str,
    uid: str,
    node: str,
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    resource_version: str | None = None,
) -> RawObject:
    """The v1 Binding the extender must create when it implements bind (protocol §8), carrying what the
    API server writes on the pod with it and the preconditions it checks (``KubeGateway.bind``)."""
    meta: dict[str, object] = {"name": name, "namespace": namespace, "uid": uid}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def event_body(event: PodEvent, now_rfc3339: str, name: str) -> RawObject:
    """The core/v1 Event object for ``event``, first seen ``now``."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": event.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": event.pod_name,
            "namespace": event.namespace,
            "uid": event.pod_uid,
        },
        "reason": event.reason,
        "message": event.message,
        "type": event.type,
        "source": {"component": event.component},
        "reportingComponent": event.component,
        "reportingInstance": event.component,
        "firstTimestamp": now_rfc3339,
        "lastTimestamp": now_rfc3339,
        "count": 1,
    }
