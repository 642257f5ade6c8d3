"""What the extender reads off raw Pods and Nodes: requests, allocations, receipts, GPU inventories.

Pods reach us two ways: embedded in a scheduler request (the pod being scheduled) and from the
pod watch (every pod that holds GPUs); Nodes from the node watch. All are raw Kubernetes JSON; this
module turns them into small frozen values with the contract annotations decoded strictly, so that
a corrupt annotation becomes an error message on the value (a node's ``inventory_error``, a pod's
``allocation_error``) and never an exception in a handler or the cache. Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from scheduler_extender.in_tree import Toleration, states_soft_preferences, tolerations
from scheduler_extender.kubelet_devices import allocate_sizes, vgpu_device_ids
from vgpu import isolation
from vgpu.contract import allocation as allocation_contract
from vgpu.contract import inventory as inventory_contract
from vgpu.contract import resolved as resolved_contract
from vgpu.contract.allocation import PodAllocation
from vgpu.contract.inventory import Health
from vgpu.errors import DomainError
from vgpu.names import (
    LABEL_DO_NOT_DISRUPT,
    LABEL_ENABLED,
    LABEL_NODE_POOL,
    MAX_EVICTION_PROTECTION_S,
    SystemAnnotation,
    qos_of_priority,
)
from vgpu.request import GpuRequest
from vgpu.scheduling.demand import gpu_slots
from vgpu.scheduling.model import GpuState, NodeState
from vgpu.timefmt import parse_rfc3339

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# Every filter/prioritize call decodes the pod's request, and replicas carry the same text; the strict
# decode (schema checks, exact quantities) is ~0.1 ms, so remember it per text. GpuRequest is frozen and
# nothing mutates its mappings; a text that fails to decode raises each time (exceptions are not kept).
_decode_request = lru_cache(maxsize=1024)(resolved_contract.decode)
# A pod's allocation is read again at each of its watch events after the bind (its first status, the kubelet's
# later writes, deletion), and at a relist; ~65 us a decode. Each text names its pod: no two pods share one.
_decode_allocation = lru_cache(maxsize=4096)(allocation_contract.decode)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRef:
    """Identity of a pod: the scheduler's ``<namespace>/<name>`` key plus the UID."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduledPod:
    """The pod of a filter/prioritize/preempt request. ``request`` is None for pods that are not ours."""

    ref: PodRef
    request: GpuRequest | None
    request_error: str | None  # the resolved-request annotation is present but corrupt
    device_ids: int | None = None  # vGPU device IDs its spec makes the kubelet hold (None: asks none)
    allocate_sizes: frozenset[int] = frozenset()  # IDs per Allocate call the kubelet makes for it
    soft_preferences: bool = False  # kube-scheduler weighs nodes for it (in_tree.py): prioritize must see them all
    tolerations: tuple[Toleration, ...] = ()

    @property
    def is_gpu_pod(self) -> bool:
        return self.request is not None or self.request_error is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRecord:
    """A watched pod as the ledger and the hand-off gate need it."""

    ref: PodRef
    node_name: str | None
    phase: str
    deleting: bool
    allocation: PodAllocation | None
    allocation_error: str | None
    receipt: bool  # the device plugin's hand-off receipt for this very pod is present
    # The kubelet has written the pod's status (status.startTime): it admitted the pod, so every Allocate of the
    # pod is over (tests/e2e/test_protocol_facts.py pins that order on the real kubelet).
    admitted: bool = False
    workload: str | None = None  # from the resolved request: for local-GPU affinity
    slots: int = 1  # vGPU device IDs it holds on each GPU of its allocation
    allocate_sizes: frozenset[int] = frozenset()  # IDs per Allocate call the kubelet makes for it
    auto: AutoPod | None = None  # set when its resolved request turns an autoscaling layer on
    # Wall-clock seconds until which no preemption takes it: its grant's boundAt plus its eviction-protection
    # (or the longest protection, for a pod labelled do-not-disrupt); None: unprotected.
    protected_until: float | None = None
    version: int = 0  # its metadata.resourceVersion (as_version): what a node's claims are judged against

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def holds_gpus(self) -> bool:
        """Its allocation counts against GPU capacity: until the pod is gone or has finished."""
        return self.allocation is not None and not self.terminal

    def protected(self, now: float, node_labels: Mapping[str, str]) -> bool:
        """No preemption may take it now: its protection runs, or its node is labelled do-not-disrupt."""
        return do_not_disrupt(node_labels) or (self.protected_until is not None and self.protected_until > now)

    @property
    def handed_over(self) -> bool:
        """Its Allocates are over: the device plugin's receipt is on it, or the kubelet has admitted it."""
        return self.receipt or self.admitted

    @property
    def in_handoff(self) -> bool:
        """Allocation written, not handed over yet, pod alive: it holds its node's hand-off gate (HANDOFF.md)."""
        return self.allocation is not None and not self.handed_over and not self.terminal and not self.deleting


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnerRef:
    """The pod's controller (``ownerReferences`` with ``controller: true``): a ReplicaSet, a StatefulSet, …"""

    api_version: str
    kind: str
    name: str
    uid: str


