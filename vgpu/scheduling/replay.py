"""Replay a pod sequence against a simulated cluster through the extender's own decisions.

The placement benchmark (openb traces) and ``tfctl plan`` need "submit these pods one by one to these
nodes and tell me where each lands", with the answer the real extender would give. So every decision
goes through the functions the HTTP verbs call (:func:`~vgpu.scheduling.scoring.score_nodes`,
:func:`~vgpu.scheduling.scoring.to_extender_scores`, :func:`~vgpu.scheduling.scoring.top_nodes`,
:func:`~vgpu.scheduling.placement.place`), and kube-scheduler's choice is emulated. For speed, nodes
in the same state are grouped into classes judged once per pod shape; a :class:`Revisioned` policy
invalidates cached scores, and a :class:`ClusterAware` one is shown every node once at the start.
Details: vgpu/scheduling/README.md, section "Replay".
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol, runtime_checkable

from vgpu.catalog import Catalog
from vgpu.scheduling.demand import decision_key
from vgpu.scheduling.model import Demand, GpuState, NodeState, Snapshot
from vgpu.scheduling.placement import place
from vgpu.scheduling.policy import ClusterAware, Policy
from vgpu.scheduling.scoring import MAX_EXTENDER_PRIORITY, score_nodes, to_extender_scores, top_nodes


class Selection(StrEnum):
    """How the winning node is picked among the feasible ones."""

    # kube-scheduler with our extender: raw → 0–10 (to_extender_scores) × weight × 10, ties by rank.
    EXTENDER = "extender"
    # The policy's raw score itself, ties by rank (the paper's simulator, where scores are in-tree).
    RAW = "raw"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayConfig:
    """``keep``: the filter passes only the ``keep`` best-scored nodes (None: every feasible node)."""

    selection: Selection = Selection.EXTENDER
    keep: int | None = None
    weight: int = 1
    max_pods: int | None = None  # pods per node, CPU-only ones included (kubelet's maxPods)


@dataclass(frozen=True, slots=True)
class Outcome:
    """Where one submitted pod went: ``node`` None means it fitted nowhere and was dropped."""

    demand: Demand
    node: str | None
    gpus: tuple[int, ...] = ()  # GPU indices on the node


@runtime_checkable
class Revisioned(Protocol):
    """A policy whose scores change over time; a new ``revision`` drops the replay's cached scores."""

    @property
    def revision(self) -> int: ...


_Key = tuple[object, ...]


def state_key(node: NodeState, full: bool) -> _Key:
    """Everything a name-blind, GPU-order-blind policy and the filter can see of a node."""
    gpus = sorted(
        (
            g.model,
            g.tflops,
            g.vram,
            g.slots,
            g.tflops_used,
            g.vram_used,
            g.slots_used,
            g.pods,
            g.whole,
            g.healthy,
            g.numa or -1,
        )
        for g in node.gpus
    )
    labels = tuple(sorted(node.labels.items()))
    state = (node.cpu_free, node.memory_free, node.inventory_error, node.slots_used)
    return (node.pool, labels, *state, full, tuple(gpus))


def shape_key(demand: Demand) -> _Key:
    """Everything the filter and a policy can see of a demand, its identity aside (the extender's memo key)."""
    affinity = demand.node_affinity
    if affinity is not None and "matchFields" in repr(affinity):
        raise ValueError(f"{demand.pod_key}: the replay groups nodes by state and cannot honour matchFields")
    return decision_key(demand)


class _Class:
    """Nodes in one state: their indices and a lazy min-heap of (rank, index)."""

    __slots__ = ("alive", "cid", "full", "heap", "members")

    def __init__(self, cid: str, full: bool) -> None:
        self.cid = cid
        self.full = full  # at max_pods: fits nothing
        self.alive = True
        self.members: set[int] = set()
        self.heap: list[tuple[int, int]] = []

    def best(self) -> tuple[int, int]:
        """(rank, index) of the member that wins ties."""
        heap = self.heap
        while heap[0][1] not in self.members:
            heapq.heappop(heap)
        return heap[0]


