"""bind: take the node's hand-off gate, re-check and place on fresh state, reserve, annotate, Bind, commit.

The ledger step runs under the cache's lock, never across an API call, and every API call gets a
timeout cut from the bind's deadline (deadline.py). A failure before the Binding undoes everything
(allocation, reservation, gate hold) and becomes the bind's Error; once the Binding is posted nothing
turns the bind into a failure, and a failed Binding POST is settled by re-reading the pod. Two
extender replicas may bind at once, so the writes that matter are conditional (the allocation's
merge patch on the resourceVersion read, its removal by a JSON patch ``test``), and a write-then-list
of the node's allocations (``_arbitrate``) keeps two binds from promising one GPU twice.
The steps and every rule, with why: scheduler_extender/HANDOFF.md, section "Bind".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from scheduler_extender.cache import ClusterCache
from scheduler_extender.deadline import BudgetSpent, Deadline
from scheduler_extender.gateway import KubeGateway
from scheduler_extender.handoff import GateBusy, HandoffGate, bound_at
from scheduler_extender.objects import (
    PodRef,
    allocated_node_label,
    allocated_on_selector,
    pod_record,
    pod_ref,
    scheduled_pod,
    uncounted,
)
from scheduler_extender.shown import ShownPods
from scheduler_extender.wire import ExtenderBindingArgs
from tf_shell.kube.api import GatewayError, RawObject, precondition_failed
from vgpu.catalog import Catalog
from vgpu.contract import allocation as allocation_contract
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.names import LABEL_ALLOCATED_NODE, SystemAnnotation
from vgpu.scheduling.demand import demand_from_request
from vgpu.scheduling.filter import filter_nodes
from vgpu.scheduling.ledger import LedgerRefusal
from vgpu.scheduling.model import Demand, Snapshot
from vgpu.scheduling.placement import Placement, place
from vgpu.scheduling.policy import Policies
from vgpu.timefmt import rfc3339

log = logging.getLogger(__name__)

ALLOCATION = SystemAnnotation.ALLOCATION.value
# Seconds beyond ``bind_timeout`` after its boundAt before another writer's allocation on an unbound pod
# counts as abandoned: the replicas' clocks may differ by this much.
CLOCK_SLACK = 5.0


class ChangedSinceShown(Exception):
    """The pod is no longer the copy kube-scheduler showed (the allocation's conditional write said 409)."""


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


class Binder:
    """Performs binds. Thread-safe; one instance per app."""

    def __init__(
        self,
        gateway: KubeGateway,
        cache: ClusterCache,
        gate: HandoffGate,
        catalog: Catalog,
        policies: Policies,
        shown: ShownPods,
        *,
        handoff_wait: float,
        bind_timeout: float,
        clock: Callable[[], float],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gateway = gateway
        self.cache = cache
        self.gate = gate
        self.catalog = catalog
        self.policies = policies
        self.shown = shown
        self.handoff_wait = handoff_wait
        self.bind_timeout = bind_timeout
        self.clock = clock
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._binding: set[str] = set()  # UIDs of pods with a bind in progress
        self._written: dict[str, str] = {}  # pod UID -> allocation this binder wrote, bind not yet seen through

    def deadline(self) -> Deadline:
        """A bind deadline starting now (take it when the request arrives)."""
        return Deadline.starting_now(self.bind_timeout, self.monotonic)

    def bind(self, args: ExtenderBindingArgs, deadline: Deadline | None = None) -> BindOutcome:
        """Bind the pod by ``deadline`` (default: ``bind_timeout`` from now) or raise BindError having
        undone every step."""
        if not (args.PodName and args.PodNamespace and args.PodUID and args.Node):
            raise BindError("bind request must carry PodName, PodNamespace, PodUID and Node", "request")
        ref = PodRef(namespace=args.PodNamespace, name=args.PodName, uid=args.PodUID)
        with self._only_bind_of(ref):
            return self._bind(ref, args.Node, deadline or self.deadline())

    @contextmanager
    def _only_bind_of(self, ref: PodRef) -> Iterator[None]:
        """A second bind of a pod whose bind is still running would undo the first one's allocation."""
        with self._lock:
            if ref.uid in self._binding:
                raise BindError(f"a bind of pod {ref.key} is still in progress; the scheduler will retry", "busy")
            self._binding.add(ref.uid)
        try:
            yield
        finally:
            with self._lock:
                self._binding.discard(ref.uid)

    def _bind(self, ref: PodRef, node: str, deadline: Deadline) -> BindOutcome:
        shown = self.shown.take(ref.uid)
        if shown is not None and _unclaimed_gpu_pod(shown):
            try:
                return self._bind_unclaimed(ref, node, shown, None, deadline, shown=True)
            except ChangedSinceShown:
                pass  # the pod changed after kube-scheduler's copy: read it and bind as without one
        pod = self._fetch(ref, deadline)
        record = pod_record(pod)
        if record.node_name is not None:
            if record.node_name == node and record.allocation is not None and record.allocation.node == node:
                self._forget(ref.uid)
                return BindOutcome(record.allocation, 0.0)  # a retried bind whose first answer was lost
            raise BindError(f"pod {ref.key} is already bound to {record.node_name}", "request")
        removed = None
        if record.allocation is not None:
            # Unbound yet allocated: an earlier bind wrote the allocation and never posted the Binding
            # (the extender died in between, its rollback failed, or its Binding's outcome was unknown),
            # or another replica's bind is writing it now. Roll back only the first kind, then bind afresh.
            text = _allocation_text(pod)
            if not self._abandoned(ref, text, record.allocation.bound_at):
                raise BindError(_contended(ref), "conflict")
            note = self._undo(ref, record.allocation.node, deadline, written=text, forward=True)
            if note:
                raise BindError(f"pod {ref.key} carries the allocation of an unfinished bind{note}", "annotate")
            removed = record.allocation
            pod = self._fetch(ref, deadline)
            if pod_record(pod).node_name is not None or pod_record(pod).allocation is not None:
                raise BindError(_contended(ref), "conflict")
        return self._bind_unclaimed(ref, node, pod, removed, deadline, shown=False)

    def _bind_unclaimed(
        self, ref: PodRef, node: str, pod: RawObject, removed: PodAllocation | None, deadline: Deadline, *, shown: bool
    ) -> BindOutcome:
        """Bind ``pod``, unbound and without an allocation as read (``shown``: as kube-scheduler sent it, which
        only the allocation's conditional write confirms: :class:`ChangedSinceShown` when it does not)."""
        wanted = scheduled_pod(pod)
        if not wanted.is_gpu_pod:
            self._post_binding(ref, node, deadline)
            return BindOutcome(None, 0.0)
        if wanted.request is None:
            raise BindError(wanted.request_error or "invalid GPU request", "request")
        demand = demand_from_request(wanted.request, pod_key=ref.key, device_ids=wanted.device_ids)
        try:
            wait = deadline.gate_wait(self.handoff_wait)
            waited = self.gate.acquire(node, ref.uid, ref.key, wait, wanted.allocate_sizes)
        except GateBusy as busy:
            raise BindError(str(busy), "gate") from None
        try:
            placement, counted = self._reserve(ref, demand, node, removed)
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
            isolation=wanted.request.isolation,
        )
        text = allocation_contract.encode(allocation)
        self._write_allocation(ref, node, pod, text, deadline, shown=shown)
        self._arbitrate(ref, node, counted, text, deadline)
        self._post_binding(
            ref, node, deadline, written=text, undo=lambda: self._undo(ref, node, deadline, written=text)
        )
        self._forget(ref.uid)
        self._bound(ref, node, demand, placement)
        return BindOutcome(allocation, waited)

    def _write_allocation(
        self, ref: PodRef, node: str, pod: RawObject, text: str, deadline: Deadline, *, shown: bool
    ) -> None:
        """Write the allocation on the pod as read (resourceVersion precondition); once more after a 409 that
        hid no other bind. Raises BindError having undone what this bind did, and nothing else; after a 409
        on the copy kube-scheduler ``shown``, ChangedSinceShown having undone it (the pod was not read)."""
        with self._lock:
            self._written[ref.uid] = text  # before the call: an unanswered write may have landed
        for attempt in range(2):
            try:
                self.gateway.patch_pod_annotations(
                    ref.namespace,
                    ref.name,
                    ref.uid,
                    {ALLOCATION: text},
                    labels={LABEL_ALLOCATED_NODE: allocated_node_label(node)},
                    resource_version=_resource_version(pod),
                    timeout=deadline.forward("record the GPU allocation"),
                )
                return
            except GatewayError as exc:
                if exc.status != 409 or attempt:
                    # Without an answer the patch may have been applied all the same: remove it too.
                    note = self._undo(ref, node, deadline, written=text if _unanswered(exc) else None)
                    raise BindError(
                        f"could not record the GPU allocation on pod {ref.key}: {exc}{note}", "annotate"
                    ) from None
                if shown:
                    self._undo(ref, node, deadline, written=None)
                    raise ChangedSinceShown from None
            try:
                pod = self._fetch(ref, deadline)
            except BindError:
                self._undo(ref, node, deadline, written=None)
                raise
            fresh = pod_record(pod)
            if fresh.node_name is not None or fresh.allocation is not None:
                self._undo(ref, node, deadline, written=None)
                raise BindError(_contended(ref), "conflict")

    def _arbitrate(
        self, ref: PodRef, node: str, counted: Mapping[str, tuple[GpuGrant, ...]], text: str, deadline: Deadline
    ) -> None:
        """After writing the allocation, before the Binding: list every allocation on ``node`` consistently
        and back off (undoing this bind) if one was written that the placement did not count.

        Another extender replica places pods from its own cache, and neither sees the other's allocation
        until its watch delivers it. Each writes first and lists after, so of two binds whose placements
        missed each other's allocation, the later lister sees the earlier's write: at most one goes on
        (both backing off is the worst case, and kube-scheduler retries them). What the placement counted
        stays valid: an allocation only leaves a node by its pod going or finishing."""
        try:
            listed = self.gateway.list_pods(
                allocated_on_selector(node), timeout=deadline.forward("list the node's allocations")
            )
        except GatewayError as exc:
            note = self._undo(ref, node, deadline, written=text)
            failed = f"could not list the allocations on {node} to confirm the placement of pod {ref.key}: {exc}"
            raise BindError(f"{failed}{note}", "read") from None
        unseen = uncounted(listed, counted, node, ref.uid)
        if unseen:
            note = self._undo(ref, node, deadline, written=text)
            raise BindError(
                f"another extender placed {', '.join(sorted(unseen))} on {node} while pod {ref.key} was being "
                f"placed there; this bind backed off so that the GPUs are not promised twice, and the "
                f"scheduler will retry it{note}",
                "conflict",
            ) from None

    def _abandoned(self, ref: PodRef, text: str, written_at: str) -> bool:
        """Whether an unbound pod's allocation may be removed: this binder wrote it, or the bind that wrote
        it must have ended (its boundAt is older than any bind lasts)."""
        with self._lock:
            if self._written.get(ref.uid) == text:
                return True
        return bound_at(written_at, self.clock()) + self.bind_timeout + CLOCK_SLACK < self.clock()

    def _forget(self, uid: str) -> None:
        with self._lock:
            self._written.pop(uid, None)

    def _bound(self, ref: PodRef, node: str, demand: Demand, placement: Placement) -> None:
        """After the Binding: commit the reservation and teach the policy. Nothing here may fail the bind."""
        try:
            if not self.cache.commit(ref.key):
                log.info("bind %s -> %s: the pod was deleted while being bound; nothing to commit", ref.key, node)
                return
            view = self.cache.node(node)
            if view is not None:
                self.policies.for_demand(demand).observe(demand, view, placement.gpus)
        except Exception:  # the pod is bound: a bookkeeping bug must not tell the scheduler otherwise
            log.exception("bind %s -> %s: the Binding is made, but recording it failed", ref.key, node)

    def _fetch(self, ref: PodRef, deadline: Deadline) -> RawObject:
        try:
            pod = self.gateway.get_pod(ref.namespace, ref.name, timeout=deadline.forward("read the pod"))
        except GatewayError as exc:
            raise BindError(f"could not read pod {ref.key}: {exc}", "read") from None
        if pod is None:
            raise BindError(f"pod {ref.key} does not exist", "request")
        if pod_ref(pod).uid != ref.uid:
            raise BindError(f"pod {ref.key} has UID {pod_ref(pod).uid}, not {ref.uid} (recreated?)", "request")
        return pod

    def _bound_after_all(
        self, ref: PodRef, node: str, failure: GatewayError, deadline: Deadline, written: str | None
    ) -> bool | None:
        """Whether the pod is bound to ``node`` with the allocation this bind ``written`` (None: a pod
        without GPUs) although posting its Binding failed (the answer was lost); None when that cannot
        be read back. Bound with another allocation, another extender bound it: not this bind's."""
        try:
            pod = self.gateway.get_pod(ref.namespace, ref.name, timeout=deadline.cleanup(0.5))
        except GatewayError as exc:
            log.warning("bind %s -> %s failed (%s) and re-reading the pod failed too (%s)", ref.key, node, failure, exc)
            return None
        if pod is None or pod_ref(pod).uid != ref.uid or pod_record(pod).node_name != node:
            return False
        if written is not None and _allocation_text(pod) != written:
            log.info("bind %s -> %s: another extender bound the pod with its own allocation", ref.key, node)
            return False
        log.warning(
            "bind %s -> %s answered %s, yet the pod is bound there: keeping its allocation", ref.key, node, failure
        )
        return True

    def _post_binding(
        self,
        ref: PodRef,
        node: str,
        deadline: Deadline,
        *,
        written: str | None = None,
        undo: Callable[[], str] = lambda: "",
    ) -> None:
        """POST the Binding. On failure, unless the pod turns out bound to ``node`` with this bind's
        allocation ``written`` after all, ``undo`` (which returns a note when cleaning up failed) runs and
        the failure is raised as a BindError; when whether it is bound cannot be read back, nothing is undone."""
        try:
            self.gateway.bind(ref.namespace, ref.name, ref.uid, node, timeout=deadline.forward("post the Binding"))
        except GatewayError as exc:
            bound = self._bound_after_all(ref, node, exc, deadline, written) if _ambiguous(exc) else False
            if bound:
                return
            failed = f"could not bind pod {ref.key} to {node}: {exc}"
            if bound is None:
                raise BindError(f"{failed}{UNKNOWN_OUTCOME}", "binding") from None
            raise BindError(f"{failed}{undo()}", "binding") from None

    def _reserve(
        self, ref: PodRef, demand: Demand, node: str, removed: PodAllocation | None
    ) -> tuple[Placement, dict[str, tuple[GpuGrant, ...]]]:
        """Under the cache lock: fresh view without the pod's own holds, place, reserve. Returns the placement
        and what the node's ledger counted for the other pods when it was made (see :meth:`_arbitrate`).

        ``removed``: the allocation this bind just removed from the pod (the watch may still show it)."""
        with self.cache.lock:
            # The pod, just read, is unbound and carries no allocation, and no other bind of it runs
            # here: what the cache still holds for it (a tentative reservation, the hold of an earlier
            # bind whose Binding's outcome was unknown) is stale — unless the watch has meanwhile shown
            # an allocation another extender wrote on it.
            seen = self.cache.record(ref.uid)
            if seen is not None and seen.allocation is not None and seen.allocation != removed:
                raise BindError(_contended(ref), "conflict")
            self.cache.release(ref.key, ref.uid)
            view = self.cache.node(node)
            if view is None:
                raise BindError(f"node {node} is unknown to the GPU extender (no inventory seen)", "fit")
            placement = place(demand, view, self.policies.for_demand(demand), self.catalog)
            counted = self.cache.counted_on(node)
            if placement is None:
                result = filter_nodes(demand, Snapshot(nodes={node: view}), (node,), self.catalog)
                reason = result.reasons().get(node)
                raise BindError(f"pod {ref.key} no longer fits on {node}: {reason or 'no GPUs chosen'}", "fit")
            try:
                self.cache.reserve(ref, node, placement.grants, qos=demand.qos, expires_at=None, slots=demand.slots)
            except LedgerRefusal as refusal:
                raise BindError(f"pod {ref.key} cannot reserve GPUs on {node}: {refusal.reason}", "fit") from None
            return placement, counted

    def _undo(self, ref: PodRef, node: str, deadline: Deadline, *, written: str | None, forward: bool = False) -> str:
        """Roll back after a failed API call; returns a note for the Error if cleaning up failed too.

        ``written``: the allocation that may be on the pod and is this bind's to remove (None: nothing
        to remove). It is removed only while the pod still carries exactly that; otherwise it is someone
        else's, and only this bind's own reservation goes — what the watch saw on the pod stays.
        ``forward``: the rollback of an earlier bind, a forward step of this one (its budget share);
        otherwise this bind's own cleanup (what is left to the deadline). The pod is not bound to
        ``node`` by this bind, so its in-flight gate hold is given back in any case. If the allocation
        could not be removed from the pod, it may still exist, so it must still be counted: the
        reservation then stays, and goes when the pod does or when the pod's next bind undoes it.
        """
        self.gate.release(node, ref.uid)
        seen = self.cache.record(ref.uid)
        if seen is not None:  # the pod as the watch last showed it (bound by another replica) holds its gate
            self.gate.observe(seen)
        if written is None:
            self._forget(ref.uid)
            self.cache.release_reserved(ref.key, ref.uid)
            return ""
        try:
            timeout = deadline.forward("remove an unfinished bind's allocation") if forward else deadline.cleanup()
            self.gateway.remove_pod_annotation(ref.namespace, ref.name, ref.uid, ALLOCATION, written, timeout=timeout)
        except GatewayError as exc:
            if precondition_failed(exc):  # not (any more) the allocation written: someone else owns it
                log.info("rollback of %s: its allocation is no longer the one written; leaving it", ref.key)
                self._forget(ref.uid)
                self.cache.release_reserved(ref.key, ref.uid)
                return ""
            if exc.status != 404:  # a deleted pod carries no annotation to remove
                log.error("rollback of %s: could not remove its allocation: %s", ref.key, exc)
                return (
                    f" (and removing its allocation annotation failed: {exc}; "
                    "its GPUs stay accounted until the pod is deleted or bound again)"
                )
        self._forget(ref.uid)
        self.cache.release(ref.key, ref.uid)
        return ""


# Ends a bind's Error when neither the Binding POST nor the pod's re-read was answered (the API server
# stalled): whether the pod is bound is unknown, and the Error says so (tests match it).
UNKNOWN_OUTCOME = (
    "; whether the Binding was made could not be read back, so nothing is undone: a bound pod keeps its "
    "allocation, an unbound one has it removed by its next bind"
)


def _contended(ref: PodRef) -> str:
    return (
        f"another extender is binding pod {ref.key} (its allocation or Binding is on the pod); "
        "this bind backed off and left them as they are"
    )


def _allocation_text(pod: RawObject) -> str:
    """The allocation annotation exactly as written on the pod ("" when absent)."""
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(ALLOCATION) or "")


def _unclaimed_gpu_pod(pod: RawObject) -> bool:
    """Whether a GPU pod, as shown, is unbound and without an allocation, with a resourceVersion for the
    allocation's write to be conditional on (a copy without one is never used)."""
    record = pod_record(pod)
    unclaimed = record.node_name is None and record.allocation is None and not _allocation_text(pod)
    return unclaimed and _resource_version(pod) is not None and scheduled_pod(pod).is_gpu_pod


def _resource_version(pod: RawObject) -> str | None:
    rv = (pod.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv else None


def _unanswered(exc: GatewayError) -> bool:
    """A call that got no answer (timeout, broken connection) and so may have been applied; one never made did not."""
    return exc.status is None and not isinstance(exc, BudgetSpent)


def _ambiguous(exc: GatewayError) -> bool:
    """Whether a failed Binding POST may hide a committed Binding: no answer, a 409 Conflict or a 5xx."""
    return _unanswered(exc) or exc.status == 409 or (exc.status or 0) >= 500