def controller_of(obj: Mapping[str, Any]) -> OwnerRef | None:
    """The object's ``ownerReferences`` entry with ``controller: true``, if any."""
    for ref in _meta(obj).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return OwnerRef(
                api_version=str(ref.get("apiVersion") or ""),
                kind=str(ref.get("kind") or ""),
                name=str(ref.get("name") or ""),
                uid=str(ref.get("uid") or ""),
            )
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoPod:
    """What the autoscaler needs of a pod that enables a layer: its resolved request and its controller."""

    request: GpuRequest
    created: str  # metadata.creationTimestamp (RFC 3339): the newest pod's config is its workload's
    owner: OwnerRef | None


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _section(pod: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = pod.get(key)
    return value if isinstance(value, Mapping) else {}


def _strings(value: object) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def pod_ref(pod: Mapping[str, Any]) -> PodRef:
    meta = _meta(pod)
    return PodRef(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
    )


def annotations_of(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return _strings(_meta(pod).get("annotations"))


def scheduled_pod(pod: Mapping[str, Any]) -> ScheduledPod:
    """Read the pod of a scheduler request. A pod is ours when it carries the resolved request or our label."""
    ann = annotations_of(pod)
    labels = _strings(_meta(pod).get("labels"))
    request: GpuRequest | None = None
    error: str | None = None
    raw = ann.get(SystemAnnotation.RESOLVED_REQUEST)
    if raw is not None:
        try:
            request = _decode_request(raw)
        except DomainError as exc:
            error = f"invalid {SystemAnnotation.RESOLVED_REQUEST} annotation: {exc}"
    priority = _section(pod, "spec").get("priority")
    if request is not None and isinstance(priority, int) and not isinstance(priority, bool):
        # Preemption ranks by the priority Kubernetes gave the pod (what quota and kube-scheduler see), not by
        # the qos it asked for; the allocation records it so, and the pod's later victims are ranked by it.
        request = replace(request, qos=qos_of_priority(priority))
    elif LABEL_ENABLED in labels:
        error = (
            f"pod is labelled {LABEL_ENABLED} but has no {SystemAnnotation.RESOLVED_REQUEST} annotation: "
            "the tensor-fusion admission webhook did not process it (is it installed and reachable?)"
        )
    return ScheduledPod(
        ref=pod_ref(pod),
        request=request,
        request_error=error,
        device_ids=vgpu_device_ids(pod),
        allocate_sizes=allocate_sizes(pod),
        soft_preferences=states_soft_preferences(pod),
        tolerations=tolerations(pod),
    )


def pod_record(pod: Mapping[str, Any]) -> PodRecord:
    """Read a watched pod. An allocation written for another UID (a copied manifest) is an error, not ours."""
    ref = pod_ref(pod)
    ann = annotations_of(pod)
    spec, status = _section(pod, "spec"), _section(pod, "status")
    alloc: PodAllocation | None = None
    alloc_error: str | None = None
    raw = ann.get(SystemAnnotation.ALLOCATION)
    if raw is not None:
        try:
            alloc = _decode_allocation(raw)
        except DomainError as exc:
            alloc_error = str(exc)
        else:
            if alloc.pod_uid != ref.uid:
                alloc_error = f"allocation was written for pod UID {alloc.pod_uid}, not {ref.uid}"
                alloc = None
    receipt = False
    raw_receipt = ann.get(SystemAnnotation.HANDOFF)
    if raw_receipt is not None:
        try:
            receipt = allocation_contract.decode_handoff(raw_receipt).pod_uid == ref.uid
        except DomainError:
            receipt = False
    node_name = spec.get("nodeName")
    slots = 0
    if alloc is not None:
        slots = gpu_slots(vgpu_device_ids(pod), containers=len(alloc.containers), gpu_count=len(alloc.gpus))
    return PodRecord(
        ref=ref,
        node_name=node_name if isinstance(node_name, str) and node_name else None,
        phase=str(status.get("phase") or "Pending"),
        deleting=_meta(pod).get("deletionTimestamp") is not None,
        allocation=alloc,
        allocation_error=alloc_error,
        receipt=receipt,
        admitted=bool(status.get("startTime")),
        protected_until=_protected_until(alloc, ann, _strings(_meta(pod).get("labels"))),
        workload=_workload_of(ann),
        slots=slots,
        allocate_sizes=allocate_sizes(pod) if alloc is not None else frozenset(),
        auto=_auto_of(pod, ann),
        version=object_version(pod),
    )


def object_version(obj: Mapping[str, Any]) -> int:
    """An object's resourceVersion as a number (:func:`as_version`)."""
    return as_version(_meta(obj).get("resourceVersion"))


def as_version(raw: object) -> int:
    """A resourceVersion as a number. The API server's are etcd revisions, one sequence for all objects of a
    resource (comparable as numbers since Kubernetes 1.35, KEP-5504); anything else reads as 0, before all."""
    text = raw if isinstance(raw, str) else ""
    return int(text) if text.isdigit() else 0


def _auto_of(pod: Mapping[str, Any], ann: Mapping[str, str]) -> AutoPod | None:
    """The pod as the autoscaler sees it; None unless its resolved request enables a layer."""
    raw = ann.get(SystemAnnotation.RESOLVED_REQUEST)
    if raw is None or '"enable":true' not in raw:
        return None
    try:
        request = _decode_request(raw)
    except DomainError:
        return None
    if not any(isinstance(b, Mapping) and b.get("enable") is True for b in request.auto_scaling.values()):
        return None
    return AutoPod(request=request, created=str(_meta(pod).get("creationTimestamp") or ""), owner=controller_of(pod))


def do_not_disrupt(labels: Mapping[str, str]) -> bool:
    """Whether a pod's or node's labels say ``tensor-fusion.ai/do-not-disrupt: "true"``."""
    return labels.get(LABEL_DO_NOT_DISRUPT, "").strip().casefold() == "true"


def _protected_until(alloc: PodAllocation | None, ann: Mapping[str, str], labels: Mapping[str, str]) -> float | None:
    """When the pod's eviction protection ends (wall seconds), counted from its grant; None: it has none."""
    if alloc is None:
        return None
    seconds = MAX_EVICTION_PROTECTION_S if do_not_disrupt(labels) else None
    raw = ann.get(SystemAnnotation.RESOLVED_REQUEST)
    if seconds is None and raw is not None:
        try:
            seconds = _decode_request(raw).eviction_protection_s
        except DomainError:
            seconds = None
    if seconds is None:
        return None
    try:
        return parse_rfc3339(alloc.bound_at) + seconds
    except ValueError:
        return None


def _workload_of(ann: Mapping[str, str]) -> str | None:
    """The workload a pod's resolved request names; None when it names none (or the request is corrupt)."""
    raw = ann.get(SystemAnnotation.RESOLVED_REQUEST)
    if raw is None:
        return None
    try:
        return _decode_request(raw).workload
    except DomainError:
        return None


@dataclass(frozen=True, slots=True)
class WorkloadPod:
    """A live pod that names a TensorFusionWorkload: one of the pods its status counts."""

    ref: PodRef
    workload: str


def workload_pod(pod: Mapping[str, Any]) -> WorkloadPod | None:
    """The pod as a member of its workload; None when it names none, has finished or is being deleted."""
    workload = _workload_of(annotations_of(pod))
    phase = _section(pod, "status").get("phase")
    if workload is None or phase in TERMINAL_PHASES or _meta(pod).get("deletionTimestamp") is not None:
        return None
    return WorkloadPod(ref=pod_ref(pod), workload=workload)


def pending_pool(pod: Mapping[str, Any]) -> str | None:
    """The pool of a GPU pod still waiting for a node — the webhook resolved its request, it is unbound,
    holds no allocation, and is neither finished nor being deleted — ``""`` when its request is unreadable;
    None for every other pod."""
    ann, spec = annotations_of(pod), _section(pod, "spec")
    raw = ann.get(SystemAnnotation.RESOLVED_REQUEST)
    if (
        raw is None
        or spec.get("nodeName")
        or SystemAnnotation.ALLOCATION in ann
        or _section(pod, "status").get("phase") in TERMINAL_PHASES
        or _meta(pod).get("deletionTimestamp") is not None
    ):
        return None
    try:
        return _decode_request(raw).pool
    except DomainError:
        return ""


def allocated_node_label(node: str) -> str:
    """The value of LABEL_ALLOCATED_NODE for an allocation on ``node``: the name itself when it is a valid
    label value (at most 63 characters), otherwise a digest of it. Readers match allocations by the
    annotation's node, never by the label alone (anyone who may edit the pod may also set the label)."""
    if len(node) <= 63:
        return node
    return "n-" + hashlib.sha256(node.encode()).hexdigest()[:40]


def is_relevant(pod: Mapping[str, Any]) -> bool:
    """Whether the cache needs to keep this pod: it carries an allocation (valid or not)."""
    return SystemAnnotation.ALLOCATION in annotations_of(pod)


def node_state(node: Mapping[str, Any], default_pool: str) -> NodeState:
    """A watched Node as the core sees it, with nothing reserved yet (the ledger adds usage).

    No inventory annotation: a node without GPUs (the core says so). A corrupt one, or one naming
    another node (a copied annotation): ``inventory_error``, so the node is rejected with the reason.
    """
    meta = _meta(node)
    name = str(meta.get("name") or "")
    labels = _strings(meta.get("labels"))
    pool = labels.get(LABEL_NODE_POOL) or default_pool
    raw = annotations_of(node).get(SystemAnnotation.NODE_INVENTORY)
    if raw is None:
        return NodeState(name=name, pool=pool, labels=labels)
    try:
        inv = inventory_contract.decode(raw)
    except DomainError as exc:
        return NodeState(name=name, pool=pool, labels=labels, inventory_error=f"corrupt GPU inventory: {exc}")
    if inv.node != name:
        error = f"GPU inventory was written for node {inv.node!r}, not {name!r}"
        return NodeState(name=name, pool=pool, labels=labels, inventory_error=error)
    gpus = tuple(
        GpuState(
            uuid=g.uuid,
            index=g.index,
            model=g.model,
            tflops=g.tflops,
            vram=g.vram,
            # A GPU in MIG mode is never placed on: its UUID gives a container no usable CUDA device.
            # Its MIG instances are, as units of their own (vgpu.mig; the node's reason says "healthy").
            healthy=g.health is Health.HEALTHY and not g.mig,
            numa=g.numa,
            slots=inv.slices_per_gpu,
            isolation=isolation.served(inv.backend, mig_unit=g.parent is not None),
        )
        for g in inv.gpus
    )
    return NodeState(name=name, pool=inv.pool or pool, labels=labels, gpus=gpus)
