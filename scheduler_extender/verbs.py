"""filter, prioritize and preempt: the scheduler's questions answered from the cache by the core.

This is the glue between the wire (``wire.py``), the cluster cache and the pure core: read the pod,
take a snapshot, call the core, and shape its decision into the exact reply kube-scheduler expects
(same node form as the request, a score for every node, Meta victims). It makes no scheduling
decision of its own. Non-GPU pods pass straight through; a pod whose request annotation is corrupt
gets that error as every node's reason, so the user sees it in the pod's FailedScheduling event.
With ``decide_in_filter``, filter passes only the fitting nodes with the best 0–10 score prioritize would give
(ties kept), so kube-scheduler binds a lone one without scoring; tied nodes get equal scores from prioritize, and
kube-scheduler's own scores break the tie, as they would have among all. When its own scores could weigh more
than a tie (in_tree.py), every fitting node passes and prioritize scores them. The nodes left out are in neither
reply map: kube-scheduler drops them without a status, and the pod is scheduled anyway.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_, is_not
from typing import cast

from scheduler_extender.cache import ClusterCache
from scheduler_extender.events import REASON_FAILED, EventRecorder
from scheduler_extender.memo import NodeMemo
from scheduler_extender.objects import ScheduledPod, scheduled_pod
from scheduler_extender.shown import Recent, ShownPods
from scheduler_extender.wire import (
    ExtenderArgs,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
    NodeList,
    RawObject,
    candidate_victims,
    node_name,
    pdb_violations,
)
from vgpu.catalog import Catalog
from vgpu.scheduling.demand import decision_key, demand_from_request
from vgpu.scheduling.filter import FilterResult, filter_nodes
from vgpu.scheduling.ledger import LedgerRefusal
from vgpu.scheduling.model import Demand, Snapshot
from vgpu.scheduling.packed import Columns, Packs
from vgpu.scheduling.placement import place
from vgpu.scheduling.policy import Policies
from vgpu.scheduling.preempt import Victim, select_victims
from vgpu.scheduling.reasons import Reason
from vgpu.scheduling.scoring import MAX_EXTENDER_PRIORITY, best_scored, score_nodes, to_extender_scores, top_nodes
from vgpu.scheduling.summary import leading_reason, summarize

NO_POD = "request has no Pod"


@dataclass(frozen=True, slots=True)
class Tie:
    """The nodes a deciding filter passed as equals for a pod, and the one its raw score ranks first."""

    nodes: tuple[str, ...]  # in the order filter passed them, which kube-scheduler keeps
    first: str


@dataclass(frozen=True, slots=True)
class Offered:
    """The nodes of a filter/prioritize request, in order, and the raw Node objects when sent in full."""

    names: tuple[str, ...]
    items: dict[str, RawObject] | None  # None: nodeCacheCapable (NodeNames form)


def offered(args: ExtenderArgs) -> Offered:
    if args.NodeNames is not None:
        return Offered(tuple(dict.fromkeys(args.NodeNames)), None)
    items = {node_name(n): n for n in (args.Nodes.items or []) if node_name(n)} if args.Nodes is not None else {}
    return Offered(tuple(items), items if args.Nodes is not None else None)


def filter_reply(
    nodes: Offered, passed: Sequence[str], failed: dict[str, str], unresolvable: dict[str, str], error: str = ""
) -> ExtenderFilterResult:
    """The reply in the request's own form; always an explicit (possibly empty) list."""
    if nodes.items is None:
        return ExtenderFilterResult(
            NodeNames=list(passed), FailedNodes=failed, FailedAndUnresolvableNodes=unresolvable, Error=error
        )
    return ExtenderFilterResult(
        Nodes=NodeList(metadata={}, items=[nodes.items[n] for n in passed]),
        FailedNodes=failed,
        FailedAndUnresolvableNodes=unresolvable,
        Error=error,
    )


