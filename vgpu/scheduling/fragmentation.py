"""The fragmentation-aware placement policy: put each pod where it strands the least GPU capacity.

Following FGD (Weng et al., USENIX ATC'23), a node's fragmentation is the expected idle GPU capacity
the next pod could not use, over the mix of pod shapes the cluster sees (learned online from committed
pods, :class:`Shape` and :class:`Eligibility`); a pod goes where its placement grows it least. Node
kinds that pinned demand needs are closed to pods that may go elsewhere, and the cutting-stock LP
(:mod:`vgpu.scheduling.cutting_stock`) prices joint fills. A refresh of the mix bumps ``revision``
and is split (:meth:`FragmentationPolicy.take`, pure :func:`learn`, :meth:`FragmentationPolicy.adopt`)
so that its costly part can leave the request path.
How and why we differ from FGD: vgpu/scheduling/README.md, section "The fragmentation policy";
the measurements behind each choice: benchmarks/placement/README.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import exp, inf, sqrt
from typing import Any, Final

import numpy as np

from vgpu.catalog import builtin
from vgpu.names import LABEL_HOSTNAME, PlacementPolicy
from vgpu.scheduling.affinity import node_affinity_matches
from vgpu.scheduling.cutting_stock import CAPACITY, Prices, prices
from vgpu.scheduling.fit import fitting_gpus
from vgpu.scheduling.growth_arrays import least_growths, node_terms
from vgpu.scheduling.model import Demand, GpuState, NodeState
from vgpu.scheduling.packed import Columns, Floats
from vgpu.scheduling.policy import REGISTRY

NAME: Final = PlacementPolicy.FRAGMENTATION.value
COVERAGE: Final = 0.95  # shapes kept: the largest covering this share of the GPU demand (FGD: of pods)
MAX_SHAPES: Final = 64  # and never more, to bound the per-node cost (also: eligibility classes per shape)
FIRST_REFRESH: Final = 8
REFRESH_EVERY: Final = 4096
MEMO_LIMIT: Final = 200_000  # node states whose fragmentation is remembered (~40 MB at most)
BATCH: Final = 64  # nodes from which score_many computes with arrays (fewer: node by node, memoised)


@dataclass(frozen=True, slots=True)
class Shape:
    """What the mix counts of a pod's size: its GPU demand, CPU and memory."""

    gpu_count: int
    tflops: int
    vram: int
    whole: bool
    cpu: int
    memory: int


@dataclass(frozen=True, slots=True)
class Eligibility:
    """Where a pod may run apart from its size: the GPU model it asks for and its node affinity."""

    gpu_model: str | None
    affinity: str  # repr of the node affinity ("None" for none): the identity of the constraint


FREE: Final = Eligibility(None, "None")

Kind = tuple[tuple[tuple[str, str], ...], tuple[str, ...]]  # a node's labels and GPU models: all that admits a pod


def kind_of(node: NodeState) -> Kind:
    """The node's labels and GPU models, without the label that names the node itself: every real node
    carries ``kubernetes.io/hostname``, which would make each node a kind of its own (the cluster view
    then costs O(nodes) per committed pod, and a pod pinned by host name is not pinned demand a model
    must keep room for)."""
    labels = tuple(sorted((k, v) for k, v in node.labels.items() if k != LABEL_HOSTNAME))
    return labels, tuple(sorted({g.model for g in node.gpus}))


@dataclass(frozen=True, slots=True)
class _Class:
    gpu_model: str | None
    affinity: Mapping[str, Any] | None
    share: float  # of the shape's pods


@dataclass(frozen=True, slots=True)
class _Weighted:
    shape: Shape
    weight: float  # this shape's share of the mix's GPU demand
    classes: tuple[_Class, ...]  # who among its pods may run where; () = anywhere


@dataclass(frozen=True, slots=True)
class Observed:
    """A copy of what ``observe`` counted, taken on the caller's thread: the input of :func:`learn`."""

    revision: int  # the revision the learned mix will carry
    counts: Mapping[Shape, int]
    per_pod: Mapping[Shape, float]  # GPUs per pod of the shape, on the GPUs it first got
    classes: Mapping[tuple[Shape, Eligibility], int]
    constraints: Mapping[Eligibility, Mapping[str, Any] | None]
    cpu_per_gpu: float
    memory_per_gpu: float
    pod_cpu_per_gpu: float = 0.0  # the same over GPU pods only: what a GPU pod needs beside each GPU
    pod_memory_per_gpu: float = 0.0


_Entry = tuple[tuple[GpuState, ...], tuple[int | None, int | None], dict[Shape, float], dict[Shape, bool]]
"""A node's GPUs and free CPU/memory, then per pod shape its score and whether it takes room (see ``score``)."""


@dataclass(frozen=True, slots=True)
class Learned:
    """One refresh's result, replaced as a whole (one reference swap) so readers never see half of it.

    The memo tables live here too: a new mix starts with empty ones, and a reader holding the old
    object keeps a consistent view until it returns.
    """

    revision: int = 0
    mix: tuple[_Weighted, ...] = ()
    cpu_per_gpu: float = 0.0  # the mix's CPU (memory) per GPU: what an idle GPU will need to be used
    memory_per_gpu: float = 0.0
    prices: Prices | None = None  # cutting-stock duals of the fractional sizes
    memo: dict[tuple[object, ...], float] = field(default_factory=dict)  # node state → fragmentation
    scores: dict[str, _Entry] = field(default_factory=dict)  # node name → its state and scores by shape
    eligible: dict[tuple[object, ...], tuple[float, ...]] = field(default_factory=dict)  # node labels → shares
    # node name → (its GPU tuple object, free CPU/memory, its fragmentation terms, its fragmentation): what a
    # single-GPU pod's scoring reads of a node whatever the pod, kept while the node's state object lasts
    terms: dict[str, tuple[object, tuple[int | None, int | None], _Tally, float]] = field(default_factory=dict)
    demand: tuple[tuple[Eligibility, float], ...] = ()  # each eligibility class's share of the GPU demand
    pods: int = 0  # GPU pods those shares were counted from
    pod_cpu_per_gpu: float = 0.0  # GPU pods' own CPU (memory) per GPU: what the cluster view counts as room
    pod_memory_per_gpu: float = 0.0


