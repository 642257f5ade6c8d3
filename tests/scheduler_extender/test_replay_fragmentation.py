"""The fragmentation policy on hand-made nodes: what it learns and where it sends pods."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vgpu.catalog import builtin
from vgpu.names import LABEL_HOSTNAME
from vgpu.names import LABEL_NODE_GPU_MODEL as MODEL_LABEL
from vgpu.scheduling import fragmentation as fragmentation_module
from vgpu.scheduling.affinity import REQUIRED
from vgpu.scheduling.fragmentation import FragmentationPolicy, Learned, learn
from vgpu.scheduling.model import Demand, GpuState, NodeState
from vgpu.scheduling.placement import place
from vgpu.scheduling.policy import REGISTRY

MIB = 1024 * 1024


def gpu(i: int, used: int = 0, vram_used: int | None = None) -> GpuState:
    v = used if vram_used is None else vram_used
    return GpuState(
        uuid=f"g{i}",
        index=i,
        model="T4",
        tflops=1000,
        vram=1000 * MIB,
        tflops_used=used,
        vram_used=v * MIB,
        pods=1 if used or v else 0,
    )


def node(name: str, used: list[int], cpu: int = 64_000) -> NodeState:
    return NodeState(
        name=name, pool="p", gpus=tuple(gpu(i, u) for i, u in enumerate(used)), cpu_free=cpu, memory_free=1 << 40
    )


def demand(milli: int, count: int = 1, cpu: int = 1000) -> Demand:
    whole = milli >= 1000
    share = 1000 if whole else milli
    return Demand(
        pod_key="ns/p",
        gpu_count=count if milli else 0,
        tflops=share,
        vram=share * MIB,
        tflops_limit=share,
        vram_limit=share * MIB,
        whole_gpu=whole,
        cpu=cpu,
    )


def learned(*pods: tuple[Demand, int]) -> FragmentationPolicy:
    """A policy that has observed ``n`` committed pods of each demand (on fresh GPUs)."""
    policy = FragmentationPolicy()
    for d, n in pods:
        for _ in range(n):
            policy.observe(d, node("x", [0] * 8), tuple(gpu(i) for i in range(max(d.gpu_count, 1)))[: d.gpu_count])
    return policy


def test_registered_by_name() -> None:
    assert REGISTRY.create("fragmentation").name == "fragmentation"


def test_the_mix_weighs_shapes_by_the_gpus_they_ask_for() -> None:
    # the 8th GPU pod triggers the first refresh; CPU-only pods are counted for CPU, not as shapes
    policy = learned((demand(0, cpu=4000), 5), (demand(1000, 8), 1), (demand(100), 7))
    weights = {(s.gpu_count, s.tflops): w for s, w in policy.mix}
    assert weights[(8, 1000)] == pytest.approx(8 / 8.7)  # one pod, but eight of the 8.7 GPUs asked for
    assert weights[(1, 100)] == pytest.approx(0.7 / 8.7)
    assert len(weights) == 2


def test_revision_bumps_when_the_observed_count_doubles() -> None:
    policy = FragmentationPolicy()
    revisions = []
    for _ in range(40):
        policy.observe(demand(500), node("x", [0]), (gpu(0),))
        revisions.append(policy.revision)
    assert revisions[6] == 0 and revisions[7] == 1  # 8th pod
    assert revisions[15] == 2 and revisions[31] == 3  # 16th, 32nd


def test_fractional_pods_go_to_partly_used_gpus_when_whole_gpus_are_in_demand() -> None:
    policy = learned((demand(1000), 20), (demand(300), 5))
    used, fresh = node("used", [600, 1000]), node("fresh", [0, 0])
    d = demand(300)
    assert policy.score(d, used) > policy.score(d, fresh)
    assert [g.index for g in policy.choose_gpus(d, node("n", [0, 600]))] == [1]


def test_gpus_the_nodes_cpu_cannot_feed_count_as_stranded() -> None:
    # the mix needs 8 cores per GPU; a CPU-only pod should not eat the CPU that feeds idle GPUs
    policy = learned((demand(1000, cpu=8000), 20), (demand(0, cpu=8000), 5))
    tight, roomy = node("tight", [0, 0], cpu=20_000), node("roomy", [0, 0], cpu=96_000)
    cpu_pod = demand(0, cpu=8000)
    assert policy.score(cpu_pod, roomy) > policy.score(cpu_pod, tight)
    assert policy.fragmentation(node("t", [0, 0], cpu=8000)) == pytest.approx(1.0)  # feeds one GPU of two


def test_a_gpu_is_usable_only_if_compute_and_memory_both_fit() -> None:
    policy = learned((demand(500), 10))
    memory_full = replace(node("m", [0]), gpus=(gpu(0, used=100, vram_used=900),))
    assert policy.fragmentation(memory_full) == pytest.approx(0.5)  # (0.9 + 0.1) / 2 idle, all stranded
    assert policy.fragmentation(node("ok", [100])) == pytest.approx(0.0)


def test_before_any_observation_the_pod_itself_is_the_mix() -> None:
    policy = FragmentationPolicy()
    d = demand(400)
    # on "half" 400 of 500 free would leave 100 that another 400 cannot use; on "fresh" 600 remain
    assert policy.score(d, node("fresh", [0])) > policy.score(d, node("half", [500]))


def test_choices_are_accepted_by_place_for_every_kind_of_pod() -> None:
    policy = learned((demand(1000, 2), 5), (demand(470), 5))
    n = node("n", [600, 0, 0, 300])
    for d in (demand(470), demand(1000, 2), demand(0, cpu=2000)):
        placement = place(d, n, policy, builtin())
        assert placement is not None
        assert len(placement.gpus) == d.gpu_count


def test_scores_stay_in_the_unit_interval_and_unfit_nodes_score_zero() -> None:
    policy = learned((demand(1000), 5))
    assert 0.0 < policy.score(demand(1000), node("n", [0, 300])) < 1.0
    assert policy.score(demand(1000, 2), node("n", [0, 300])) == 0.0


def on(name: str, model: str, used: list[int]) -> NodeState:
    """A node of GPU model ``model`` (labelled as the replay labels them)."""
    gpus = tuple(replace(gpu(i, u), uuid=f"{name}-g{i}", model=model) for i, u in enumerate(used))
    return NodeState(name=name, pool="p", labels={MODEL_LABEL: model}, gpus=gpus, cpu_free=64_000, memory_free=1 << 40)


def pinned(milli: int, *models: str) -> Demand:
    """A pod that may run only on nodes of ``models`` (a required node affinity, as openb's gpu_spec)."""
    expression = {"key": MODEL_LABEL, "operator": "In", "values": list(models)}
    return replace(demand(milli), node_affinity={REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}})