class Verbs:
    """The read-side verbs. Thread-safe: state lives in the cache; policies are shared as the core intends."""

    def __init__(
        self,
        cache: ClusterCache,
        catalog: Catalog,
        policies: Policies,
        events: EventRecorder,
        shown: ShownPods,
        *,
        decide_in_filter: bool,
        reservation_ttl: float,
        on_unschedulable: Callable[[str], None] = lambda _: None,
        on_passed: Callable[[str], None] = lambda _: None,
        on_stuck: Callable[[ScheduledPod, Demand, Sequence[str]], None] = lambda *_: None,
        on_preempting: Callable[[str], None] = lambda _: None,
    ) -> None:
        """``on_unschedulable``: a GPU pod failed every offered node, with the reason code that rejected the
        most of them; ``on_stuck``: the same, with the nodes whose reason may pass (the extender's own
        preemption); ``on_preempting``: the preempt verb named GPU victims for the pod; ``on_passed``: what a
        GPU pod's filter passed (``_passed``). ``shown`` keeps each GPU pod as kube-scheduler sent it, for its
        bind."""
        self.cache = cache
        self.catalog = catalog
        self.policies = policies
        self.events = events
        self.shown = shown
        self.decide_in_filter = decide_in_filter
        self.reservation_ttl = reservation_ttl
        self.on_unschedulable = on_unschedulable
        self.on_passed = on_passed
        self.on_stuck = on_stuck
        self.on_preempting = on_preempting
        self.verdicts: NodeMemo[Reason | None] = NodeMemo()
        self.scores: NodeMemo[float | None] = NodeMemo()
        self.packed = Columns()  # packed nodes for a policy that keeps none of its own (_filter)
        self.ties: Recent[Tie] = Recent()  # by pod UID: what the deciding filter passed as equals (prioritize)

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        nodes = offered(args)
        if args.Pod is None:
            return filter_reply(nodes, (), {}, {}, NO_POD)
        pod = scheduled_pod(args.Pod)
        if not pod.is_gpu_pod:
            return filter_reply(nodes, nodes.names, {}, {})
        if pod.request is None:
            message = pod.request_error or "invalid GPU request"
            self.events.warn(pod.ref, REASON_FAILED, message)
            return filter_reply(nodes, (), {}, dict.fromkeys(nodes.names, message))
        self.shown.put(pod.ref.uid, args.Pod)
        demand = demand_from_request(pod.request, pod_key=pod.ref.key, device_ids=pod.device_ids)
        snapshot = self.cache.snapshot(drop_tentative_of=pod.ref.key, scheduling=pod.ref, extra=_values(nodes.items))
        result = self._filter(demand, snapshot, nodes.names)
        passed, failed = list(result.passed), result.failed_messages()
        self.ties.take(pod.ref.uid)  # an earlier cycle's tie says nothing of this one
        best = self._best(pod, demand, snapshot, passed) if self.decide_in_filter and len(passed) > 1 else None
        passed = passed if best is None else best
        self.on_passed(_passed(len(passed), decided=best is not None))
        if len(passed) == 1:
            self._reserve_tentatively(pod, demand, snapshot, passed[0])
        elif not passed:
            reason = leading_reason(result)
            self.on_unschedulable(reason.value if reason is not None else "no-nodes-offered")
            self.events.warn(pod.ref, REASON_FAILED, summarize(demand, result))
            self.on_stuck(pod, demand, tuple(result.failed))
        return filter_reply(nodes, passed, failed, result.unresolvable_messages())

    def prioritize(self, args: ExtenderArgs) -> dict[str, int]:
        """A 0–10 score for every offered node, in the offered order."""
        nodes = offered(args)
        pod = scheduled_pod(args.Pod) if args.Pod is not None else None
        if pod is None or pod.request is None:
            return dict.fromkeys(nodes.names, 0)
        assert args.Pod is not None
        self.shown.put(pod.ref.uid, args.Pod)
        demand = demand_from_request(pod.request, pod_key=pod.ref.key, device_ids=pod.device_ids)
        snapshot = self.cache.snapshot(scheduling=pod.ref, extra=_values(nodes.items))
        tie = self.ties.take(pod.ref.uid)
        if tie is not None and _same(tie.nodes, nodes.names):  # the filter's equals: kube-scheduler decides
            self._reserve_tentatively(pod, demand, snapshot, tie.first)
            return dict.fromkeys(nodes.names, MAX_EXTENDER_PRIORITY)
        raw, demoted = self._ranked(pod, demand, snapshot, nodes.names)
        scores = self._scaled(raw, demoted)
        best = top_nodes(raw, 1)
        if best:
            self._reserve_tentatively(pod, demand, snapshot, best[0])
        return dict(zip(nodes.names, map(scores.get, nodes.names, repeat(0)), strict=True))

    def preempt(self, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        proposed = candidate_victims(args)
        pdbs = pdb_violations(args)
        pod = scheduled_pod(args.Pod) if args.Pod is not None else None
        if pod is None or not pod.is_gpu_pod:
            return _meta_reply({n: uids for n, uids in proposed.items() if uids}, pdbs)
        if pod.request is None:
            return ExtenderPreemptionResult()
        demand = demand_from_request(pod.request, pod_key=pod.ref.key, device_ids=pod.device_ids)
        chosen: dict[str, tuple[str, ...]] = {}
        for node, uids in proposed.items():
            victims = self._victims_on(demand, node, uids)
            if victims:
                chosen[node] = victims
        if chosen:
            self.on_preempting(pod.ref.key)
        return _meta_reply(chosen, pdbs)

    def explain(
        self, pod: ScheduledPod, node_names: Sequence[str] | None = None
    ) -> tuple[Demand, FilterResult, dict[str, int]]:
        """Filter and score ``pod`` against the given nodes (default: every known node), changing nothing."""
        assert pod.request is not None
        demand = demand_from_request(pod.request, pod_key=pod.ref.key, device_ids=pod.device_ids)
        snapshot = self.cache.snapshot()
        names = tuple(node_names) if node_names is not None else tuple(sorted(snapshot.nodes))
        result = filter_nodes(demand, snapshot, names, self.catalog, self.packed)
        raw = score_nodes(demand, snapshot, result.passed, self.policies.for_demand(demand), self.catalog, passed=True)
        return demand, result, to_extender_scores(raw)

    def _filter(self, demand: Demand, snapshot: Snapshot, names: Sequence[str]) -> FilterResult:
        """The core's filter, asked only about nodes whose state changed since it last judged this request. It
        packs the nodes into the policy's own columns where it keeps some, so scoring them gathers none again."""
        policy = self.policies.for_demand(demand)
        packed = policy.columns if isinstance(policy, Packs) else self.packed

        def judge(misses: list[str]) -> list[Reason | None]:
            result = filter_nodes(demand, snapshot, misses, self.catalog, packed)
            return list(map(result.reasons().get, misses))

        verdicts = self.verdicts.values(decision_key(demand), names, snapshot.nodes, judge)
        # C-level passes in the offered order; only rejected nodes are visited one by one.
        passed = tuple(compress(names, map(is_, verdicts, repeat(None))))
        failed: dict[str, Reason] = {}
        unresolvable: dict[str, Reason] = {}
        if len(passed) < len(names):
            rejected = compress(zip(names, verdicts, strict=True), map(is_not, verdicts, repeat(None)))
            for name, reason in cast("Iterator[tuple[str, Reason]]", rejected):
                (unresolvable if reason.unresolvable else failed)[name] = reason
        return FilterResult(passed=passed, failed=failed, unresolvable=unresolvable)

    def _score(self, demand: Demand, snapshot: Snapshot, names: Sequence[str]) -> dict[str, float]:
        """The core's raw scores of the nodes among ``names`` that fit, memoised per node state unless
        locality is involved. Which nodes fit comes from the filter's remembered verdicts (``_filter``):
        a node's fit is checked once per decision, in filter or here for a state that changed since."""
        policy = self.policies.for_demand(demand)

        def fitting(among: Sequence[str]) -> dict[str, float]:
            passed = self._filter(demand, snapshot, among).passed
            return score_nodes(demand, snapshot, passed, policy, self.catalog, passed=True)

        if demand.is_local_gpu:  # locality depends on other pods, not on the node's own state
            return fitting(names)
        key = (decision_key(demand), policy.name, getattr(policy, "revision", None))
        scores = self.scores.values(key, names, snapshot.nodes, lambda misses: list(map(fitting(misses).get, misses)))
        kept = compress(zip(names, scores, strict=True), map(is_not, scores, repeat(None)))
        return dict(cast("Iterator[tuple[str, float]]", kept))

    def _best(self, pod: ScheduledPod, demand: Demand, snapshot: Snapshot, passed: list[str]) -> list[str] | None:
        """The fitting nodes kube-scheduler may choose among by its own scores: those with prioritize's best 0–10
        score (ties kept, and remembered for prioritize); None when its scores weigh more than a tie for this pod
        (in_tree.py), or nothing was scored: every fitting node passes, and prioritize ranks them."""
        if pod.soft_preferences or self.cache.avoided_by(passed, pod.tolerations):
            return None
        raw, _ = self._ranked(pod, demand, snapshot, passed)  # _scaled lifts only the lowest scores
        tied = best_scored(raw, passed)
        if not tied:
            return None
        if len(tied) > 1:
            self.ties.put(pod.ref.uid, Tie(tuple(tied), top_nodes(raw, 1)[0]))  # the best raw score is tied
        return tied

    @staticmethod
    def _scaled(raw: dict[str, float], demoted: bool) -> dict[str, int]:
        """prioritize's 0–10 scores of the ranked nodes; after a demotion (``_ranked``) each is at least 1, so a
        node left out, handing GPUs over, scores below all of them."""
        scores = to_extender_scores(raw)
        return {n: max(1, score) for n, score in scores.items()} if demoted else scores

    def _ranked(
        self, pod: ScheduledPod, demand: Demand, snapshot: Snapshot, names: Sequence[str]
    ) -> tuple[dict[str, float], bool]:
        """The raw scores of the fitting nodes among ``names``, and whether some were left out: a bind to a node
        handing GPUs over to another pod waits at its gate (HANDOFF.md, "Placement"), so while other fitting
        nodes are free now, only they are ranked, and a burst spreads over them."""
        raw = self._score(demand, snapshot, names)
        busy = self.cache.handing_over(pod.ref, pod.allocate_sizes) & raw.keys()
        if busy and len(busy) < len(raw):
            return {n: score for n, score in raw.items() if n not in busy}, True
        return raw, False

    def _victims_on(self, demand: Demand, node: str, proposed: Sequence[str]) -> tuple[str, ...]:
        """The scheduler's victims on ``node`` narrowed by the core; () vetoes the node."""
        view = self.cache.node(node)
        if view is None:
            return ()
        allowed, now = set(proposed), time.time()
        records = {r.ref.key: r for r in self.cache.records_on(node) if r.ref.uid in allowed}
        candidates = [
            Victim(pod_key=key, qos=r.allocation.qos, grants=r.allocation.gpus, slots=r.slots)
            for key, r in records.items()
            if r.allocation is not None and not r.protected(now, view.labels)
        ]
        selected = select_victims(demand, view, candidates, self.catalog)
        if selected is None:
            return ()
        gpu_victims = {records[key].ref.uid for key in selected}
        if not gpu_victims:
            return tuple(proposed)  # the GPUs fit already: the scheduler's own (CPU/memory) victims stand
        ours = {r.ref.uid for r in records.values()}
        return tuple(uid for uid in proposed if uid in gpu_victims or uid not in ours)

    def _reserve_tentatively(self, pod: ScheduledPod, demand: Demand, snapshot: Snapshot, node: str) -> None:
        """Hold room on the node this pod will most likely be bound to, until its bind or a TTL."""
        view = snapshot.nodes.get(node)
        if view is None or self.cache.base_node(node) is None:
            return
        placement = place(demand, view, self.policies.for_demand(demand), self.catalog)
        if placement is None:
            return
        # LedgerRefusal: another pod took the room since the snapshot; bind re-checks and says so.
        with contextlib.suppress(LedgerRefusal):
            expires_at = self.cache.clock() + self.reservation_ttl
            self.cache.reserve(
                pod.ref, node, placement.grants, qos=demand.qos, expires_at=expires_at, slots=demand.slots
            )


def _same(tied: tuple[str, ...], offered: tuple[str, ...]) -> bool:
    """Whether prioritize is offered exactly the tied nodes: in the same order (pointer comparisons), else as sets."""
    return tied == offered or (len(tied) == len(offered) and set(tied) == set(offered))


def _passed(passed: int, *, decided: bool) -> str:
    """What a filter passed (the ``tf_extender_filter_passes_total`` label): none, one, a tie it decided on, or
    every fitting node, left for prioritize to rank."""
    if passed <= 1:
        return ("none", "one")[passed]
    return "tie" if decided else "every"


def _values(items: dict[str, RawObject] | None) -> Sequence[RawObject]:
    return () if items is None else tuple(items.values())


def _meta_reply(victims: dict[str, tuple[str, ...]], pdbs: dict[str, int]) -> ExtenderPreemptionResult:
    return ExtenderPreemptionResult(
        NodeNameToMetaVictims={
            node: MetaVictims(Pods=[MetaPod(UID=u) for u in uids], NumPDBViolations=pdbs.get(node, 0))
            for node, uids in victims.items()
        }
    )