def shape_of(demand: Demand) -> Shape:
    return Shape(demand.gpu_count, demand.tflops, demand.vram_held, demand.whole_gpu, demand.cpu, demand.memory)


def eligibility_of(demand: Demand) -> Eligibility:
    return Eligibility(demand.gpu_model, repr(demand.node_affinity))


def gpu_demand(shape: Shape, gpu: GpuState) -> float:
    """GPUs one pod of this shape takes on ``gpu``'s model: whole GPUs, or its share of each."""
    if shape.whole or not gpu.tflops or not gpu.vram:
        return float(shape.gpu_count)
    return shape.gpu_count * 0.5 * (shape.tflops / gpu.tflops + shape.vram / gpu.vram)


def idle(gpu: GpuState) -> float:
    """Idle capacity of one GPU, in GPUs (mean of its free compute and free memory fractions)."""
    if gpu.whole or not gpu.healthy or not gpu.tflops or not gpu.vram:
        return 0.0
    return 0.5 * ((gpu.tflops - gpu.tflops_used) / gpu.tflops + (gpu.vram - gpu.vram_used) / gpu.vram)


_GpuGroup = tuple[int, int, bool, int, float]  # free tflops, free vram, untouched, count, idle of all


def _groups(node: NodeState) -> tuple[list[_GpuGroup], float]:
    """The node's usable GPUs grouped by state (usually 1–3 groups of 8 GPUs), and their total idle."""
    seen: dict[tuple[int, int, bool], list[float]] = {}
    total = 0.0
    for g in node.gpus:
        x = idle(g)
        if x <= 0.0:
            continue
        total += x
        key = (g.tflops - g.tflops_used, g.vram - g.vram_used, g.pods == 0 and g.tflops_used == 0 and g.vram_used == 0)
        acc = seen.get(key)
        if acc is None:
            seen[key] = [1.0, x]
        else:
            acc[0] += 1.0
            acc[1] += x
    return [(t, v, fresh, int(n), x) for (t, v, fresh), (n, x) in seen.items()], total


def learn(observed: Observed) -> Learned:
    """The mix, its CPU/memory per GPU and the cutting-stock prices: the costly half of a refresh.

    Pure and self-contained, so that the extender can run it away from the request path.
    """
    kept: list[tuple[Shape, int]] = []
    covered = 0.0
    per_pod = observed.per_pod
    total = sum(n * per_pod[s] for s, n in observed.counts.items())
    by_shape: dict[Shape, list[tuple[Eligibility, int]]] = {}
    for (shape, eligibility), k in observed.classes.items():
        by_shape.setdefault(shape, []).append((eligibility, k))
    for shape, n in sorted(observed.counts.items(), key=lambda kv: -kv[1] * per_pod[kv[0]]):
        if covered >= COVERAGE * total or len(kept) >= MAX_SHAPES:
            break
        kept.append((shape, n))
        covered += n * per_pod[shape]
    mass = sum(n * per_pod[s] for s, n in kept)
    mix = tuple(_Weighted(s, n * per_pod[s] / mass, _classes(observed, by_shape[s])) for s, n in kept)
    shares: dict[Eligibility, float] = {}
    for (shape, eligibility), k in observed.classes.items():
        if shape in per_pod:
            shares[eligibility] = shares.get(eligibility, 0.0) + k * per_pod[shape] / total
    return Learned(
        observed.revision,
        mix,
        observed.cpu_per_gpu,
        observed.memory_per_gpu,
        _price(observed.counts, per_pod),
        demand=tuple(sorted(shares.items(), key=lambda kv: -kv[1])),
        pods=sum(observed.counts.values()),
        pod_cpu_per_gpu=observed.pod_cpu_per_gpu,
        pod_memory_per_gpu=observed.pod_memory_per_gpu,
    )


def _classes(observed: Observed, classes: list[tuple[Eligibility, int]]) -> tuple[_Class, ...]:
    """A shape's eligibility classes with their share of its pods; () when all of them may run anywhere."""
    if len(classes) == 1 and classes[0][0] == FREE:
        return ()
    n = sum(k for _, k in classes)
    top = sorted(classes, key=lambda kv: -kv[1])[:MAX_SHAPES]
    return tuple(_Class(e.gpu_model, observed.constraints[e], k / n) for e, k in top)


def _price(counts: Mapping[Shape, int], per_pod: Mapping[Shape, float]) -> Prices | None:
    """Cutting-stock duals of the observed fractional sizes (per GPU, in thousandths of a GPU)."""
    sizes: Counter[int] = Counter()
    for shape, n in counts.items():
        if shape.whole:
            continue
        size = round(CAPACITY * per_pod[shape] / shape.gpu_count)
        if 0 < size < CAPACITY:
            sizes[size] += n * shape.gpu_count
    kept = dict(sizes.most_common(MAX_SHAPES))
    return prices(kept) if kept else None


