"""Preemption kube-scheduler cannot see: a pod that fits a node's GPU totals but no single GPU there.

kube-scheduler counts GPU shares only as node totals, so when the totals have room but no GPU has
(fragmentation) its preemption dry run reprieves every victim and never calls our ``preempt`` verb.
So the filter verb hands such a pod here (``consider``); after ``settle`` seconds, if it is still
unbound, not being deleted and not left to kube-scheduler's own preemption, the core
(``vgpu.scheduling.preempt.plan``) picks the node and the fewest, lowest-QoS victims, which are
evicted through the Eviction API. The pod is nominated and the freed GPUs are held for it for
``hold`` seconds. Only the replica whose kube-scheduler leads gets filter calls, so only it preempts.
The whole rule: deploy/README.md, section "GPU shares as node resources".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from scheduler_extender.cache import ClusterCache
from scheduler_extender.events import REASON_PREEMPTED, REASON_PREEMPTING, REASON_PREEMPTION_BLOCKED, EventRecorder
from scheduler_extender.gateway import KubeGateway
from scheduler_extender.objects import PodRecord, PodRef, ScheduledPod, do_not_disrupt
from tf_shell.kube.api import GatewayError, RawObject
from tf_shell.periodic import Periodic
from vgpu.catalog import Catalog
from vgpu.quantity import format_bytes, format_milli
from vgpu.scheduling.model import Demand
from vgpu.scheduling.policy import Policies
from vgpu.scheduling.preempt import Candidate, Plan, Victim, plan

log = logging.getLogger(__name__)

TOO_MANY_REQUESTS: Final = 429  # the Eviction API's answer when a PodDisruptionBudget forbids it now
# Every outcome of a plan that ``on_result`` hears; /metrics shows each from the start (at 0).
RESULTS: Final = ("evicted", "nominated", "none", "blocked", "skipped", "error")


@dataclass(frozen=True, slots=True)
class Pending:
    """A pod the filter failed everywhere, the nodes it was offered, and when."""

    pod: ScheduledPod
    demand: Demand
    nodes: tuple[str, ...]
    at: float


def awaiting(pod: RawObject | None, uid: str) -> bool:
    """Whether the pod as read now still waits for room: the same pod, unbound, not being deleted."""
    if pod is None:
        return False
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    return meta.get("uid") == uid and not spec.get("nodeName") and meta.get("deletionTimestamp") is None


def protection_ends(records: Sequence[PodRecord], now: float, node_labels: Mapping[str, str]) -> float | None:
    """When the first eviction protection still running among ``records`` ends (None: none that will): a plan
    that found no victim is tried again then, without waiting for the scheduler to ask."""
    if do_not_disrupt(node_labels):
        return None  # the node's: it does not end
    ends = [
        r.protected_until
        for r in records
        if r.allocation is not None and not r.deleting and r.protected_until is not None and r.protected_until > now
    ]
    return min(ends, default=None)


def victims_and_leaving(
    records: Sequence[PodRecord], refused: Mapping[str, float], now: float, node_labels: Mapping[str, str]
) -> tuple[list[Victim], list[Victim]]:
    """The possible victims and the pods already leaving among ``records`` (bound GPU pods on one node, whose
    labels are ``node_labels``); a pod whose eviction a PodDisruptionBudget refused until a time still ahead,
    or one protected now (eviction-protection, do-not-disrupt), is no victim."""
    victims: list[Victim] = []
    leaving: list[Victim] = []
    for r in records:
        if r.allocation is None or r.node_name is None or refused.get(r.ref.key, 0.0) > now:
            continue
        victim = Victim(pod_key=r.ref.key, qos=r.allocation.qos, grants=r.allocation.gpus, slots=r.slots)
        if r.deleting:
            leaving.append(victim)
        elif not r.protected(now, node_labels):
            victims.append(victim)
    return victims, leaving


class Preemptor:
    """Thread-safe: ``consider`` and ``scheduler_preempts`` come from request threads, passes from its own."""

    def __init__(
        self,
        gateway: KubeGateway,
        cache: ClusterCache,
        catalog: Catalog,
        policies: Policies,
        events: EventRecorder,
        *,
        settle: float,
        hold: float,
        on_result: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``on_result`` hears each plan's outcome, one of :data:`RESULTS`."""
        self.gateway = gateway
        self.cache = cache
        self.catalog = catalog
        self.policies = policies
        self.events = events
        self.settle = settle
        self.hold = hold
        self.clock = clock
        self.on_result = on_result
        self._lock = threading.Lock()
        self._pending: dict[str, Pending] = {}  # pod key -> its first unplanned failure
        self._busy: dict[str, float] = {}  # pod key -> until when it is not planned for again
        self._refused: dict[str, float] = {}  # victim key -> until when it is not chosen (a PDB refused it)
        self.worker = Periodic("preemptor", min(settle, 0.25) or 0.25, self.run_due)

    def consider(self, pod: ScheduledPod, demand: Demand, nodes: Sequence[str]) -> None:
        """The filter failed ``pod`` on every one of ``nodes``: preempt for it later if that still holds."""
        if not nodes or demand.qos.rank == 0:
            return  # the lowest QoS preempts nobody
        now = self.clock()
        with self._lock:
            if self._busy.get(pod.ref.key, 0.0) > now or pod.ref.key in self._pending:
                return
            self._pending[pod.ref.key] = Pending(pod, demand, tuple(nodes), now)

    def scheduler_preempts(self, pod_key: str) -> None:
        """kube-scheduler's own preemption evicts for the pod (our preempt verb named it victims): leave it be."""
        with self._lock:
            self._busy[pod_key] = self.clock() + self.hold
            self._pending.pop(pod_key, None)

    def run_due(self) -> list[str]:
        """Plan for every pod whose ``settle`` time has passed; the results, in order."""
        now = self.clock()
        with self._lock:
            due = [p for p in self._pending.values() if p.at + self.settle <= now]
            for p in due:
                del self._pending[p.pod.ref.key]
            for table in (self._busy, self._refused):
                for key in [k for k, until in table.items() if until <= now]:
                    del table[key]
        results = [self._preempt_for(p) for p in due]
        for result in results:
            self.on_result(result)
        return results

    def _preempt_for(self, pending: Pending) -> str:
        ref, demand = pending.pod.ref, pending.demand
        now = self.clock()
        with self._lock:
            if self._busy.get(ref.key, 0.0) > now:
                return "skipped"
            refused = dict(self._refused)
        try:
            pod = self.gateway.get_pod(ref.namespace, ref.name)
        except GatewayError as exc:
            log.warning("preemption for pod %s: reading it failed: %s", ref.key, exc)
            return "error"
        if not awaiting(pod, ref.uid):
            return "skipped"
        candidates, on_node, ends = [], {}, []
        for name in pending.nodes:
            view = self.cache.node(name)
            if view is not None:
                on_node[name] = self.cache.records_on(name)
                victims, leaving = victims_and_leaving(on_node[name], refused, now, view.labels)
                candidates.append(Candidate(node=view, victims=victims, leaving=leaving))
                ends.append(protection_ends(on_node[name], now, view.labels))
        chosen = plan(demand, candidates, self.policies.for_demand(demand), self.catalog)
        if chosen is None:
            first = min((end for end in ends if end is not None), default=None)
            if first is not None:  # a protected pod may be the victim once its protection is over
                with self._lock:
                    self._pending.setdefault(ref.key, replace(pending, at=first - self.settle))
            return "none"
        records = {r.ref.key: r for r in on_node[chosen.node]}
        for key in chosen.victims:
            victim = records[key].ref
            try:
                self.gateway.evict_pod(victim.namespace, victim.name, victim.uid)
            except GatewayError as exc:
                return self._refusal(ref, victim, exc)
            self.events.warn(victim, REASON_PREEMPTED, _victim_message(ref, demand, chosen))
        self._nominate(ref, demand, chosen)
        return "evicted" if chosen.victims else "nominated"

    def _refusal(self, ref: PodRef, victim: PodRef, exc: GatewayError) -> str:
        if exc.status != TOO_MANY_REQUESTS:
            log.warning("preemption for pod %s: evicting %s failed: %s", ref.key, victim.key, exc)
            return "error"
        with self._lock:
            self._refused[victim.key] = self.clock() + self.hold
        message = (
            f"evicting {victim.key} to make GPU room was refused: {exc}; another plan is tried on the next attempt"
        )
        self.events.warn(ref, REASON_PREEMPTION_BLOCKED, message)
        return "blocked"

    def _nominate(self, ref: PodRef, demand: Demand, chosen: Plan) -> None:
        until = self.clock() + self.hold
        self.cache.nominate(ref, chosen.node, chosen.grants, qos=demand.qos, slots=demand.slots, expires_at=until)
        with self._lock:
            self._busy[ref.key] = until
        gpus = ", ".join(g.uuid for g in chosen.grants)
        whom = ", ".join(chosen.victims) or "no one (pods already leaving make room)"
        self.events.normal(
            ref, REASON_PREEMPTING, f"GPU room on node {chosen.node} ({gpus}) held for this pod; evicted: {whom}"
        )
        try:
            self.gateway.nominate_pod(ref.namespace, ref.name, ref.uid, chosen.node)
        except GatewayError as exc:  # the cache's hold still keeps the room for it
            log.warning("preemption for pod %s: nominating %s failed: %s", ref.key, chosen.node, exc)


def _victim_message(preemptor: PodRef, demand: Demand, chosen: Plan) -> str:
    # The share the pod takes there, from its grants (a compute percent is in that node's TFLOPS).
    tflops = chosen.grants[0].tflops_request if chosen.grants else demand.tflops
    share = f"{format_milli(tflops)} TFLOPS and {format_bytes(demand.vram)} VRAM"
    return (
        f"preempted by tensor-fusion for pod {preemptor.key} (qos {demand.qos}) on node {chosen.node}: no single GPU "
        f"there had room for {share} per GPU, and this pod's QoS is lower"
    )
