"""The fragmentation policy scores many nodes at once (``score_many``, numpy) exactly as node by node (``score``).

Over random clusters — GPUs of two sizes in one node, shared, whole-held, unhealthy and out-of-slot GPUs,
nodes with and without free CPU and memory, labels that admit some pinned classes — and random mixes (with
and without cutting-stock prices, CPU and memory per GPU, whole and multi-GPU shapes) or none learned, every
score is the same float, bit for bit: which path scored a node never changes a decision.
"""

from __future__ import annotations

import random
from math import inf

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vgpu.scheduling.builders import make_demand, make_gpu, make_node
from vgpu.scheduling.cutting_stock import CAPACITY, prices
from vgpu.scheduling.fit import fitting_gpus
from vgpu.scheduling.fragmentation import (
    BATCH,
    FragmentationPolicy,
    Learned,
    Shape,
    _after_one,
    _Class,
    _loss,
    _terms_of,
    _value,
    _Weighted,
    shape_of,
)
from vgpu.scheduling.model import Demand, NodeState

L4 = "NVIDIA L4"
USED = [(0, 0), (20, 4), (50, 10), (78, 20), (125, 32), (156, 40), (250, 70), (312, 80)]


def cluster(rng: random.Random, count: int) -> list[NodeState]:
    nodes = []
    for i in range(count):
        gpus = []
        for j in range(rng.choice([1, 2, 4, 8, 8])):
            small = rng.random() < 0.15
            cap_t, cap_v = (121, 24) if small else (312, 80)
            t, v = rng.choice(USED)
            t, v = min(t, cap_t), min(v, cap_v)
            gpus.append(
                make_gpu(
                    f"GPU-{i}-{j}",
                    index=j,
                    model=L4 if small else "NVIDIA A100-SXM4-80GB",
                    tflops=str(cap_t),
                    vram=f"{cap_v}Gi",
                    tflops_used=str(t),
                    vram_used=f"{v}Gi",
                    pods=rng.choice([None, None, 0, 2]),
                    whole=rng.random() < 0.05,
                    healthy=rng.random() > 0.05,
                    slots_used=rng.choice([0, 0, 0, 4]),
                )
            )
        nodes.append(
            make_node(
                f"n{i}",
                gpus=gpus,
                labels={"zone": rng.choice("ab")},
                cpu_free=rng.choice([None, 0, 4000, 64_000]),
                memory_free=rng.choice([None, "8Gi", "256Gi"]),
            )
        )
    return nodes