class _Verdicts:
    """For one demand shape: the feasible classes with their raw scores, and how far it has looked.

    A class is a fixed state, so its verdict never changes: each class is judged once per shape
    (when first needed) and infeasible ones are never visited again.
    """

    __slots__ = ("feasible", "upto")

    def __init__(self) -> None:
        self.upto = 0  # classes created before this index have been judged
        self.feasible: dict[_Class, float] = {}


class Cluster:
    """Mutable replay state: the nodes, their classes, and what each node holds."""

    def __init__(self, nodes: Sequence[NodeState], ranks: Sequence[int] | None = None, max_pods: int | None = None):
        if ranks is not None and len(ranks) != len(nodes):
            raise ValueError("one rank per node")
        self.nodes = list(nodes)
        self.ranks = list(ranks) if ranks is not None else list(range(len(nodes)))
        self.max_pods = max_pods
        self.pods = [0] * len(nodes)
        self.classes: dict[_Key, _Class] = {}
        self.reps: dict[str, NodeState] = {}  # class id → a member, for score_nodes
        self.by_id: dict[str, _Class] = {}
        self.created: list[_Class] = []  # every class ever made, in creation order
        self._of: list[_Key] = []
        self._next = 0
        for i in range(len(nodes)):
            self._of.append(())
            self._join(i)

    def _full(self, i: int) -> bool:
        return self.max_pods is not None and self.pods[i] >= self.max_pods

    def _join(self, i: int) -> None:
        full = self._full(i)
        key = state_key(self.nodes[i], full)
        cls = self.classes.get(key)
        if cls is None:
            cls = self.classes[key] = _Class(f"c{self._next}", full)
            self.by_id[cls.cid] = cls
            self.created.append(cls)
            self._next += 1
        cls.members.add(i)
        heapq.heappush(cls.heap, (self.ranks[i], i))
        self.reps[cls.cid] = self.nodes[i]
        self._of[i] = key

    def _leave(self, i: int) -> None:
        key = self._of[i]
        cls = self.classes[key]
        cls.members.discard(i)
        if not cls.members:
            del self.classes[key]
            del self.reps[cls.cid]
            del self.by_id[cls.cid]
            cls.alive = False
        elif self.reps[cls.cid] is self.nodes[i]:
            self.reps[cls.cid] = self.nodes[next(iter(cls.members))]

    def commit(self, i: int, demand: Demand, gpus: tuple[GpuState, ...], whole: bool) -> None:
        """Reserve the demand on node ``i``: the same arithmetic as the ledger's grants."""
        self._leave(i)
        node = self.nodes[i]
        chosen = {g.uuid for g in gpus}
        new_gpus = tuple(_take(g, demand, whole) if g.uuid in chosen else g for g in node.gpus)
        cpu = None if node.cpu_free is None else node.cpu_free - demand.cpu
        memory = None if node.memory_free is None else node.memory_free - demand.memory
        slots_used = node.slots_used + demand.slots * len(gpus)
        self.nodes[i] = replace(node, gpus=new_gpus, cpu_free=cpu, memory_free=memory, slots_used=slots_used)
        self.pods[i] += 1
        self._join(i)


def _take(gpu: GpuState, demand: Demand, whole: bool) -> GpuState:
    slots_used = gpu.slots_used + demand.slots
    if whole:
        return replace(
            gpu, tflops_used=gpu.tflops, vram_used=gpu.vram, pods=gpu.pods + 1, whole=True, slots_used=slots_used
        )
    return replace(
        gpu,
        tflops_used=gpu.tflops_used + demand.tflops,
        vram_used=gpu.vram_used + demand.vram_held,
        pods=gpu.pods + 1,
        slots_used=slots_used,
    )


