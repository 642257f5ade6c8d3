"""The paper's baselines, BestFit and FGD, exactly as the FGD authors' simulator scores them.

Both implement the core's :class:`~vgpu.scheduling.policy.Policy` protocol so the same
replay engine runs them, but they keep the paper's own integer scores (0–100, ``int()``
truncation) and are replayed with :attr:`Selection.RAW` (highest score wins, ties to the smallest
node rank), as in the paper's simulator where they were in-tree score plugins.

They read the trace's 1-D GPU model back from a node: a GPU's free share in milli is its free
compute (every replayed GPU has the same capacity, see :mod:`benchmarks.placement.traces`).

- BestFit: ``score = int(100 × (1 − ½·(cpu_left − cpu)/128000 − ½·(gpu_left − gpu)/8000))``,
  GPU: the fitting GPU with the least free share (first index on ties).
- FGD: node fragmentation ``F = Σ_shapes p_s × frag_s`` against the trace's most frequent pod
  shapes (cpu, gpu_milli, num_gpu, gpu_spec) covering 95 % of pods, renormalised; ``frag_s`` is all
  idle GPU milli when the shape cannot run on the node (or asks for no GPU), else the idle milli
  of GPUs with less free than its per-GPU share. ``score = int(100 × sigmoid((F − F_after)/1000))``;
  a fractional pod tries each fitting GPU and keeps the first best (integer) score.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from math import exp

from benchmarks.placement.traces import MILLI, TracePod
from vgpu.names import LABEL_NODE_GPU_MODEL
from vgpu.scheduling.model import Demand, GpuState, NodeState

MAX_SPEC_CPU = 128_000  # the simulator's normalisers
MAX_SPEC_GPU = 8_000
MAX_NODE_SCORE = 100


def gpu_left(gpu: GpuState) -> int:
    """Free share of one GPU in milli (0 when held whole)."""
    return 0 if gpu.whole else (gpu.tflops - gpu.tflops_used) * MILLI // gpu.tflops


def node_model(node: NodeState) -> str:
    return node.labels.get(LABEL_NODE_GPU_MODEL) or (node.gpus[0].model if node.gpus else "")


def pod_shape(demand: Demand) -> tuple[int, int]:
    """(per-GPU milli, GPU count) of a demand in trace units."""
    if demand.gpu_count == 0:
        return 0, 0
    return (MILLI if demand.whole_gpu else demand.tflops * MILLI // 1000), demand.gpu_count


def _cpu(node: NodeState) -> int:
    return node.cpu_free if node.cpu_free is not None else 0


class BestFit:
    """Least remaining (CPU, GPU) after placing, as the paper's Best-fit baseline."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return "bestfit"

    def score(self, demand: Demand, node: NodeState) -> float:
        milli, count = pod_shape(demand)
        left = sum(gpu_left(g) for g in node.gpus)
        waste = 0.5 * (_cpu(node) - demand.cpu) / MAX_SPEC_CPU + 0.5 * (left - milli * count) / MAX_SPEC_GPU
        return float(int((1.0 - waste) * MAX_NODE_SCORE))

    def choose_gpus(self, demand: Demand, node: NodeState) -> tuple[GpuState, ...]:
        milli, count = pod_shape(demand)
        if count == 0:
            return ()
        if milli < MILLI:
            fitting = [g for g in node.gpus if gpu_left(g) >= milli]
            return (min(fitting, key=lambda g: (gpu_left(g), g.index)),) if fitting else ()
        return _first_idle(node, count)

    def observe(self, demand: Demand, node: NodeState, gpus: tuple[GpuState, ...]) -> None:
        """Stateless."""


def _first_idle(node: NodeState, count: int) -> tuple[GpuState, ...]:
    idle = [g for g in sorted(node.gpus, key=lambda g: g.index) if gpu_left(g) >= MILLI]
    return tuple(idle[:count]) if len(idle) >= count else ()


@dataclass(frozen=True, slots=True)
class TypicalShape:
    cpu: int
    milli: int  # per GPU
    count: int
    spec: tuple[str, ...]
    p: float