@st.composite
def learned(draw: st.DrawFn) -> Learned:
    if draw(st.booleans()):
        return Learned()  # nothing learned: each pod stands for the mix
    entries = []
    for _ in range(draw(st.integers(1, 5))):
        t, v = draw(st.sampled_from(USED[1:6]))
        count = draw(st.sampled_from([1, 1, 1, 2]))
        whole = draw(st.integers(0, 9)) == 0
        cpu = draw(st.sampled_from([0, 1000, 8000]))
        memory = draw(st.sampled_from([0, 4 << 30]))
        classes: tuple[_Class, ...] = ()
        if draw(st.booleans()):
            pinned = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}
            ]}]}}  # fmt: skip
            classes = (_Class(None, None, 0.5), _Class(L4, None, 0.25), _Class(None, pinned, 0.25))
        shape = Shape(count, t * 1000, v << 30, whole, cpu, memory)
        entries.append(_Weighted(shape, draw(st.floats(0.05, 1.0)), classes))
    total = sum(w.weight for w in entries)
    mix = tuple(_Weighted(w.shape, w.weight / total, w.classes) for w in entries)
    sizes = {round(CAPACITY * 0.5 * (w.shape.tflops / 312e3 + w.shape.vram / (80 << 30))): 1.0 for w in mix}
    return Learned(
        revision=1,
        mix=mix,
        cpu_per_gpu=draw(st.sampled_from([0.0, 1000.0, 6000.0])),
        memory_per_gpu=draw(st.sampled_from([0.0, float(16 << 30)])),
        prices=prices(sizes) if draw(st.booleans()) else None,
    )


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    state=learned(),
    size=st.sampled_from(USED[1:7]),
    cpu=st.sampled_from([0, 2000]),
    memory=st.sampled_from(["0", "16Gi"]),
    slots=st.sampled_from([1, 2]),
)
def test_many_nodes_at_once_score_as_node_by_node(
    seed: int, state: Learned, size: tuple[int, int], cpu: int, memory: str, slots: int
) -> None:
    nodes = cluster(random.Random(seed), BATCH + 16)
    demand = make_demand(tflops=str(size[0]), vram=f"{size[1]}Gi", cpu=cpu, memory=memory, slots=slots)
    at_once, one_by_one = FragmentationPolicy(), FragmentationPolicy()
    at_once._learned = state
    one_by_one._learned = Learned(state.revision, state.mix, state.cpu_per_gpu, state.memory_per_gpu, state.prices)
    assert at_once._least_many(state, demand, nodes) == [one_gpu_growth(one_by_one, demand, n) for n in nodes]
    assert at_once.score_many(demand, nodes) == [one_by_one.score(demand, n) for n in nodes]
    # A few nodes changed since (reserved, released): the kept arrays are repacked for them alone.
    changed = nodes[:]
    for i, node in enumerate(cluster(random.Random(seed + 1), 5)):
        changed[7 * i] = node
    assert at_once.score_many(demand, changed) == [one_by_one.score(demand, n) for n in changed]
    assert at_once.score_many(demand, nodes[:3]) == [one_by_one.score(demand, n) for n in nodes[:3]]
    # A node wider than any before: the others' kept columns padded with all-zero GPUs, their terms made again.
    wider = [*changed[:-1], make_node(changed[-1].name, n_gpus=12, tflops_used="50", vram_used="10Gi")]
    assert at_once.score_many(demand, wider) == [one_by_one.score(demand, n) for n in wider]


def one_gpu_growth(policy: FragmentationPolicy, demand: Demand, node: NodeState) -> float:
    """The least growth the one-GPU path computes for the node (its ``_least`` without the rounding)."""
    learned = policy._learned
    mix = policy._mix_for(learned, demand) or learned.mix
    tally = _terms_of(node, mix, policy._eligible(learned, mix, node))
    before = _value(learned, tally, node.cpu_free, node.memory_free)
    cpu = None if node.cpu_free is None else node.cpu_free - demand.cpu
    memory = None if node.memory_free is None else node.memory_free - demand.memory
    shape = shape_of(demand)
    growths = [
        _after_one(learned, tally, g, demand, cpu, memory) - before + _loss(learned, shape, g)
        for g in fitting_gpus(demand, node)
    ]
    return min(growths, default=inf)


def test_gpus_alike_in_use_but_not_in_size_are_both_tried() -> None:
    """Two GPUs with the same reservations but different sizes grow fragmentation differently: the one-GPU
    path tries each (it tried only the first of equal reservations, sorted fullest first)."""
    small = make_gpu("GPU-s", index=0, model=L4, tflops="121", vram="24Gi", tflops_used="50", vram_used="10Gi")
    big = make_gpu("GPU-b", index=1, tflops_used="50", vram_used="10Gi")
    node = make_node("n", gpus=[small, big])
    policy = FragmentationPolicy()
    policy._learned = Learned(revision=1, mix=(_Weighted(Shape(1, 60_000, 12 << 30, False, 0, 0), 1.0, ()),))
    demand = make_demand(tflops="20", vram="4Gi")
    # On the small GPU the pod leaves 51 TFLOPS / 10 GiB, too little for the mix's size: that GPU is stranded;
    # on the big one the mix still fits both.
    assert policy.choose_gpus(demand, node) == (big,)