class FragmentationPolicy:
    """Least growth of expected stranded GPU capacity, against the online-learned mix of pod shapes.

    ``deferred`` (set by whoever owns the policy, before use): ``observe`` only counts, and a due
    refresh waits for someone to :meth:`take` the observations, :func:`learn` from them and
    :meth:`adopt` the result — the extender does this on a background thread. Otherwise (the replay,
    tests) ``observe`` refreshes inline when due.
    """

    __slots__ = (
        "_admitted",
        "_classes",
        "_closed",
        "_columns",
        "_constraints",
        "_counts",
        "_demand",
        "_escapes",
        "_free",
        "_gates",
        "_gpus_seen",
        "_last_demand",
        "_last_key",
        "_learned",
        "_models",
        "_nodes",
        "_observed",
        "_refreshed",
        "_used",
        "_used_by_gpu_pods",
        "deferred",
    )

    def __init__(self) -> None:
        self._counts: Counter[Shape] = Counter()
        self._classes: Counter[tuple[Shape, Eligibility]] = Counter()  # pods per (shape, where it may run)
        self._constraints: dict[Eligibility, Mapping[str, Any] | None] = {}
        self._demand: dict[Shape, float] = {}  # GPUs per pod of the shape, on the GPUs it first got
        self._observed = 0
        self._refreshed = 0
        self._used = [0.0, 0.0]  # CPU and memory of every observed pod, CPU-only ones included
        self._gpus_seen = 0.0  # GPUs those pods asked for
        self._used_by_gpu_pods = [0.0, 0.0]  # CPU and memory of the pods among them that asked for GPUs
        self._learned = Learned()
        self._last_demand: Demand | None = None
        self._last_key: tuple[Shape, Eligibility] | None = None
        self._models: dict[tuple[str, str], bool] = {}
        # The cluster view (see_cluster): per node its kind, idle GPUs, free CPU and memory; per kind its room.
        self._nodes: dict[str, tuple[Kind, float, int | None, int | None]] = {}
        self._free: dict[Kind, float] = {}  # idle GPUs per kind that the nodes' CPU and memory can feed
        self._admitted: dict[Eligibility, tuple[Kind, ...]] = {}  # kinds an eligibility class may use
        self._closed: frozenset[Kind] = frozenset()  # kinds whose room pinned demand needs
        self._escapes: dict[Eligibility, bool] = {}  # whether a class may use an open kind
        self._gates = 0  # changes of the closed set: part of the revision
        self._columns = Columns(node_terms)  # the nodes score_many last scored, as arrays
        self.deferred = False

    @property
    def name(self) -> str:
        return NAME

    @property
    def columns(self) -> Columns:
        """The nodes :meth:`score_many` scores at once, packed with the terms it reads of each alone
        (:class:`~vgpu.scheduling.packed.Packs`)."""
        return self._columns

    @property
    def revision(self) -> int:
        """Bumped by every adopted refresh and every change of the closed kinds; cached scores go then."""
        return self._learned.revision + self._gates

    @property
    def closed(self) -> frozenset[Kind]:
        """The node kinds whose room pinned demand still to come needs (see :meth:`_gate`)."""
        return self._closed

    @property
    def idle_by_kind(self) -> Mapping[Kind, float]:
        """Room per node kind in the cluster view: the idle GPUs their nodes' CPU and memory can feed."""
        return dict(self._free)

    @property
    def mix(self) -> tuple[tuple[Shape, float], ...]:
        """The shapes currently scored against and their weights (for reports and tests)."""
        return tuple((w.shape, w.weight) for w in self._learned.mix)

    def pinned_share(self) -> float:
        """The share of the mix's GPU demand restricted to some nodes (model or node affinity)."""
        return sum(w.weight * sum(c.share for c in w.classes if c.gpu_model or c.affinity) for w in self._learned.mix)

    # --- learning ------------------------------------------------------------------------------
    def observe(self, demand: Demand, node: NodeState, gpus: tuple[GpuState, ...]) -> None:
        """Count a committed pod into the mix (its CPU and memory even when it asks for no GPU)."""
        self._used[0] += demand.cpu
        self._used[1] += demand.memory
        seen = self._nodes.get(node.name)
        if seen is not None:
            kind, idle_gpus, cpu, memory = seen
            after = (
                kind,
                idle_gpus - sum(idle(g) - idle(_take(g, demand)) for g in gpus),
                None if cpu is None else cpu - demand.cpu,
                None if memory is None else memory - demand.memory,
            )
            self._nodes[node.name] = after
            free = self._free  # the extender's see_cluster may swap both tables on another thread
            if kind in free:
                free[kind] += self._room(*after[1:]) - self._room(*seen[1:])
        if demand.gpu_count <= 0 or not gpus:
            if seen is not None:
                self._gate()
            return  # CPU-only pods take no GPU: they matter through the CPU they use, not as a shape
        shape = shape_of(demand)
        eligibility = eligibility_of(demand)
        self._constraints.setdefault(eligibility, demand.node_affinity)  # written before the counts that
        per_pod = self._demand.setdefault(shape, gpu_demand(shape, gpus[0]))  # refer to them (see take)
        self._classes[(shape, eligibility)] += 1
        self._gpus_seen += per_pod
        self._used_by_gpu_pods[0] += demand.cpu
        self._used_by_gpu_pods[1] += demand.memory
        self._counts[shape] += 1
        self._observed += 1
        if not self.deferred and self.due:
            observed = self.take()
            if observed is not None:
                self.adopt(learn(observed))
        if seen is not None:
            self._gate()

    @property
    def due(self) -> bool:
        """Whether enough pods were observed since the last refresh (their count doubled, or +REFRESH_EVERY)."""
        return self._observed >= max(FIRST_REFRESH, min(2 * self._refreshed, self._refreshed + REFRESH_EVERY))

    def take(self) -> Observed | None:
        """A copy of the counts for :func:`learn` when a refresh is due (cheap: O(shapes)), else None.

        Safe beside a concurrent ``observe``: each table is copied by one ``dict()`` (a single C call,
        which no other Python thread interleaves), the counts first, so every shape in the copy
        already has its per-pod demand, classes and constraints; a pod counted mid-copy goes to the
        next refresh.
        """
        if not self.due:
            return None
        self._refreshed = self._observed
        counts = dict(self._counts)
        return Observed(
            self._learned.revision + 1,
            counts,
            dict(self._demand),
            dict(self._classes),
            dict(self._constraints),
            self._used[0] / self._gpus_seen,
            self._used[1] / self._gpus_seen,
            self._used_by_gpu_pods[0] / self._gpus_seen,
            self._used_by_gpu_pods[1] / self._gpus_seen,
        )

    def adopt(self, learned: Learned) -> None:
        """Score against ``learned`` from now on (one reference swap; a stale result is ignored)."""
        if learned.revision > self._learned.revision:
            self._learned = learned
            self._tally()  # GPU pods' CPU (memory) per GPU decides how many idle GPUs can be fed
            self._gate()

    # --- the cluster view: which kinds pinned demand needs ---------------------------------------
    def see_cluster(self, nodes: Iterable[NodeState]) -> None:
        """Take every node's state: its kind (labels, GPU models: what admits a pinned pod) and free room.

        The replay calls this once with the inventory; ``observe`` then updates the node each pod is
        committed to. The extender, whose pods also leave, would call it with every node's state from
        its cache, at start and then periodically. Until it is called nothing is closed (:meth:`_gate`).
        """
        self._nodes = {
            n.name: (kind_of(n), sum(idle(g) for g in n.gpus), n.cpu_free, n.memory_free) for n in nodes if n.gpus
        }
        self._tally()
        self._gate()

    def _tally(self) -> None:
        """Idle GPUs per kind, counting on each node only those its free CPU and memory can feed."""
        free: dict[Kind, float] = {}
        for kind, idle_gpus, cpu, memory in self._nodes.values():
            free[kind] = free.get(kind, 0.0) + self._room(idle_gpus, cpu, memory)
        if free.keys() != self._free.keys():
            self._admitted = {}  # a new kind may admit a class
        self._free = free

    def _room(self, idle_gpus: float, cpu: int | None, memory: int | None) -> float:
        """A node's idle GPUs less those its CPU (memory) cannot feed at GPU pods' CPU (memory) per GPU.

        GPU pods' own ratio, not the mix's (which adds CPU-only pods' CPU, as :meth:`_starved` must):
        the room is what pinned GPU pods could still use, and CPU-only pods need no GPU to run.
        """
        room = idle_gpus
        learned = self._learned
        if learned.pod_cpu_per_gpu > 0 and cpu is not None:
            room = min(room, cpu / learned.pod_cpu_per_gpu)
        if learned.pod_memory_per_gpu > 0 and memory is not None:
            room = min(room, memory / learned.pod_memory_per_gpu)
        return max(0.0, room)

    def _gate(self) -> None:
        """Close the kinds whose room the pinned demand still to come needs, at the learned mix.

        The cluster is assumed to keep filling: of the demand still to arrive (as many GPUs as there
        is room), each eligibility class asks its learned share. A class that may use only some kinds
        needs that much there: a class of one kind all of it, a class of several kinds split by the
        room the single-kind classes leave. A kind whose need reaches its room is *closed*: a pod
        that may run elsewhere and takes room there (:meth:`_takes_room`) displaces pinned demand GPU
        for GPU — a certain loss, where fragmentation growth is an expected one — so :meth:`score`
        ranks every node where it displaces nobody first.

        A share counted from ``n`` pods is uncertain by its standard error, ``sqrt(p(1 − p)/n)``, and
        the two mistakes do not cost the same: a kind left open on a low guess loses the room a pinned
        pod needed, one closed on a high guess only sends pods to the open kinds, whose fragmentation
        decides as before. So each class asks its share plus one standard error: early in a run (a
        few hundred pods) and for a kind whose need is level with its room, it stays closed rather than
        opening and closing with each refresh's noise; with many pods it is the share. Once some pods
        are seen pinned, a kind none was seen pinned to yet may still get some: after ``n`` pods its
        share is 0 give or take ``1/(n + 1)`` (the upper end of the Wilson interval at one standard
        error), so each kind needs at least that much of the demand still to come — the scarce kinds
        stay closed through the first few hundred pods, which otherwise took them before their first
        pinned pods were seen. With no pin seen at all this does not apply.

        With pins in proportion to each kind's GPUs a kind's need is about the pinned share of its own
        room and nothing closes until one kind is much fuller than the rest; with no pins nothing
        closes at all, and no decision changes.
        """
        free = self._free
        shares = self._learned.demand
        closed: frozenset[Kind] = frozenset()
        if free and shares:
            left = sum(max(0.0, f) for f in free.values())
            need = dict.fromkeys(free, 0.0)
            several: list[tuple[tuple[Kind, ...], float]] = []
            pods = self._learned.pods
            for eligibility, share in shares:
                share = min(1.0, share + sqrt(max(0.0, share * (1.0 - share)) / pods))
                kinds = self._admits_kinds(eligibility, self._constraints.get(eligibility))
                if not kinds or len(kinds) == len(free):
                    continue  # runs nowhere, or anywhere: the demand the gate steers
                if len(kinds) == 1:
                    need[kinds[0]] += share * left
                else:
                    several.append((kinds, share * left))
            if any(need.values()) or several:  # pins occur: a kind none is seen pinned to yet may get some
                unseen = left / (pods + 1)
                for k in need:
                    need[k] = max(need[k], unseen)
            for kinds, amount in several:
                room = [max(0.0, free[k] - need[k]) for k in kinds]
                if sum(room) <= 0.0:
                    room = [max(0.0, free[k]) for k in kinds]
                total = sum(room)
                for k, r in zip(kinds, room, strict=True):
                    need[k] += amount * r / total if total > 0.0 else amount / len(kinds)
            closed = frozenset(k for k, n in need.items() if n > 0.0 and n >= free[k])
        if closed != self._closed:
            self._closed = closed
            self._escapes = {}
            self._gates += 1

    def _admits_kinds(self, eligibility: Eligibility, constraint: Mapping[str, Any] | None) -> tuple[Kind, ...]:
        """The kinds of the cluster view on which pods of this class (its node affinity: ``constraint``) may run."""
        hit = self._admitted.get(eligibility)
        if hit is None:
            hit = self._admitted[eligibility] = tuple(
                k for k in sorted(self._free) if self._admits(eligibility.gpu_model, constraint, "", dict(k[0]), k[1])
            )
        return hit

    def _displaces(self, demand: Demand, key: tuple[Shape, Eligibility], node: NodeState, entry: _Entry) -> bool:
        """Whether a pod of this class on ``node`` takes room pinned demand needs while it could go elsewhere.

        ``entry`` (the node's memo in ``score``) remembers, per shape, whether the pod takes room at all.
        """
        seen = self._nodes.get(node.name)
        if seen is None or seen[0] not in self._closed:
            return False
        shape, eligibility = key
        hit = self._escapes.get(eligibility)
        if hit is None:
            admitted = self._admits_kinds(eligibility, demand.node_affinity)
            hit = self._escapes[eligibility] = any(k not in self._closed for k in admitted)
        if not hit:
            return False
        takes = entry[3].get(shape)
        if takes is None:
            takes = entry[3][shape] = self._takes_room(shape, node)
        return takes

    def _takes_room(self, shape: Shape, node: NodeState) -> bool:
        """Whether a pod of ``shape`` on ``node`` leaves it less room (:meth:`_room`) for pinned GPU pods.

        A closed kind is closed for its room, not its nodes: a CPU-only pod on a node whose CPU feeds all
        its idle GPUs and more takes nothing pinned demand could use. Keeping such pods off a closed kind
        sends their CPU to the open kinds, whose idle GPUs it then starves (in overload most of all).
        """
        usable = [g for g in node.gpus if idle(g) > 0.0]
        total = sum(idle(g) for g in usable)
        taken = min(total, gpu_demand(shape, usable[0])) if shape.gpu_count and usable else 0.0
        cpu, memory = node.cpu_free, node.memory_free
        before = self._room(total, cpu, memory)
        after = self._room(
            total - taken,
            None if cpu is None else cpu - shape.cpu,
            None if memory is None else memory - shape.memory,
        )
        return after < before

    # --- fragmentation -------------------------------------------------------------------------
    def _eligible(self, learned: Learned, mix: tuple[_Weighted, ...], node: NodeState) -> tuple[float, ...]:
        """Per mix entry, the share of its pods that the node's GPU model and labels admit."""
        models = {g.model for g in node.gpus}
        memo = learned.eligible if mix is learned.mix else None
        key: tuple[object, ...] = () if memo is None else (tuple(sorted(node.labels.items())), tuple(sorted(models)))
        hit = None if memo is None else memo.get(key)
        if hit is None:
            hit = tuple(
                1.0
                if not w.classes
                else sum(
                    c.share for c in w.classes if self._admits(c.gpu_model, c.affinity, node.name, node.labels, models)
                )
                for w in mix
            )
            if memo is not None:
                memo[key] = hit
        return hit

    def _admits(
        self,
        gpu_model: str | None,
        affinity: Mapping[str, Any] | None,
        name: str,
        labels: Mapping[str, str],
        models: Iterable[str],
    ) -> bool:
        """Whether pods asking ``gpu_model`` with node ``affinity`` may run on a node of these labels and models."""
        if gpu_model is not None and not any(self._model_ok(gpu_model, m) for m in models):
            return False
        return affinity is None or node_affinity_matches(affinity, name, labels)

    def _model_ok(self, requested: str, product: str) -> bool:
        hit = self._models.get((requested, product))
        if hit is None:
            hit = self._models[(requested, product)] = _CATALOG.matches(requested, product)
        return hit

    def fragmentation(self, node: NodeState, mix: tuple[_Weighted, ...] | None = None) -> float:
        """Expected idle GPUs of the node that a pod drawn from the mix could not use, plus starved GPUs.

        The expectation is over the pods that may run on the node at all (its GPU model and labels
        admit them): a pod pinned elsewhere neither uses nor strands this node's GPUs.
        """
        return self._fragmentation(self._learned, node, mix)

    def _fragmentation(self, learned: Learned, node: NodeState, mix: tuple[_Weighted, ...] | None) -> float:
        key: tuple[object, ...] = ()
        mix = learned.mix if mix is None else mix
        shares = self._eligible(learned, mix, node)
        if mix is learned.mix:
            key = _state_key(node, shares)
            hit = learned.memo.get(key)
            if hit is not None:
                return hit
        value = _value(learned, _terms_of(node, mix, shares), node.cpu_free, node.memory_free)
        if key:
            if len(learned.memo) >= MEMO_LIMIT:
                learned.memo.clear()  # a long-lived extender sees unboundedly many states
            learned.memo[key] = value
        return value

    def _terms(self, learned: Learned, node: NodeState, mix: tuple[_Weighted, ...]) -> _Tally:
        return _terms_of(node, mix, self._eligible(learned, mix, node))

    def _mix_for(self, learned: Learned, demand: Demand) -> tuple[_Weighted, ...] | None:
        """The mix to weigh ``demand``'s placement by: None for the learned one (memoised by node state)."""
        if not learned.mix and demand.gpu_count > 0:  # nothing learned yet: the pod stands for the mix
            return (_Weighted(shape_of(demand), 1.0, ()),)  # and may run here: the node passed the filter
        return None

    def _delta(
        self,
        learned: Learned,
        demand: Demand,
        node: NodeState,
        gpus: tuple[GpuState, ...],
        mix: tuple[_Weighted, ...] | None,
        before: float,
    ) -> float:
        """Growth of fragmentation, in GPUs, if the pod takes ``gpus`` on ``node`` (whose fragmentation at
        ``mix`` is ``before``: the same for every choice of GPUs, so the caller computes it once)."""
        chosen = {g.uuid for g in gpus}
        after = NodeState(
            name=node.name,
            pool=node.pool,
            labels=node.labels,
            gpus=tuple(_take(g, demand) if g.uuid in chosen else g for g in node.gpus),
            cpu_free=None if node.cpu_free is None else node.cpu_free - demand.cpu,
            memory_free=None if node.memory_free is None else node.memory_free - demand.memory,
            slots_used=node.slots_used + demand.slots * len(gpus),
        )
        growth = self._fragmentation(learned, after, mix) - before
        if not demand.whole_gpu:
            shape = shape_of(demand)
            for g in gpus:
                growth += _loss(learned, shape, g)
        return growth

    def _best(self, learned: Learned, demand: Demand, node: NodeState) -> tuple[float, tuple[GpuState, ...]] | None:
        """The least growth and the GPUs that achieve it (among equals: fullest GPU, then lowest index)."""
        fitting = sorted(fitting_gpus(demand, node), key=lambda g: (idle(g), g.index))
        if len(fitting) < demand.gpu_count:
            return None
        mix = self._mix_for(learned, demand)
        if demand.gpu_count == 1 and not demand.whole_gpu:
            if mix is None:
                return self._best_one(learned, demand, node, fitting)
            tally = self._terms(learned, node, mix)  # the pod stands for the mix: nothing to keep
            return self._least(learned, demand, node, fitting, tally, _value(learned, tally, *_free(node)))
        before = self._fragmentation(learned, node, mix)
        gpus = tuple(fitting[: demand.gpu_count])  # several GPUs, whole ones, or none (a CPU-only pod)
        return self._delta(learned, demand, node, gpus, mix, before), gpus

    def _best_one(
        self, learned: Learned, demand: Demand, node: NodeState, fitting: list[GpuState]
    ) -> tuple[float, tuple[GpuState, ...]] | None:
        """:meth:`_best` for a one-GPU share at the learned mix, from the node's terms and fragmentation, which
        no pod changes: kept per node while its state object lasts, so a pod of a new size costs per node only
        the few distinct GPUs it could take."""
        free = _free(node)
        held = learned.terms.get(node.name)
        if held is None or held[0] is not node.gpus or held[1] != free:
            tally = self._terms(learned, node, learned.mix)
            held = learned.terms[node.name] = (node.gpus, free, tally, _value(learned, tally, *free))
        return self._least(learned, demand, node, fitting, held[2], held[3])

    def _least(
        self,
        learned: Learned,
        demand: Demand,
        node: NodeState,
        fitting: list[GpuState],
        tally: _Tally,
        before: float,
    ) -> tuple[float, tuple[GpuState, ...]] | None:
        """The least growth of one GPU's share among ``fitting`` (among equals, the first), from the node's
        terms and fragmentation ``before``."""
        best: tuple[float, tuple[GpuState, ...]] | None = None
        tried: set[tuple[int, int, int, int, int]] = set()
        cpu = None if node.cpu_free is None else node.cpu_free - demand.cpu
        memory = None if node.memory_free is None else node.memory_free - demand.memory
        shape = shape_of(demand)
        for g in fitting:
            state = (g.tflops, g.vram, g.tflops_used, g.vram_used, g.pods)
            if state in tried:
                continue  # an identical GPU earlier in the order gives the same growth
            tried.add(state)
            d = _after_one(learned, tally, g, demand, cpu, memory) - before + _loss(learned, shape, g)
            d = round(d, 9)  # sums taken in another order: equal growths stay equal, the first GPU wins
            if best is None or d < best[0]:
                best = (d, (g,))
        return best

    def score(self, demand: Demand, node: NodeState) -> float:
        """1 / (1 + e^growth): 0.5 for no change, towards 1 when the pod removes fragmentation.

        Memoised per node: an entry holds the node's GPU tuple *object* (immutable, and kept alive
        by the entry, so identity means same content), its free CPU/memory and the scores by pod
        shape. The extender's snapshot reuses the objects of unchanged nodes, so a warm /prioritize
        pays an identity check per node instead of O(shapes × GPUs).
        """
        learned = self._learned
        key = self._key(demand)
        entry = _entry(learned, node)
        hit = entry[2].get(key[0])
        if hit is None:
            best = self._best(learned, demand, node)
            hit = entry[2][key[0]] = _sigmoid(None if best is None else best[0])
        return self._ranked(demand, key, node, entry, hit)

    def score_many(self, demand: Demand, nodes: Sequence[NodeState]) -> list[float]:
        """:meth:`score` of each node, a one-GPU share over many nodes computed at once
        (:mod:`vgpu.scheduling.growth_arrays`: the same growths to the bit, in a fraction of the time).

        A cold decision scores every node once, so nothing is looked up in or kept by the per-node memo
        of :meth:`score` but the closed kinds' own part (:meth:`_ranked`).
        """
        if len(nodes) < BATCH or demand.gpu_count != 1 or demand.whole_gpu:
            return [self.score(demand, node) for node in nodes]
        learned = self._learned
        least = self._least_many(learned, demand, nodes)
        sigmoid = {g: _sigmoid(None if g == inf else round(g, 9)) for g in set(least)}  # growths repeat
        scores = list(map(sigmoid.__getitem__, least))
        if self._closed:
            key = self._key(demand)
            scores = [
                self._ranked(demand, key, node, _entry(learned, node), hit)
                for node, hit in zip(nodes, scores, strict=True)
            ]
        return scores

    def _least_many(self, learned: Learned, demand: Demand, nodes: Sequence[NodeState]) -> list[float]:
        """Per node, the least growth of a one-GPU share that :meth:`_least` finds (before its rounding), or
        ``inf`` where no GPU fits."""
        mix = self._mix_for(learned, demand) or learned.mix
        weights: list[Floats | float] = [w.weight for w in mix]
        if mix is learned.mix and any(w.classes for w in mix):  # pinned demand: the shares each node admits
            shares = np.array([self._eligible(learned, mix, node) for node in nodes], dtype=np.float64)
            weights = [w.weight * shares[:, i] for i, w in enumerate(mix)]
        return least_growths(
            *self._columns.gather(nodes),
            (demand.tflops, demand.vram_held, demand.slots, demand.cpu, demand.memory),
            [(s.gpu_count, s.tflops, s.vram, s.whole, s.cpu, s.memory) for s in (w.shape for w in mix)],
            weights,
            learned.cpu_per_gpu,
            learned.memory_per_gpu,
            learned.prices,
        )

    def _key(self, demand: Demand) -> tuple[Shape, Eligibility]:
        key = self._last_key
        if demand is not self._last_demand or key is None:
            key = (shape_of(demand), eligibility_of(demand))
            self._last_demand, self._last_key = demand, key
        return key

    def _ranked(
        self, demand: Demand, key: tuple[Shape, Eligibility], node: NodeState, entry: _Entry, hit: float
    ) -> float:
        """The node's score from its sigmoid ``hit``: displacing nobody ranks first, (sigmoid + 1) / 2, else
        sigmoid / 2, while some kinds are closed."""
        if hit > 0.0 and self._closed:
            hit = 0.5 * hit + (0.0 if self._displaces(demand, key, node, entry) else 0.5)
        return hit

    def choose_gpus(self, demand: Demand, node: NodeState) -> tuple[GpuState, ...]:
        best = self._best(self._learned, demand, node)
        return () if best is None else best[1]