class Replay:
    """Submits demands one at a time; each call to :meth:`submit` is one kube-scheduler cycle + bind."""

    def __init__(
        self,
        cluster: Cluster,
        policy: Policy,
        catalog: Catalog,
        config: ReplayConfig = ReplayConfig(),
    ) -> None:
        self.cluster = cluster
        self.policy = policy
        self.catalog = catalog
        self.config = config
        if isinstance(policy, ClusterAware):
            policy.see_cluster(cluster.nodes)  # the inventory and what it holds now; commits go through observe
        self._revision = policy.revision if isinstance(policy, Revisioned) else 0
        self._index = {n.name: i for i, n in enumerate(cluster.nodes)}
        self._verdicts: dict[_Key, _Verdicts] = {}

    def _raw(self, demand: Demand) -> dict[str, float]:
        """Raw score per feasible class id; new classes are judged through :func:`score_nodes`."""
        if isinstance(self.policy, Revisioned) and self.policy.revision != self._revision:
            self._revision = self.policy.revision
            self._verdicts.clear()
        key = shape_key(demand)
        verdicts = self._verdicts.get(key)
        if verdicts is None:
            verdicts = self._verdicts[key] = _Verdicts()
        created = self.cluster.created
        if verdicts.upto < len(created):
            fresh = [c for c in created[verdicts.upto :] if c.alive and not c.full]
            verdicts.upto = len(created)
            if fresh:
                snapshot = Snapshot(nodes=self.cluster.reps)
                scores = score_nodes(demand, snapshot, [c.cid for c in fresh], self.policy, self.catalog)
                for c in fresh:
                    score = scores.get(c.cid)
                    if score is not None:
                        verdicts.feasible[c] = score
        feasible = verdicts.feasible
        dead = [c for c in feasible if not c.alive]
        for c in dead:
            del feasible[c]
        return {c.cid: s for c, s in feasible.items()}

    def choose(self, demand: Demand) -> int | None:
        """The index of the node kube-scheduler would pick, or None when no node fits."""
        raw = self._raw(demand)
        if not raw:
            return None
        by_id = self.cluster.by_id
        config = self.config
        if config.selection is Selection.RAW:
            top = max(raw.values())
            return min(by_id[cid].best() for cid, s in raw.items() if s == top)[1]
        if config.keep is None:
            ints = to_extender_scores(raw)
            top_int = max(ints.values())
            return min(by_id[cid].best() for cid, s in ints.items() if s == top_int)[1]
        return self._choose_kept(raw, by_id, config.keep)

    def _choose_kept(self, raw: Mapping[str, float], by_id: Mapping[str, _Class], keep: int) -> int:
        """Filter passes ``top_nodes(raw, keep)``; prioritize scores those; highest total, ties by rank."""
        cluster = self.cluster
        per_node: dict[str, float] = {}
        lowest = 0.0
        for cid in sorted(raw, key=raw.__getitem__, reverse=True):
            if len(per_node) >= keep and raw[cid] < lowest:
                break  # every remaining class scores below the kept ones: top_nodes could not pick them
            lowest = raw[cid]
            for i in by_id[cid].members:
                per_node[cluster.nodes[i].name] = raw[cid]
        kept = top_nodes(per_node, keep)
        ints = to_extender_scores({name: per_node[name] for name in kept})
        totals = {name: s * self.config.weight * MAX_EXTENDER_PRIORITY for name, s in ints.items()}
        best = max(totals.values())
        return min((cluster.ranks[self._index[n]], self._index[n]) for n, t in totals.items() if t == best)[1]

    def submit(self, demand: Demand) -> Outcome:
        """Schedule one pod: choose a node, bind (choose GPUs), commit, and let the policy observe it."""
        i = self.choose(demand)
        if i is None:
            return Outcome(demand, None)
        node = self.cluster.nodes[i]
        placement = place(demand, node, self.policy, self.catalog)
        if placement is None:  # the policy refused at bind: kube-scheduler would retry; the replay drops
            return Outcome(demand, None)
        self.cluster.commit(i, placement.demand, placement.gpus, placement.whole)
        self.policy.observe(placement.demand, node, placement.gpus)
        return Outcome(demand, node.name, tuple(g.index for g in placement.gpus))


def replay(
    nodes: Sequence[NodeState],
    demands: Iterable[Demand],
    policy: Policy,
    catalog: Catalog,
    *,
    ranks: Sequence[int] | None = None,
    config: ReplayConfig = ReplayConfig(),
) -> Iterator[Outcome]:
    """Submit ``demands`` in order to an empty copy of ``nodes``; yield each pod's outcome as it happens."""
    engine = Replay(Cluster(nodes, ranks, config.max_pods), policy, catalog, config)
    for demand in demands:
        yield engine.submit(demand)
