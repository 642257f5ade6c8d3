"""The fragmentation policy's one-GPU scoring from a node's kept terms equals the growth computed the long way.

For a one-GPU share the policy no longer builds each candidate's node and sums its fragmentation over every GPU:
it keeps the node's terms per mix entry and moves one GPU's part (:func:`_after_one`). This checks, over random
nodes, mixes and pods, that the growth it finds and the GPU it picks are those of :meth:`_delta` (the long way,
still used for several GPUs), growth within 1e-9 and the GPU the same wherever the best growth is not tied.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vgpu.scheduling.builders import make_demand, make_gpu, make_node
from vgpu.scheduling.fit import fitting_gpus
from vgpu.scheduling.fragmentation import FragmentationPolicy, Learned, Shape, _Weighted, idle
from vgpu.scheduling.model import Demand, NodeState

SIZES = st.sampled_from([("10", "4Gi"), ("20", "8Gi"), ("78", "20Gi"), ("156", "40Gi"), ("40", "10Gi")])


@st.composite
def nodes(draw: st.DrawFn) -> NodeState:
    gpus = []
    for i in range(draw(st.integers(1, 8))):
        t_used = draw(st.integers(0, 312))
        v_used = draw(st.integers(0, 80))
        gpus.append(make_gpu(f"GPU-{i}", index=i, tflops_used=str(t_used), vram_used=f"{v_used}Gi"))
    cpu = draw(st.none() | st.integers(0, 64_000))
    return make_node("n", gpus=gpus, cpu_free=cpu)


@st.composite
def mixes(draw: st.DrawFn) -> tuple[_Weighted, ...]:
    shapes = draw(st.lists(SIZES, min_size=1, max_size=4, unique=True))
    count = draw(st.sampled_from([1, 1, 2]))
    weights = [draw(st.floats(0.05, 1.0)) for _ in shapes]
    total = sum(weights)
    return tuple(
        _Weighted(Shape(count, int(float(t) * 1000), int(v[:-2]) << 30, False, 1000 * count, 0), w / total, ())
        for (t, v), w in zip(shapes, weights, strict=True)
    )


def the_long_way(policy: FragmentationPolicy, learned: Learned, demand: Demand, node: NodeState) -> dict[str, float]:
    """Each fitting GPU's growth as :meth:`_delta` computes it (the candidate node built, summed from scratch)."""
    before = policy._fragmentation(learned, node, None)
    found = {}
    for g in fitting_gpus(demand, node):
        growth = policy._delta(learned, demand, node, (g,), None, before)
        found[g.uuid] = growth
    return found


@settings(max_examples=300, deadline=None)
@given(node=nodes(), mix=mixes(), size=SIZES, cpu=st.integers(0, 4000))
def test_one_gpu_growth_and_choice_match_the_long_way(
    node: NodeState, mix: tuple[_Weighted, ...], size: tuple[str, str], cpu: int
) -> None:
    policy = FragmentationPolicy()
    learned = Learned(revision=1, mix=mix, cpu_per_gpu=1000.0)
    policy._learned = learned
    demand = make_demand(tflops=size[0], vram=size[1], cpu=cpu)
    long_way = the_long_way(policy, learned, demand, node)
    best = policy._best(learned, demand, node)
    if not long_way:
        assert best is None
        return
    assert best is not None
    least = min(long_way.values())
    assert abs(best[0] - least) < 1e-9
    ties = {u for u, growth in long_way.items() if growth - least < 1e-9}
    assert best[1][0].uuid in ties
    # Among ties, the fullest GPU (then the lowest index), as the policy documents.
    tied = [g for g in node.gpus if g.uuid in ties]
    assert best[1][0] is min(tied, key=lambda g: (idle(g), g.index))
    # A second pod of another size reads the node's kept terms: still the long way's answer.
    other = make_demand(tflops="5", vram="1Gi")
    again = policy._best(learned, other, node)
    long_other = the_long_way(policy, learned, other, node)
    assert again is not None and abs(again[0] - min(long_other.values())) < 1e-9