def _entry(learned: Learned, node: NodeState) -> _Entry:
    """The node's entry in the per-node memo of :meth:`FragmentationPolicy.score`, a new one when it changed."""
    entry = learned.scores.get(node.name)
    if entry is None or entry[0] is not node.gpus or entry[1] != (node.cpu_free, node.memory_free):
        entry = learned.scores[node.name] = (node.gpus, (node.cpu_free, node.memory_free), {}, {})
    return entry


def _sigmoid(growth: float | None) -> float:
    """1 / (1 + e^growth), or 0 for a node that cannot take the pod (None)."""
    return 0.0 if growth is None else 1.0 / (1.0 + exp(min(growth, 700.0)))


def _take(gpu: GpuState, demand: Demand) -> GpuState:
    """The GPU after one share of the demand (a whole-GPU demand holds all of it)."""
    whole = demand.whole_gpu
    return GpuState(
        uuid=gpu.uuid,
        index=gpu.index,
        model=gpu.model,
        tflops=gpu.tflops,
        vram=gpu.vram,
        healthy=gpu.healthy,
        numa=gpu.numa,
        tflops_used=gpu.tflops if whole else gpu.tflops_used + demand.tflops,
        vram_used=gpu.vram if whole else gpu.vram_used + demand.vram_held,
        pods=gpu.pods + 1,
        whole=whole,
        slots=gpu.slots,
        slots_used=gpu.slots_used + demand.slots,
    )