def typical_shapes(pods: Sequence[TracePod], coverage: float = 0.95) -> tuple[TypicalShape, ...]:
    """The most frequent (cpu, gpu_milli, num_gpu, gpu_spec) covering ``coverage`` of pods, renormalised."""
    counts = Counter((p.cpu or 100, p.gpu_milli, p.num_gpu, p.gpu_spec) for p in pods)
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    chosen: list[tuple[tuple[int, int, int, tuple[str, ...]], int]] = []
    covered = 0
    for shape, n in ranked:
        if covered >= coverage * len(pods):
            break
        chosen.append((shape, n))
        covered += n
    return tuple(TypicalShape(s[0], s[1], s[2], s[3], n / covered) for s, n in chosen)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + exp(-x))


class FGD:
    """Fragmentation Gradient Descent with the paper's static shape histogram and integer scores."""

    __slots__ = ("_memo", "shapes")

    def __init__(self, shapes: Sequence[TypicalShape]) -> None:
        self.shapes = tuple(shapes)
        self._memo: dict[tuple[str, int, tuple[int, ...]], float] = {}

    @property
    def name(self) -> str:
        return "fgd"

    def frag(self, model: str, cpu: int, lefts: tuple[int, ...]) -> float:
        """Expected fragmented GPU milli of a node state (memoised on the sorted free shares)."""
        key = (model, cpu, tuple(sorted(lefts)))
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        total = sum(lefts)
        value = 0.0
        for s in self.shapes:
            if s.milli == 0 or (s.spec and model not in s.spec):
                value += s.p * total
                continue
            usable = sum(1 for x in lefts if x >= s.milli)
            if usable >= s.count and cpu >= s.cpu:
                value += s.p * sum(x for x in lefts if x < s.milli)
            else:
                value += s.p * total
        self._memo[key] = value
        return value

    def _gpu_scores(self, demand: Demand, node: NodeState) -> list[tuple[int, GpuState]]:
        """(integer score, GPU) for every GPU a fractional pod could take, in GPU index order."""
        model, cpu = node_model(node), _cpu(node)
        gpus = sorted(node.gpus, key=lambda g: g.index)
        lefts = tuple(gpu_left(g) for g in gpus)
        before = self.frag(model, cpu, lefts)
        milli, _ = pod_shape(demand)
        out: list[tuple[int, GpuState]] = []
        for i, g in enumerate(gpus):
            if lefts[i] >= milli:
                after = self.frag(model, cpu - demand.cpu, (*lefts[:i], lefts[i] - milli, *lefts[i + 1 :]))
                out.append((int(_sigmoid((before - after) / MILLI) * MAX_NODE_SCORE), g))
        return out

    def score(self, demand: Demand, node: NodeState) -> float:
        milli, count = pod_shape(demand)
        if count == 1 and milli < MILLI:
            scores = self._gpu_scores(demand, node)
            return float(max(s for s, _ in scores)) if scores else 0.0
        model, cpu = node_model(node), _cpu(node)
        lefts = sorted(gpu_left(g) for g in node.gpus)
        before = self.frag(model, cpu, tuple(lefts))
        taken = 0
        for i, x in enumerate(lefts):  # Sub(): the least sufficient GPUs first
            if taken < count and x >= milli:
                lefts[i] -= milli
                taken += 1
        after = self.frag(model, cpu - demand.cpu, tuple(lefts))
        return float(int(_sigmoid((before - after) / MILLI) * MAX_NODE_SCORE))

    def choose_gpus(self, demand: Demand, node: NodeState) -> tuple[GpuState, ...]:
        milli, count = pod_shape(demand)
        if count == 0:
            return ()
        if milli < MILLI:
            best: tuple[int, GpuState] | None = None
            for s, g in self._gpu_scores(demand, node):
                if best is None or s > best[0]:
                    best = (s, g)
            return (best[1],) if best else ()
        return _first_idle(node, count)

    def observe(self, demand: Demand, node: NodeState, gpus: tuple[GpuState, ...]) -> None:
        """Static histogram: nothing to learn."""
