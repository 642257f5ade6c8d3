"""Which GPU pods to evict from a node so that a higher-QoS pod fits there — or a veto.

kube-scheduler's DefaultPreemption does not know which GPU a victim frees room on, so the extender
re-decides per candidate node: only pods of strictly lower QoS may go, the lowest QoS level that
suffices is used, and within it the fewest victims; no subset that works vetoes the node.
:func:`plan` answers, by the same rules, the fragmented case kube-scheduler's dry run never asks
about, for the extender's own preemptor. The exact search is bounded (:data:`SEARCH_BUDGET`); past it
a greedy add-then-prune returns a minimal set. Tie-breaks and why: vgpu/scheduling/README.md,
section "Preemption".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from vgpu.catalog import Catalog
from vgpu.contract.allocation import GpuGrant
from vgpu.names import Qos
from vgpu.scheduling.fit import ModelMatcher, check_node, serving
from vgpu.scheduling.ledger import held_vram
from vgpu.scheduling.model import Demand, NodeState
from vgpu.scheduling.placement import place
from vgpu.scheduling.policy import Policy
from vgpu.scheduling.reasons import ReasonCode

SEARCH_BUDGET = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class Victim:
    """A pod that holds GPUs on the node and could be evicted."""

    pod_key: str
    qos: Qos
    grants: tuple[GpuGrant, ...]
    whole: bool = False
    slots: int = 1  # vGPU device IDs on each granted GPU


def select_victims(
    demand: Demand, node: NodeState, candidates: Sequence[Victim], catalog: Catalog
) -> tuple[str, ...] | None:
    """The pod keys to evict (lowest QoS first) so the demand fits; () if it fits already; None to veto.

    ``node``'s GPU usage must include the candidates' grants (a ledger-applied node).
    """
    match = ModelMatcher(catalog, demand.gpu_model)
    reason = check_node(demand, node, match)
    if reason is None:
        return ()
    if reason.unresolvable:
        return None
    eligible = {g.uuid for g in serving(demand, node).gpus if g.healthy and match(g.model)}
    # Short of slots, any pod holding device IDs may help: the kubelet counts the node's total.
    ids = reason.code is ReasonCode.INSUFFICIENT_SLOTS
    useful = [
        v
        for v in candidates
        if v.qos.rank < demand.qos.rank and ((ids and v.slots > 0) or any(g.uuid in eligible for g in v.grants))
    ]
    for level in sorted({v.qos.rank for v in useful}):
        pool = sorted((v for v in useful if v.qos.rank <= level), key=_eviction_order)
        if _fits_without(demand, node, pool, match):
            chosen = _fewest(demand, node, pool, match)
            return tuple(v.pod_key for v in sorted(chosen, key=_eviction_order))
    return None


def _eviction_order(v: Victim) -> tuple[int, int, str]:
    """Lowest QoS first, then the one freeing the most (fewer victims), then by key for determinism."""
    return (v.qos.rank, -_freed(v), v.pod_key)


def _freed(v: Victim) -> int:
    return sum(held_vram(g) for g in v.grants)


def _fewest(demand: Demand, node: NodeState, pool: list[Victim], match: ModelMatcher) -> tuple[Victim, ...]:
    budget = SEARCH_BUDGET
    for size in range(1, len(pool)):
        best: tuple[Victim, ...] | None = None
        best_key: tuple[int, int] | None = None
        for combo in combinations(pool, size):
            budget -= 1
            if budget < 0:
                return _greedy(demand, node, pool, match)
            key = (sum(v.qos.rank for v in combo), sum(_freed(v) for v in combo))
            if (best_key is None or key < best_key) and _fits_without(demand, node, combo, match):
                best, best_key = combo, key
        if best is not None:
            return best
    return tuple(pool)  # the caller checked the whole pool works; no smaller subset does


def _greedy(demand: Demand, node: NodeState, pool: list[Victim], match: ModelMatcher) -> tuple[Victim, ...]:
    chosen: list[Victim] = []
    for victim in pool:
        chosen.append(victim)
        if _fits_without(demand, node, chosen, match):
            break
    for victim in sorted(chosen, key=_eviction_order, reverse=True):
        rest = [v for v in chosen if v is not victim]
        if _fits_without(demand, node, rest, match):
            chosen = rest
    return tuple(chosen)


def _fits_without(demand: Demand, node: NodeState, victims: Iterable[Victim], match: ModelMatcher) -> bool:
    return check_node(demand, without(node, victims), match) is None


def without(node: NodeState, victims: Iterable[Victim]) -> NodeState:
    """``node`` as it is once ``victims`` (whose grants it counts) are gone."""
    freed: dict[str, tuple[int, int, int, bool, int]] = {}
    ids = 0
    for victim in victims:
        ids += victim.slots * len(victim.grants)
        for g in victim.grants:
            t, v, pods, whole, slots = freed.get(g.uuid, (0, 0, 0, False, 0))
            freed[g.uuid] = (
                t + g.tflops_request,
                v + held_vram(g),
                pods + 1,
                whole or victim.whole,
                slots + victim.slots,
            )
    gpus = []
    for gpu in node.gpus:
        f = freed.get(gpu.uuid)
        if f is not None:
            gpu = replace(
                gpu,
                tflops_used=gpu.tflops_used - f[0],
                vram_used=gpu.vram_used - f[1],
                pods=max(gpu.pods - f[2], 0),
                whole=gpu.whole and not f[3],
                slots_used=max(gpu.slots_used - f[4], 0),
            )
        gpus.append(gpu)
    return replace(node, gpus=tuple(gpus), slots_used=max(node.slots_used - ids, 0))


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A node the pod fits by kube-scheduler's totals but not on any set of its GPUs, with the GPU pods on
    it: ``leaving`` are already being deleted (their room is coming), ``victims`` could be evicted."""

    node: NodeState
    victims: Sequence[Victim]
    leaving: Sequence[Victim] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """Evict ``victims`` (pod keys, in order) on ``node``; the pod then takes ``grants`` there."""

    node: str
    victims: tuple[str, ...]
    grants: tuple[GpuGrant, ...]


def plan(demand: Demand, candidates: Iterable[Candidate], policy: Policy, catalog: Catalog) -> Plan | None:
    """Where to preempt for ``demand``, on the candidate whose victims cost least, or None.

    The same rules as the preempt verb per node (:func:`select_victims`: strictly lower QoS, the lowest
    level that suffices, the fewest); across nodes, as kube-scheduler ranks candidates: the lowest highest
    victim QoS, then the fewest victims, then the lowest QoS sum, then the least capacity taken away, then
    the node name. A node where the pods already leaving make room needs no victim and wins.
    """
    best: tuple[tuple[int, int, int, int, str], Plan] | None = None
    for candidate in candidates:
        node = without(candidate.node, candidate.leaving)
        chosen = select_victims(demand, node, candidate.victims, catalog)
        if chosen is None:
            continue
        gone = [v for v in candidate.victims if v.pod_key in chosen]
        placement = place(demand, without(node, gone), policy, catalog)
        if placement is None:
            continue
        ranks = [v.qos.rank for v in gone]
        key = (max(ranks, default=-1), len(gone), sum(ranks), sum(map(_freed, gone)), node.name)
        if best is None or key < best[0]:
            best = (key, Plan(node.name, chosen, placement.grants))
    return None if best is None else best[1]