@dataclass(frozen=True, slots=True)
class _Tally:
    """A node's fragmentation terms: per mix entry it admits (shape, weight × share, usable GPUs, stranded
    idle GPUs), and its total idle GPUs."""

    entries: tuple[tuple[Shape, float, int, float], ...]
    total: float


def _admits_size(s: Shape, cpu_free: int | None, memory_free: int | None) -> bool:
    """Whether a node's free CPU and memory admit the shape at all."""
    if cpu_free is not None and cpu_free < s.cpu:
        return False
    return memory_free is None or memory_free >= s.memory


def _starved_at(learned: Learned, cpu_free: int | None, memory_free: int | None, total: float) -> float:
    """Idle GPUs that a node's free CPU (or memory) cannot feed at the mix's CPU (memory) per GPU."""
    worst = 0.0
    if learned.cpu_per_gpu > 0 and cpu_free is not None:
        worst = max(worst, total - cpu_free / learned.cpu_per_gpu)
    if learned.memory_per_gpu > 0 and memory_free is not None:
        worst = max(worst, total - memory_free / learned.memory_per_gpu)
    return worst


def _free(node: NodeState) -> tuple[int | None, int | None]:
    return node.cpu_free, node.memory_free


def _value(learned: Learned, tally: _Tally, cpu_free: int | None, memory_free: int | None) -> float:
    """The fragmentation the terms sum to, exactly as :meth:`FragmentationPolicy._fragmentation` sums it."""
    total = tally.total
    if total <= 0.0:
        return 0.0
    value = mass = 0.0
    for s, weight, usable, stranded in tally.entries:
        mass += weight
        if not _admits_size(s, cpu_free, memory_free):
            value += weight * total
        else:
            value += weight * (stranded if usable >= s.gpu_count else total)
    value = value / mass if mass > 0.0 else total  # no pod of the mix may use it: all idle is stranded
    return value + _starved_at(learned, cpu_free, memory_free, total)


