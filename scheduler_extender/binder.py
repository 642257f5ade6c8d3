"""bind: take the node's hand-off gate, re-check and place on fresh state, reserve, annotate, Bind, commit.

kube-scheduler binds asynchronously and many binds may run at once, so the ledger transitions are
serialised by the cache's lock, which is held only around the pure read-place-reserve step, never
across an API call. Every step after the reservation can fail (the pod was deleted, the API server
refused, the Binding conflicted); each failure undoes everything done so far — the allocation
annotation is removed, the reservation released, the gate given back — and comes back as the
bind Error, so the scheduler retries and nothing is left behind. A failed Binding POST is not
always a Binding that did not happen: a timeout, a lost answer or a 409 Conflict may hide one the
API server committed. So after any such failure the binder re-reads the pod, and when it is bound
to the node the bind succeeded (a GPU pod keeps its allocation: undoing it would leave a bound pod
without its GPUs); when it is not, or cannot be read, it undoes everything as for any other
failure. GPU pods and plain pods post their Binding through the same step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from scheduler_extender.cache import ClusterCache
from scheduler_extender.core.demand import demand_from_request
from scheduler_extender.core.filter import filter_nodes
from scheduler_extender.core.ledger import LedgerRefusal
from scheduler_extender.core.model import Demand, Snapshot
from scheduler_extender.core.placement import Placement, place
from scheduler_extender.core.policy import Policies
from scheduler_extender.gateway import GatewayError, KubeGateway, RawObject
from scheduler_extender.handoff import GateBusy, HandoffGate
from scheduler_extender.objects import PodRef, pod_record, pod_ref, scheduled_pod
from scheduler_extender.wire import ExtenderBindingArgs
from vgpu.catalog import Catalog
from vgpu.contract import allocation as allocation_contract
from vgpu.contract.allocation import PodAllocation
from vgpu.names import SystemAnnotation

log = logging.getLogger(__name__)


class BindError(Exception):
    """A bind that did not happen; the message is the bind reply's Error. ``stage`` labels the metric."""

    def __init__(self, message: str, stage: str) -> None:
        super().__init__(message)
        self.stage = stage


