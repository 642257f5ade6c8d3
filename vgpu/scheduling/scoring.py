"""From a policy's raw per-node scores to what kube-scheduler accepts, plus the cross-policy terms.

Policies score in fine-grained floats; kube-scheduler's extender protocol only takes integers
0–10 (``MaxExtenderPriority``), added as ``Score × weight × 10`` to the in-tree plugin total. So:
:func:`score_nodes` collects raw scores (the policy's base in [0, 1] plus additive terms that hold
for every policy — local-GPU affinity and an optional smaller-model preference), then
:func:`to_extender_scores` stretches them min–max onto 0–10, and :func:`top_nodes` names the best
(the node a decision holds room on; the replay's variant that keeps only the best k).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from math import floor
from operator import attrgetter
from typing import cast

from vgpu.catalog import Catalog
from vgpu.scheduling.compute_share import on_node
from vgpu.scheduling.fit import ModelMatcher, check_node, eligible_node
from vgpu.scheduling.model import Demand, NodeState, Snapshot
from vgpu.scheduling.policy import Policy, ScoresMany, scores_by_state

MAX_EXTENDER_PRIORITY = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreTerms:
    """Additive terms on top of the policy's base score (which lives in [0, 1]).

    ``locality`` is added on nodes where the pod's workload already holds GPUs, when the pod asks
    for a local GPU; 1.0 makes any such node beat any other. ``smaller_model`` × (1 − the node's
    largest eligible GPU TFLOPS / the largest among the scored nodes) prefers the smallest (usually
    cheapest) model that fits; 0 turns it off.
    """

    locality: float = 1.0
    smaller_model: float = 0.0


def score_nodes(
    demand: Demand,
    snapshot: Snapshot,
    node_names: Iterable[str],
    policy: Policy,
    catalog: Catalog,
    terms: ScoreTerms = ScoreTerms(),
    *,
    passed: bool = False,
) -> dict[str, float]:
    """Raw scores (higher is better) of the offered nodes that can take the demand now; others are absent.

    ``passed``: the caller's filter already found each of these node states able to take the demand,
    so the fit check, the costliest part of a cold decision, is not run a second time. A policy that
    scores by state alone (:func:`~vgpu.scheduling.policy.scores_by_state`) scores each node
    state once; the locality term, which depends on the node's name, is added per node. One that
    scores many nodes at once (:class:`~vgpu.scheduling.policy.ScoresMany`) gets them in one call,
    without a walk over them when they passed and need no narrowing (:func:`_at_once`).
    """
    match = ModelMatcher(catalog, demand.gpu_model)
    local: frozenset[str] = frozenset()
    if demand.is_local_gpu and demand.workload is not None:
        local = snapshot.workload_nodes.get(demand.workload, frozenset())
    nodes = snapshot.nodes
    raw: dict[str, float] = {}
    largest: dict[str, int] = {}
    policy_score = policy.score
    by_state: dict[int, float] | None = {} if scores_by_state(policy) and not terms.smaller_model else None
    many = policy.score_many if isinstance(policy, ScoresMany) and by_state is None else None
    if many is not None and passed and not terms.smaller_model:
        at_once = _at_once(demand, nodes, node_names, match, many)
        if at_once is not None:
            for name in local.intersection(at_once) if local else ():
                at_once[name] += terms.locality
            return at_once
    deferred: list[tuple[str, NodeState]] = []  # scored by ``many`` after the walk, in the offered order
    for name in node_names:  # every offered node on a cold decision: the common case inline
        node = nodes.get(name)
        if node is None or name in raw or (not passed and check_node(demand, node, match) is not None):
            continue
        known = None if by_state is None else by_state.get(node.state())
        if known is not None:
            score = known
        else:
            totals = node.totals()
            mode = demand.isolation
            every = (
                totals.all_healthy
                and match.every(totals.models)
                and (mode is None or mode in totals.isolation)
                and demand.gpu_indices is None
            )
            view = node if every else eligible_node(demand, node, match)
            scored = demand if demand.compute_percent is None else on_node(demand, view)
            if many is not None and scored is demand:
                deferred.append((name, view))
                score = 0.0  # its place in ``raw``: the policy's score is added below
            else:
                score = policy_score(scored, view)
            if by_state is not None:
                by_state[node.state()] = score
        if local and name in local:
            score += terms.locality
        raw[name] = score
        if terms.smaller_model:
            largest[name] = max(g.tflops for g in view.gpus)
    if many is not None and deferred:
        for (name, _), score in zip(deferred, many(demand, [view for _, view in deferred]), strict=True):
            raw[name] += score
    if largest:
        top = max(largest.values())
        for name, tflops in largest.items():
            raw[name] += terms.smaller_model * (1.0 - tflops / top if top else 0.0)
    return raw


def _at_once(
    demand: Demand,
    nodes: Mapping[str, NodeState],
    node_names: Iterable[str],
    match: ModelMatcher,
    many: Callable[[Demand, Sequence[NodeState]], list[float]],
) -> dict[str, float] | None:
    """The policy's scores of nodes that passed the filter, all in one call without a walk over them, when
    each is its own eligible view (every GPU healthy and of the demanded model) and the demand is in TFLOPS
    on any of its GPUs; else None (the walk narrows each node, or converts the demand, as it needs)."""
    if demand.compute_percent is not None or demand.isolation is not None or demand.gpu_indices is not None:
        return None
    names = list(dict.fromkeys(node_names))
    views = list(map(nodes.get, names))
    if not all(views):
        return None  # a node unknown to the snapshot: absent from the scores, as the walk leaves it
    totals = list(map(NodeState.totals, cast("list[NodeState]", views)))
    if not all(map(_all_healthy, totals)) or not all(map(match.every, set(map(_models, totals)))):
        return None
    return dict(zip(names, many(demand, cast("list[NodeState]", views)), strict=True))


_all_healthy = attrgetter("all_healthy")
_models = attrgetter("models")


def to_extender_scores(raw: Mapping[str, float]) -> dict[str, int]:
    """Min–max onto kube-scheduler's integer 0–10: the best node gets 10, the worst 0, all equal all 10."""
    if not raw:
        return {}
    low, high = min(raw.values()), max(raw.values())
    if high <= low:
        return dict.fromkeys(raw, MAX_EXTENDER_PRIORITY)
    span = high - low
    return {name: _extender_score(s, low, span) for name, s in raw.items()}