def _holds(s: Shape, free_t: int, free_v: int, fresh: bool) -> bool:
    """Whether a GPU with this much free (untouched: ``fresh``) can take one share of the shape."""
    return fresh if s.whole else free_t >= s.tflops and free_v >= s.vram


def _terms_of(node: NodeState, mix: tuple[_Weighted, ...], shares: tuple[float, ...]) -> _Tally:
    """What :meth:`FragmentationPolicy._fragmentation` sums for ``node``, kept per mix entry the node admits
    (``shares``), so that the fragmentation after one GPU changes is found without another pass over the
    node's GPUs (:func:`_after_one`)."""
    groups, total = _groups(node)
    entries: list[tuple[Shape, float, int, float]] = []
    for w, share in zip(mix, shares, strict=True):
        if share <= 0.0:
            continue
        shape = w.shape
        usable = 0
        stranded = 0.0
        for t, v, fresh, n, x in groups:
            if _holds(shape, t, v, fresh):
                usable += n
            else:
                stranded += x
        entries.append((shape, w.weight * share, usable, stranded))
    return _Tally(tuple(entries), total)


def _loss(learned: Learned, shape: Shape, gpu: GpuState) -> float:
    """The cutting-stock value lost by putting one GPU's share of the shape into ``gpu``'s hole (0 without
    prices)."""
    if learned.prices is None:
        return 0.0
    share = gpu_demand(shape, gpu) / shape.gpu_count
    return learned.prices.loss(round(CAPACITY * share), round(CAPACITY * idle(gpu)))


