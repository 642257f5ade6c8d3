"""bind: take the node's hand-off gate, place on fresh state beside the node's claims, claim, Bind, commit.

The ledger step runs under the cache's lock, never across an API call, and every API call gets a
timeout cut from the bind's deadline (deadline.py). The GPUs are claimed on the node's claims Lease by
compare-and-swap (arbiter.py), which orders two extender replicas placing on one node; then one write
binds and grants: the Binding carries the allocation, conditional on the pod's UID and resourceVersion,
so a pod is never bound without its allocation nor allocated by a bind that did not bind. A failure
before the Binding gives back the reservation and the gate hold; once the Binding is posted nothing turns
the bind into a failure, and a failed Binding POST is settled by re-reading the pod.
The steps and every rule, with why: scheduler_extender/HANDOFF.md, section "Bind".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from scheduler_extender.arbiter import Arbiter, ClaimFailed
from scheduler_extender.cache import ClusterCache
from scheduler_extender.deadline import BudgetSpent, Deadline
from scheduler_extender.gateway import KubeGateway
from scheduler_extender.handoff import GateBusy, HandoffGate, bound_at
from scheduler_extender.objects import (
    PodRef,
    allocated_node_label,
    as_version,
    pod_record,
    pod_ref,
    scheduled_pod,
)
from scheduler_extender.shown import ShownPods
from scheduler_extender.wire import ExtenderBindingArgs
from tf_shell.kube.api import GatewayError, RawObject
from vgpu.catalog import Catalog
from vgpu.container_gpus import split
from vgpu.contract import allocation as allocation_contract
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.contract.claims import Claim
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


class PodChanged(Exception):
    """The pod is no longer the copy the bind placed (its Binding's resourceVersion precondition said 409), yet
    still unbound: bind it again from a fresh read."""


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


@dataclass(frozen=True, slots=True)
class Grant:
    """What a GPU pod's Binding carries: the allocation (``text``) and the node label, written on the pod with
    ``spec.nodeName``, conditional on the resourceVersion (``version``) the placement was decided for."""

    text: str
    node: str
    version: str


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
        arbiter: Arbiter,
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
        self.arbiter = arbiter
        self.handoff_wait = handoff_wait
        self.bind_timeout = bind_timeout
        self.clock = clock
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._binding: set[str] = set()  # UIDs of pods with a bind in progress

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
        """A second bind of a pod whose bind is still running would release the first one's reservation."""
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
                return self._bind_unclaimed(ref, node, shown, None, deadline)
            except PodChanged:
                pass  # the pod changed after kube-scheduler's copy: read it and bind as without one
        for _ in range(2):  # a status write may move the resourceVersion between the read and the Binding
            pod = self._fetch(ref, deadline)
            record = pod_record(pod)
            if record.node_name is not None:
                if record.node_name == node and record.allocation is not None and record.allocation.node == node:
                    return BindOutcome(record.allocation, 0.0)  # a retried bind whose first answer was lost
                raise BindError(f"pod {ref.key} is already bound to {record.node_name}", "request")
            # Unbound yet allocated: a bind of the earlier protocol wrote the allocation before its Binding and
            # never posted it (or another replica of that version is binding it now). Once that bind must have
            # ended, the Binding replaces the allocation; until then it is left alone.
            if record.allocation is not None and not self._abandoned(record.allocation.bound_at):
                raise BindError(_contended(ref), "conflict")
            try:
                return self._bind_unclaimed(ref, node, pod, record.allocation, deadline)
            except PodChanged:
                continue
        raise BindError(f"pod {ref.key} kept changing while it was being bound; the scheduler will retry", "conflict")

    def _bind_unclaimed(
        self, ref: PodRef, node: str, pod: RawObject, removed: PodAllocation | None, deadline: Deadline
    ) -> BindOutcome:
        """Bind ``pod``, unbound (and, but for ``removed``, an abandoned allocation, unallocated) as read or as
        kube-scheduler showed it: the Binding's resourceVersion precondition confirms it (:class:`PodChanged`
        when it does not)."""
        wanted = scheduled_pod(pod)
        version = _resource_version(pod)
        if not wanted.is_gpu_pod:
            self._post_binding(ref, node, deadline)
            return BindOutcome(None, 0.0)
        if wanted.request is None:
            raise BindError(wanted.request_error or "invalid GPU request", "request")
        if version is None:
            raise BindError(f"pod {ref.key} was read without a resourceVersion", "request")
        demand = demand_from_request(wanted.request, pod_key=ref.key, device_ids=wanted.device_ids)
        try:
            wait = deadline.gate_wait(self.handoff_wait)
            waited = self.gate.acquire(node, ref.uid, ref.key, wait, wanted.allocate_sizes)
        except GateBusy as busy:
            raise BindError(str(busy), "gate") from None
        try:
            placement = self.arbiter.claim(
                node,
                ref,
                as_version(version),
                lambda claims: self._reserve(ref, demand, node, removed, claims),
                undo=lambda: self.cache.release_reserved(ref.key, ref.uid),
                timeout=deadline.forward,
            )
        except ClaimFailed as failed:
            self._undo(ref, node)
            raise BindError(f"pod {ref.key} was not placed on {node}: {failed}", failed.stage) from None
        except BindError:
            self._undo(ref, node)
            raise
        counts = wanted.request.container_gpu_counts  # each container its own GPUs (vgpu/container_gpus.py)
        allocation = PodAllocation(
            pod_uid=ref.uid,
            node=node,
            pool=wanted.request.pool,
            qos=wanted.request.qos,
            containers=wanted.request.containers,
            gpus=placement.grants,
            bound_at=rfc3339(self.clock()),
            isolation=wanted.request.isolation,
            container_gpus=None if counts is None else split(counts, placement.grants, wanted.request.gpu_indices),
        )
        grant = Grant(text=allocation_contract.encode(allocation), node=node, version=version)
        self._post_binding(ref, node, deadline, grant=grant, undo=lambda: self._undo(ref, node))
        self._bound(ref, node, demand, placement)
        return BindOutcome(allocation, waited)

    def _abandoned(self, written_at: str) -> bool:
        """Whether an unbound pod's allocation (the earlier protocol's) comes from a bind that must have ended:
        its boundAt is older than any bind lasts."""
        return bound_at(written_at, self.clock()) + self.bind_timeout + CLOCK_SLACK < self.clock()

    def _bound(self, ref: PodRef, node: str, demand: Demand, placement: Placement) -> None:
        """After the Binding: commit the reservation and teach the policy. Nothing here may fail the bind."""
        try:
            if not self.cache.commit(ref.key):
                log.info("bind %s -> %s: the pod was deleted while being bound; nothing to commit", ref.key, node)
                return
            view = self.cache.node(node)
            if view is not None:
                self.policies.for_demand(demand).observe(placement.demand, view, placement.gpus)
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

    def _reread(self, ref: PodRef, node: str, failure: GatewayError, deadline: Deadline) -> RawObject | None:
        """The pod as it is after posting its Binding failed with an ambiguous answer; None when that cannot be
        read back ({} when the pod is gone)."""
        try:
            pod = self.gateway.get_pod(ref.namespace, ref.name, timeout=deadline.cleanup(0.5))
        except GatewayError as exc:
            log.warning("bind %s -> %s failed (%s) and re-reading the pod failed too (%s)", ref.key, node, failure, exc)
            return None
        return {} if pod is None or pod_ref(pod).uid != ref.uid else pod

    def _post_binding(
        self,
        ref: PodRef,
        node: str,
        deadline: Deadline,
        *,
        grant: Grant | None = None,
        undo: Callable[[], None] = lambda: None,
    ) -> None:
        """POST the Binding (with the ``grant`` of a GPU pod). When it fails, the pod is read back: bound to
        ``node`` with this bind's allocation after all, the bind succeeded; unbound, unallocated and changed
        since it was placed (a 409), :class:`PodChanged` after ``undo``; otherwise ``undo`` runs and the
        failure is a BindError — except when the pod cannot be read back, which leaves everything held."""
        annotations = None if grant is None else {ALLOCATION: grant.text}
        labels = None if grant is None else {LABEL_ALLOCATED_NODE: allocated_node_label(node)}
        try:
            self.gateway.bind(
                ref.namespace,
                ref.name,
                ref.uid,
                node,
                annotations=annotations,
                labels=labels,
                resource_version=None if grant is None else grant.version,
                timeout=deadline.forward("post the Binding"),
            )
            return
        except GatewayError as exc:
            failed = f"could not bind pod {ref.key} to {node}: {exc}"
            if not _ambiguous(exc):
                undo()
                raise BindError(failed, "binding") from None
            pod = self._reread(ref, node, exc, deadline)
            if pod is None:
                raise BindError(f"{failed}{UNKNOWN_OUTCOME}", "binding") from None
            record = pod_record(pod) if pod else None
            ours = grant is None or _allocation_text(pod) == grant.text
            if record is not None and record.node_name == node and ours:
                log.warning("bind %s -> %s answered %s, yet the pod is bound there", ref.key, node, exc)
                return
            undo()
            if record is not None and record.node_name is not None:  # the other bind of a pod two replicas bound
                raise BindError(
                    f"pod {ref.key} is already bound to {record.node_name} by another extender's bind; this bind "
                    "backed off and left it as it is",
                    "conflict",
                ) from None
            changed = grant is not None and exc.status == 409  # a plain pod's Binding has no version to be stale
            if changed and record is not None and record.node_name is None and not _allocation_text(pod):
                raise PodChanged from None
            raise BindError(failed, "binding") from None

    def _reserve(
        self, ref: PodRef, demand: Demand, node: str, removed: PodAllocation | None, claims: tuple[Claim, ...]
    ) -> tuple[Placement, tuple[GpuGrant, ...], int]:
        """Under the cache lock: fresh view without the pod's own holds, with other replicas' ``claims`` on the
        node held, place, reserve. Returns the placement, its grants and the device IDs per GPU (the claim).

        ``removed``: an abandoned allocation on the pod, which its Binding replaces (the watch shows it)."""
        with self.cache.lock:
            # The pod, just read, is unbound and carries no allocation but ``removed``, and no other bind of it
            # runs here: what the cache still holds for it (a tentative reservation, the hold of an earlier
            # bind whose Binding's outcome was unknown) is stale — unless the watch has meanwhile shown an
            # allocation another extender wrote on it.
            seen = self.cache.record(ref.uid)
            if seen is not None and seen.allocation is not None and seen.allocation != removed:
                raise BindError(_contended(ref), "conflict")
            self.cache.release(ref.key, ref.uid)
            try:
                view = self.cache.node_with(node, claims)
            except LedgerRefusal as refusal:
                raise BindError(
                    f"other extenders' binds in flight on {node} do not fit beside this one's account of it "
                    f"({refusal.reason}); the scheduler will retry pod {ref.key}",
                    "conflict",
                ) from None
            if view is None:
                raise BindError(f"node {node} is unknown to the GPU extender (no inventory seen)", "fit")
            placement = place(demand, view, self.policies.for_demand(demand), self.catalog)
            if placement is None:
                result = filter_nodes(demand, Snapshot(nodes={node: view}), (node,), self.catalog)
                reason = result.reasons().get(node)
                raise BindError(f"pod {ref.key} no longer fits on {node}: {reason or 'no GPUs chosen'}", "fit")
            try:
                self.cache.reserve(ref, node, placement.grants, qos=demand.qos, expires_at=None, slots=demand.slots)
            except LedgerRefusal as refusal:
                raise BindError(f"pod {ref.key} cannot reserve GPUs on {node}: {refusal.reason}", "fit") from None
            return placement, placement.grants, demand.slots

    def _undo(self, ref: PodRef, node: str) -> None:
        """Give back what a bind that did not bind held: its gate hold and its reservation. What the watch shows
        of the pod (bound by another replica) holds the gate again."""
        self.gate.release(node, ref.uid)
        seen = self.cache.record(ref.uid)
        if seen is not None:
            self.gate.observe(seen)
        self.cache.release_reserved(ref.key, ref.uid)


# Ends a bind's Error when neither the Binding POST nor the pod's re-read was answered (the API server
# stalled): whether the pod is bound is unknown, and the Error says so (tests match it).
UNKNOWN_OUTCOME = (
    "; whether the Binding was made could not be read back, so nothing is undone: a bound pod keeps its "
    "allocation, an unbound one's hold is given back by its next bind"
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
    """Whether a GPU pod, as shown, is unbound and without an allocation, with a resourceVersion for its
    Binding to be conditional on (a copy without one is never used)."""
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