def _extender_score(raw: float, low: float, span: float) -> int:
    """One raw score's place between ``low`` and ``low + span`` on 0–10, rounded half up."""
    return floor(MAX_EXTENDER_PRIORITY * (raw - low) / span + 0.5)


def best_scored(raw: Mapping[str, float], order: Iterable[str]) -> list[str]:
    """The names in ``order`` that :func:`to_extender_scores` gives the top score (10), in that order; one pass
    that maps no other node. Every such score is at least 95 % of the way from the lowest to the highest, so
    only nodes past 90 % are put to the same rounding."""
    if not raw:
        return []
    low, high = min(raw.values()), max(raw.values())
    if high <= low:
        return [name for name in order if name in raw]
    span = high - low
    cut = low + 0.9 * span
    return [
        name
        for name in order
        if (s := raw.get(name)) is not None and s >= cut and _extender_score(s, low, span) >= MAX_EXTENDER_PRIORITY
    ]


def top_nodes(raw: Mapping[str, float], keep: int) -> tuple[str, ...]:
    """The ``keep`` best-scored node names, best first (ties broken by name, for determinism)."""
    if keep <= 0 or not raw:
        return ()
    if keep == 1:  # prioritize's case, every call: two linear passes instead of sorting every node
        best = max(raw.values())
        return (min([name for name, score in raw.items() if score == best]),)
    return tuple(sorted(raw, key=lambda name: (-raw[name], name))[:keep])