@dataclass(frozen=True, slots=True)
class BindOutcome:
    """A successful bind: ``allocation`` is None for pods that asked for no GPU."""

    allocation: PodAllocation | None
    gate_wait: float


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Binder:
    """Performs binds. Thread-safe; one instance per app."""

    def __init__(
        self,
        gateway: KubeGateway,
        cache: ClusterCache,
        gate: HandoffGate,
        catalog: Catalog,
        policies: Policies,
        *,
        handoff_wait: float,
        clock: Callable[[], float],
    ) -> None:
        self.gateway = gateway
        self.cache = cache
        self.gate = gate
        self.catalog = catalog
        self.policies = policies
        self.handoff_wait = handoff_wait
        self.clock = clock

    def bind(self, args: ExtenderBindingArgs) -> BindOutcome:
        """Bind the pod or raise BindError having undone every step."""
        if not (args.PodName and args.PodNamespace and args.PodUID and args.Node):
            raise BindError("bind request must carry PodName, PodNamespace, PodUID and Node", "request")
        ref = PodRef(namespace=args.PodNamespace, name=args.PodName, uid=args.PodUID)
        node = args.Node
        pod = self._fetch(ref)
        record = pod_record(pod)
        if record.node_name is not None:
            if record.node_name == node and record.allocation is not None and record.allocation.node == node:
                return BindOutcome(record.allocation, 0.0)  # a retried bind whose first answer was lost
            raise BindError(f"pod {ref.key} is already bound to {record.node_name}", "request")
        if record.allocation is not None:
            # Unbound yet allocated: an earlier bind wrote the allocation and never posted the Binding
            # (the extender died in between, or its rollback failed). Roll it back, then bind afresh.
            note = self._undo(ref, record.allocation.node, annotated=True)
            if note:
                raise BindError(f"pod {ref.key} carries the allocation of an unfinished bind{note}", "annotate")
        wanted = scheduled_pod(pod)
        if not wanted.is_gpu_pod:
            self._post_binding(ref, node)
            return BindOutcome(None, 0.0)
        if wanted.request is None:
            raise BindError(wanted.request_error or "invalid GPU request", "request")
        demand = demand_from_request(wanted.request, pod_key=ref.key)
        try:
            waited = self.gate.acquire(node, ref.uid, ref.key, self.handoff_wait)
        except GateBusy as busy:
            raise BindError(str(busy), "gate") from None
        try:
            placement = self._reserve(ref, demand, node)
        except BindError:
            self.gate.release(node, ref.uid)
            raise
        allocation = PodAllocation(
            pod_uid=ref.uid,
            node=node,
            pool=wanted.request.pool,
            qos=wanted.request.qos,
            containers=wanted.request.containers,
            gpus=placement.grants,
            bound_at=rfc3339(self.clock()),
        )
        try:
            written = {SystemAnnotation.ALLOCATION.value: allocation_contract.encode(allocation)}
            self.gateway.patch_pod_annotations(ref.namespace, ref.name, ref.uid, written)
        except GatewayError as exc:
            self._undo(ref, node, annotated=False)
            raise BindError(f"could not record the GPU allocation on pod {ref.key}: {exc}", "annotate") from None
        self._post_binding(ref, node, undo=lambda: self._undo(ref, node, annotated=True))
        self.cache.commit(ref.key)
        view = self.cache.node(node)
        if view is not None:
            self.policies.for_demand(demand).observe(demand, view, placement.gpus)
        return BindOutcome(allocation, waited)

    def _fetch(self, ref: PodRef) -> RawObject:
        try:
            pod = self.gateway.get_pod(ref.namespace, ref.name)
        except GatewayError as exc:
            raise BindError(f"could not read pod {ref.key}: {exc}", "read") from None
        if pod is None:
            raise BindError(f"pod {ref.key} does not exist", "request")
        if pod_ref(pod).uid != ref.uid:
            raise BindError(f"pod {ref.key} has UID {pod_ref(pod).uid}, not {ref.uid} (recreated?)", "request")
        return pod

    def _bound_after_all(self, ref: PodRef, node: str, failure: GatewayError) -> bool:
        """Whether the pod is bound to ``node`` although posting its Binding failed (the answer was lost)."""
        try:
            pod = self.gateway.get_pod(ref.namespace, ref.name)
        except GatewayError as exc:
            log.warning("bind %s -> %s failed (%s) and re-reading the pod failed too (%s)", ref.key, node, failure, exc)
            return False
        if pod is None or pod_ref(pod).uid != ref.uid or pod_record(pod).node_name != node:
            return False
        log.warning(
            "bind %s -> %s answered %s, yet the pod is bound there: keeping its allocation", ref.key, node, failure
        )
        return True

    def _post_binding(self, ref: PodRef, node: str, *, undo: Callable[[], str] = lambda: "") -> None:
        """POST the Binding. On failure, unless the pod turns out bound to ``node`` after all, ``undo``
        (which returns a note when cleaning up failed) runs and the failure is raised as a BindError."""
        try:
            self.gateway.bind(ref.namespace, ref.name, ref.uid, node)
        except GatewayError as exc:
            if self._bound_after_all(ref, node, exc):
                return
            raise BindError(f"could not bind pod {ref.key} to {node}: {exc}{undo()}", "binding") from None

    def _reserve(self, ref: PodRef, demand: Demand, node: str) -> Placement:
        """Under the cache lock: fresh view without the pod's own tentative hold, place, reserve."""
        with self.cache.lock:
            self.cache.snapshot(drop_tentative_of=ref.key)
            view = self.cache.node(node)
            if view is None:
                raise BindError(f"node {node} is unknown to the GPU extender (no inventory seen)", "fit")
            placement = place(demand, view, self.policies.for_demand(demand), self.catalog)
            if placement is None:
                result = filter_nodes(demand, Snapshot(nodes={node: view}), (node,), self.catalog)
                reason = result.reasons().get(node)
                raise BindError(f"pod {ref.key} no longer fits on {node}: {reason or 'no GPUs chosen'}", "fit")
            try:
                self.cache.reserve(ref, node, placement.grants, qos=demand.qos, expires_at=None)
            except LedgerRefusal as refusal:
                raise BindError(f"pod {ref.key} cannot reserve GPUs on {node}: {refusal.reason}", "fit") from None
            return placement

    def _undo(self, ref: PodRef, node: str, *, annotated: bool) -> str:
        """Roll back after a failed API call; returns a note for the Error if cleaning up failed too.

        If the allocation could not be removed from the pod, it still exists, so it must still be
        counted: the reservation and the gate then stay, and go when the pod does (or the TTL).
        """
        if annotated:
            try:
                self.gateway.patch_pod_annotations(
                    ref.namespace, ref.name, ref.uid, {SystemAnnotation.ALLOCATION.value: None}
                )
            except GatewayError as exc:
                if exc.status != 404:  # a deleted pod carries no annotation to remove
                    log.error("rollback of %s: could not remove its allocation: %s", ref.key, exc)
                    return (
                        f" (and removing its allocation annotation failed: {exc}; "
                        "its GPUs stay accounted until the pod is deleted)"
                    )
        self.cache.release(ref.key, ref.uid)
        self.gate.release(node, ref.uid)
        return ""