def _part(free_t: int, free_v: int, fresh: bool, x: float, s: Shape) -> tuple[int, float]:
    """One GPU's part of a shape's (usable, stranded), from its free TFLOPS and VRAM and idle ``x``: nothing
    when it has no idle capacity (as :func:`_groups` leaves such GPUs out)."""
    if x <= 0.0:
        return 0, 0.0
    return (1, 0.0) if _holds(s, free_t, free_v, fresh) else (0, x)


def _after_one(
    learned: Learned, tally: _Tally, gpu: GpuState, demand: Demand, cpu_free: int | None, memory_free: int | None
) -> float:
    """The node's fragmentation once ``gpu`` took one share of ``demand`` (as :func:`_take` would leave it) and
    its free CPU and memory became these: the tally's terms, less the GPU's before, plus its after."""
    x_old = idle(gpu)
    free_t, free_v = gpu.tflops - gpu.tflops_used, gpu.vram - gpu.vram_used
    new_t, new_v = free_t - demand.tflops, free_v - demand.vram_held
    sized = gpu.healthy and not gpu.whole and gpu.tflops and gpu.vram  # as idle() reads a GPU
    x_new = 0.5 * (new_t / gpu.tflops + new_v / gpu.vram) if sized else 0.0
    fresh = gpu.pods == 0 and gpu.tflops_used == 0 and gpu.vram_used == 0
    total = tally.total - max(x_old, 0.0) + max(x_new, 0.0)
    moved = []
    for s, weight, usable, stranded in tally.entries:
        u_old, s_old = _part(free_t, free_v, fresh, x_old, s)
        u_new, s_new = _part(new_t, new_v, False, x_new, s)
        moved.append((s, weight, usable - u_old + u_new, stranded - s_old + s_new))
    return _value(learned, _Tally(tuple(moved), total), cpu_free, memory_free)


def _state_key(node: NodeState, shares: tuple[float, ...]) -> tuple[object, ...]:
    """What fragmentation at the learned mix depends on: free CPU/memory, the share of each of the mix's
    sizes the node admits, and the multiset of GPU states.

    The shares, not the labels: every real node carries its own ``kubernetes.io/hostname`` (and
    often more labels of its own), so a key of labels made each node's states its own and nodes in the
    same state never shared what was computed for one of them.
    """
    gpus = sorted(
        (g.model, g.tflops, g.vram, g.tflops_used, g.vram_used, g.pods, g.whole, g.healthy) for g in node.gpus
    )
    return (node.cpu_free, node.memory_free, shares, tuple(gpus))


_CATALOG: Final = builtin()
REGISTRY.register(NAME, FragmentationPolicy)
