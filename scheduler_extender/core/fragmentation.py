"""The fragmentation-aware placement policy: put each pod where it strands the least GPU capacity.

Binpack fills nodes but cannot tell a useful leftover (a whole idle GPU, a half GPU that the next
half-GPU pod will take) from a useless one (0.08 of a GPU nobody asks for, GPUs whose node has no
CPU left). This policy scores that difference. Following FGD (Weng et al., USENIX ATC'23) a node's
*fragmentation* is the expected idle GPU capacity the next pod could not use, over the mix of pod
shapes the cluster sees; a pod goes where its placement grows fragmentation least. We differ from
FGD where the openb replay showed FGD losing capacity (see ``benchmarks/placement/README.md``):

- **Starved GPUs.** Idle GPUs on a node whose free CPU (or memory) cannot feed them at the mix's
  CPU (memory) per GPU count as stranded. FGD only notices when a shape becomes infeasible at once,
  so it lets CPU-only and CPU-heavy pods eat the CPU of GPU-rich nodes a little at a time.
- **GPU-weighted mix.** Each shape weighs by the GPU capacity it asks for, not by its pod count:
  a stranded 8-GPU pod costs eight GPUs, a stranded tenth-of-a-GPU pod a tenth.
- **Learned online.** The mix is counted from committed pods (``observe``), not a histogram fixed
  in advance; before the first observation the pod being placed stands for the mix.
- **Both dimensions.** A shape can use a GPU only if its compute *and* its memory fit, and a node
  only if its CPU, memory, model and node affinity admit the shape.
- **Joint fill.** The cutting-stock LP of the observed fractional sizes prices GPU space
  (:mod:`scheduler_extender.core.cutting_stock`); a pod that spoils a pattern the optimal packing
  needs (a 470 in an 810's room) adds the LP value it loses, in GPUs, to its growth.
- **Float scores.** No integer truncation; equal scores are left to kube-scheduler's tie-break.

The learned mix changes the scores, so the policy exposes ``revision``, bumped whenever the mix
is refreshed (when the number of observed pods doubles, then every ``REFRESH_EVERY``); callers
that cache scores by node state (the replay) drop them then. Fragmentation is memoised per node
state and mix revision, so scoring a node costs O(shapes × distinct GPU states) once per state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from math import exp
from typing import Any, Final

from scheduler_extender.core.affinity import node_affinity_matches
from scheduler_extender.core.cutting_stock import CAPACITY, Prices, prices
from scheduler_extender.core.fit import fitting_gpus
from scheduler_extender.core.model import Demand, GpuState, NodeState
from scheduler_extender.core.policy import REGISTRY
from vgpu.catalog import builtin
from vgpu.names import PlacementPolicy

NAME: Final = PlacementPolicy.FRAGMENTATION.value
COVERAGE: Final = 0.95  # shapes kept: the largest covering this share of the GPU demand (FGD: of pods)
MAX_SHAPES: Final = 64  # and never more, to bound the per-node cost
FIRST_REFRESH: Final = 8
REFRESH_EVERY: Final = 4096
MEMO_LIMIT: Final = 200_000  # node states whose fragmentation is remembered (~40 MB at most)


@dataclass(frozen=True, slots=True)
class Shape:
    """What the mix counts of a pod: its GPU demand and what decides where it may run."""

    gpu_count: int
    tflops: int
    vram: int
    whole: bool
    cpu: int
    memory: int
    gpu_model: str | None
    affinity: str  # repr of the node affinity ("None" for none): the identity of the constraint


@dataclass(frozen=True, slots=True)
class _Weighted:
    shape: Shape
    weight: float  # this shape's share of the mix's GPU demand
    affinity: Mapping[str, Any] | None


def shape_of(demand: Demand) -> Shape:
    return Shape(
        demand.gpu_count,
        demand.tflops,
        demand.vram,
        demand.whole_gpu,
        demand.cpu,
        demand.memory,
        demand.gpu_model,
        repr(demand.node_affinity),
    )


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


class FragmentationPolicy:
    """Least growth of expected stranded GPU capacity, against the online-learned mix of pod shapes."""

    __slots__ = (
        "_affinities",
        "_counts",
        "_cpu_per_gpu",
        "_demand",
        "_gpus_seen",
        "_last_demand",
        "_last_shape",
        "_memo",
        "_memory_per_gpu",
        "_mix",
        "_models",
        "_observed",
        "_prices",
        "_refreshed",
        "_scores",
        "_used",
        "revision",
    )

    def __init__(self) -> None:
        self._counts: Counter[Shape] = Counter()
        self._affinities: dict[Shape, Mapping[str, Any] | None] = {}
        self._demand: dict[Shape, float] = {}  # GPUs per pod of the shape, on the GPUs it first got
        self._observed = 0
        self._refreshed = 0
        self._used = [0.0, 0.0]  # CPU and memory of every observed pod, CPU-only ones included
        self._gpus_seen = 0.0  # GPUs those pods asked for
        self._cpu_per_gpu = 0.0  # the mix's CPU (memory) per GPU: what an idle GPU will need to be used
        self._memory_per_gpu = 0.0
        self._mix: tuple[_Weighted, ...] = ()
        self._prices: Prices | None = None  # cutting-stock duals of the fractional sizes
        self._memo: dict[tuple[object, ...], float] = {}  # node state → fragmentation
        self._scores: dict[str, tuple[tuple[GpuState, ...], tuple[int | None, int | None], dict[Shape, float]]] = {}
        self._last_demand: Demand | None = None
        self._last_shape: Shape | None = None
        self._models: dict[tuple[str, str], bool] = {}
        self.revision = 0

    @property
    def name(self) -> str:
        return NAME

    @property
    def mix(self) -> tuple[tuple[Shape, float], ...]:
        """The shapes currently scored against and their weights (for reports and tests)."""
        return tuple((w.shape, w.weight) for w in self._mix)

    # --- learning ------------------------------------------------------------------------------
    def observe(self, demand: Demand, node: NodeState, gpus: tuple[GpuState, ...]) -> None:  # noqa: ARG002
        """Count a committed pod into the mix (its CPU and memory even when it asks for no GPU)."""
        self._used[0] += demand.cpu
        self._used[1] += demand.memory
        if demand.gpu_count <= 0 or not gpus:
            return  # CPU-only pods take no GPU: they matter through the CPU they use, not as a shape
        shape = shape_of(demand)
        per_pod = self._demand.setdefault(shape, gpu_demand(shape, gpus[0]))
        self._gpus_seen += per_pod
        self._counts[shape] += 1
        self._affinities.setdefault(shape, demand.node_affinity)
        self._observed += 1
        due = max(FIRST_REFRESH, min(2 * self._refreshed, self._refreshed + REFRESH_EVERY))
        if self._observed >= due:
            self._refresh()

    def _refresh(self) -> None:
        kept: list[tuple[Shape, int]] = []
        covered = 0.0
        demand = self._demand
        total = sum(n * demand[s] for s, n in self._counts.items())
        for shape, n in sorted(self._counts.items(), key=lambda kv: -kv[1] * demand[kv[0]]):
            if covered >= COVERAGE * total or len(kept) >= MAX_SHAPES:
                break
            kept.append((shape, n))
            covered += n * demand[shape]
        mass = sum(n * self._demand[s] for s, n in kept)
        self._mix = tuple(_Weighted(s, n * self._demand[s] / mass, self._affinities[s]) for s, n in kept)
        self._cpu_per_gpu = self._used[0] / self._gpus_seen
        self._memory_per_gpu = self._used[1] / self._gpus_seen
        self._prices = self._price()
        self._refreshed = self._observed
        self._memo.clear()
        self._scores.clear()
        self.revision += 1

    def _price(self) -> Prices | None:
        """Cutting-stock duals of the observed fractional sizes (per GPU, in thousandths of a GPU)."""
        sizes: Counter[int] = Counter()
        for shape, n in self._counts.items():
            if shape.whole:
                continue
            size = round(CAPACITY * self._demand[shape] / shape.gpu_count)
            if 0 < size < CAPACITY:
                sizes[size] += n * shape.gpu_count
        kept = dict(sizes.most_common(MAX_SHAPES))
        return prices(kept) if kept else None

    # --- fragmentation -------------------------------------------------------------------------
    def _admits(self, w: _Weighted, node: NodeState) -> bool:
        """Whether the node's CPU, memory, model and node affinity admit the shape at all."""
        s = w.shape
        if node.cpu_free is not None and node.cpu_free < s.cpu:
            return False
        if node.memory_free is not None and node.memory_free < s.memory:
            return False
        if s.gpu_model is not None and not any(self._model_ok(s.gpu_model, g.model) for g in node.gpus):
            return False
        return w.affinity is None or node_affinity_matches(w.affinity, node.name, node.labels)

    def _model_ok(self, requested: str, product: str) -> bool:
        hit = self._models.get((requested, product))
        if hit is None:
            hit = self._models[(requested, product)] = _CATALOG.matches(requested, product)
        return hit

    def fragmentation(self, node: NodeState, mix: tuple[_Weighted, ...] | None = None) -> float:
        """Expected idle GPUs of the node that a pod drawn from the mix could not use, plus starved GPUs."""
        learned = mix is None
        key: tuple[object, ...] = ()
        if learned:
            key = _state_key(node)
            hit = self._memo.get(key)
            if hit is not None:
                return hit
        groups, total = _groups(node)
        value = 0.0
        if total > 0.0:
            for w in self._mix if mix is None else mix:
                s = w.shape
                if not self._admits(w, node):
                    value += w.weight * total
                    continue
                usable = 0
                stranded = 0.0
                for t, v, fresh, n, x in groups:
                    if fresh if s.whole else t >= s.tflops and v >= s.vram:
                        usable += n
                    else:
                        stranded += x
                value += w.weight * (stranded if usable >= s.gpu_count else total)
            value += self._starved(node, total)
        if learned:
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()  # a long-lived extender sees unboundedly many states
            self._memo[key] = value
        return value

    def _starved(self, node: NodeState, total: float) -> float:
        """Idle GPUs that the node's free CPU (or memory) cannot feed at the mix's CPU (memory) per GPU."""
        worst = 0.0
        if self._cpu_per_gpu > 0 and node.cpu_free is not None:
            worst = max(worst, total - node.cpu_free / self._cpu_per_gpu)
        if self._memory_per_gpu > 0 and node.memory_free is not None:
            worst = max(worst, total - node.memory_free / self._memory_per_gpu)
        return worst

    def _delta(self, demand: Demand, node: NodeState, gpus: tuple[GpuState, ...]) -> float:
        """Growth of fragmentation, in GPUs, if the pod takes ``gpus`` on ``node``."""
        mix = None
        if not self._mix and demand.gpu_count > 0:  # nothing learned yet: the pod stands for the mix
            mix = (_Weighted(shape_of(demand), 1.0, demand.node_affinity),)
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
        growth = self.fragmentation(after, mix) - self.fragmentation(node, mix)
        if self._prices is not None and not demand.whole_gpu:
            for g in gpus:
                share = gpu_demand(shape_of(demand), g) / demand.gpu_count
                growth += self._prices.loss(round(CAPACITY * share), round(CAPACITY * idle(g)))
        return growth

    def _best(self, demand: Demand, node: NodeState) -> tuple[float, tuple[GpuState, ...]] | None:
        """The least growth and the GPUs that achieve it (among equals: fullest GPU, then lowest index)."""
        fitting = sorted(fitting_gpus(demand, node), key=lambda g: (idle(g), g.index))
        if len(fitting) < demand.gpu_count:
            return None
        if demand.gpu_count == 0:
            return self._delta(demand, node, ()), ()
        if demand.gpu_count > 1 or demand.whole_gpu:
            gpus = tuple(fitting[: demand.gpu_count])
            return self._delta(demand, node, gpus), gpus
        best: tuple[float, tuple[GpuState, ...]] | None = None
        tried: set[tuple[int, int, int]] = set()
        for g in fitting:
            state = (g.tflops_used, g.vram_used, g.pods)
            if state in tried:
                continue  # an identical GPU earlier in the order gives the same growth
            tried.add(state)
            d = self._delta(demand, node, (g,))
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
        shape = self._last_shape
        if demand is not self._last_demand or shape is None:
            shape = shape_of(demand)
            self._last_demand, self._last_shape = demand, shape
        entry = self._scores.get(node.name)
        if entry is None or entry[0] is not node.gpus or entry[1] != (node.cpu_free, node.memory_free):
            entry = self._scores[node.name] = (node.gpus, (node.cpu_free, node.memory_free), {})
        hit = entry[2].get(shape)
        if hit is None:
            best = self._best(demand, node)
            hit = entry[2][shape] = 0.0 if best is None else 1.0 / (1.0 + exp(min(best[0], 700.0)))
        return hit

    def choose_gpus(self, demand: Demand, node: NodeState) -> tuple[GpuState, ...]:
        best = self._best(demand, node)
        return () if best is None else best[1]


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
        vram_used=gpu.vram if whole else gpu.vram_used + demand.vram,
        pods=gpu.pods + 1,
        whole=whole,
        slots=gpu.slots,
        slots_used=gpu.slots_used + demand.slots,
    )


def _state_key(node: NodeState) -> tuple[object, ...]:
    """What fragmentation depends on: free CPU/memory, labels and the multiset of GPU states."""
    gpus = sorted(
        (g.model, g.tflops, g.vram, g.tflops_used, g.vram_used, g.pods, g.whole, g.healthy) for g in node.gpus
    )
    return (node.cpu_free, node.memory_free, tuple(sorted(node.labels.items())), tuple(gpus))


_CATALOG: Final = builtin()
REGISTRY.register(NAME, FragmentationPolicy)