def test_pods_pinned_elsewhere_neither_use_nor_strand_a_nodes_gpus() -> None:
    # the only pods that may run on a V100 node are the 1000s: its 600-free GPU strands all of them
    policy = learned((demand(1000), 10), (pinned(300, "T4"), 22))  # 32 pods: refreshed at the last one
    assert policy.fragmentation(on("v", "V100", [400])) == pytest.approx(0.6)
    assert policy.fragmentation(on("t", "T4", [400])) == pytest.approx(0.6 * 10 / 16.6)  # 6.6 of 16.6 GPUs: 300s
    assert policy.pinned_share() == pytest.approx(6.6 / 16.6)


def test_unconstrained_pods_are_not_pulled_onto_the_model_that_few_pods_are_pinned_to() -> None:
    # most pinned demand goes to G2; counting it as stranding the scarce V100's GPUs made V100 look
    # like the best home for every unconstrained pod, until the V100-pinned pods found it full
    policy = learned((demand(500), 20), (pinned(500, "G2"), 20), (pinned(500, "V100"), 2))
    d = demand(500)
    assert policy.score(d, on("v", "V100", [0, 0])) == pytest.approx(policy.score(d, on("g", "G2", [0, 0])))


def test_the_mix_is_counted_by_size_whatever_the_pods_are_pinned_to() -> None:
    models = ("T4", "G2", "P100", "V100M16", "V100M32")
    policy = learned(*((pinned(milli, m), 3) for milli in (100, 200, 300) for m in models))
    assert len(policy.mix) == 3  # three sizes, not fifteen (size, model) shapes crowding the 64 kept


def test_a_deferred_policy_counts_in_observe_and_learns_only_when_told() -> None:
    policy = FragmentationPolicy()
    policy.deferred = True
    for _ in range(8):
        policy.observe(demand(500), node("x", [0]), (gpu(0),))
    assert policy.revision == 0 and policy.mix == () and policy.due
    observed = policy.take()
    assert observed is not None and not policy.due and policy.take() is None
    learned_mix = learn(observed)
    policy.adopt(learned_mix)
    assert policy.revision == 1 and len(policy.mix) == 1
    policy.adopt(Learned())  # an older result arriving late is ignored
    assert policy.revision == 1


def test_nodes_in_one_state_share_what_was_computed_for_one_whatever_their_own_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every real node carries its own hostname label: the memo is keyed by what the node admits of the
    mix, so nodes in the same state are judged once, and a node admitting another part of it is not."""
    zoned = {"key": "zone", "operator": "In", "values": ["a"]}
    in_zone_a = replace(demand(300), node_affinity={REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [zoned]}]}})
    policy = learned((demand(500), 20), (in_zone_a, 12))  # 32 pods: refreshed at the last one
    judged: list[str] = []
    real = fragmentation_module._groups

    def counted(n: NodeState) -> object:
        judged.append(n.name)
        return real(n)

    monkeypatch.setattr(fragmentation_module, "_groups", counted)

    def labelled(name: str, zone: str) -> NodeState:
        base = on(name, "T4", [300, 0])
        return replace(base, labels={**base.labels, LABEL_HOSTNAME: name, "zone": zone})

    first = policy.fragmentation(labelled("a1", "a"))
    assert policy.fragmentation(labelled("a2", "a")) == first
    assert judged == ["a1"]
    policy.fragmentation(labelled("b1", "b"))  # the zone-a pods may not run here: judged on its own
    assert judged == ["a1", "b1"]
