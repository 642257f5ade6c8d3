"""The fragmentation policy's cluster view: kinds that pinned demand needs are closed to other pods."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.scheduler_extender.test_replay_fragmentation import on
from vgpu.catalog import builtin
from vgpu.names import LABEL_HOSTNAME
from vgpu.names import LABEL_NODE_GPU_MODEL as MODEL_LABEL
from vgpu.scheduling.affinity import REQUIRED
from vgpu.scheduling.fragmentation import FragmentationPolicy, kind_of
from vgpu.scheduling.model import Demand, NodeState
from vgpu.scheduling.replay import Cluster, Replay

MIB = 1024 * 1024


def demand(milli: int) -> Demand:
    return Demand(
        pod_key="ns/p",
        gpu_count=1,
        tflops=milli,
        vram=milli * MIB,
        tflops_limit=milli,
        vram_limit=milli * MIB,
        cpu=1000,
    )


def pinned(milli: int, *models: str) -> Demand:
    expression = {"key": MODEL_LABEL, "operator": "In", "values": list(models)}
    return replace(demand(milli), node_affinity={REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}})


# One scarce V100 node (2 GPUs) beside two plentiful G2 nodes (16 GPUs).
SCARCE = on("v", "V100", [0, 0])
CLUSTER = (SCARCE, on("g1", "G2", [0] * 8), on("g2", "G2", [0] * 8))


def taught(
    unconstrained: int, on_v100: int, on_g2: int, cpu_only: int = 0, cluster: tuple[NodeState, ...] = ()
) -> FragmentationPolicy:
    """A policy that observed these pods (500 milli, or 1000 for half the unconstrained ones), 32 in all (refreshed at the last one), interleaved.

    They ran on a node outside the cluster, so no GPU of the cluster is in use; first ``cpu_only``
    cores of pods that asked for no GPU. ``cluster``: shown to the policy before it learns anything.
    """
    assert unconstrained + on_v100 + on_g2 == 32
    policy = FragmentationPolicy()
    if cluster:
        policy.see_cluster(cluster)
    elsewhere = on("x", "X", [0])
    if cpu_only:
        policy.observe(replace(demand(0), gpu_count=0, tflops=0, vram=0, cpu=cpu_only), elsewhere, ())
    free = [demand(500 * (1 + i % 2)) for i in range(unconstrained)]  # half of them whole GPUs
    pods = free + [pinned(500, "V100")] * on_v100 + [pinned(500, "G2")] * on_g2
    for d in pods[0::2] + pods[1::2]:
        policy.observe(d, elsewhere, elsewhere.gpus)
    return policy


def test_a_model_whose_pinned_demand_exceeds_its_idle_gpus_is_closed_to_pods_that_may_go_elsewhere() -> None:
    # half the demand is pinned to V100: 9 of the 18 idle GPUs still to be asked for, against V100's 2
    blind, seeing = taught(16, 16, 0), taught(16, 16, 0)
    seeing.see_cluster(CLUSTER)
    assert blind.closed == frozenset() and seeing.closed == {kind_of(SCARCE)}
    d = demand(500)
    half_used_v100, fresh_g2 = on("v", "V100", [500, 0]), CLUSTER[1]
    # fragmentation alone sends the pod into the V100's half-used GPU (it fills it exactly) ...
    assert blind.score(d, half_used_v100) > blind.score(d, fresh_g2)
    # ... which displaces a V100-pinned pod GPU for GPU: any node elsewhere ranks first
    assert seeing.score(d, half_used_v100) < 0.5 < seeing.score(d, fresh_g2)


def test_pods_with_nowhere_else_to_go_are_not_charged() -> None:
    policy = taught(16, 16, 0)
    policy.see_cluster(CLUSTER)
    # V100-pinned, and pinned to V100 or a model the cluster lacks: never seen before it is scored
    for d in (pinned(500, "V100"), pinned(500, "V100", "A100")):
        assert policy.score(d, on("v", "V100", [500, 0])) > 0.5


def test_pins_in_proportion_to_each_models_gpus_close_nothing_and_change_no_score() -> None:
    # 1 of 32 pods pinned to V100 (2 of 18 GPUs), 16 to G2: every model keeps room for the rest
    blind, seeing = taught(15, 1, 16), taught(15, 1, 16)
    seeing.see_cluster(CLUSTER)
    assert seeing.closed == frozenset()
    for d in (demand(500), demand(300), pinned(500, "G2")):
        for n in (on("v", "V100", [500, 0]), CLUSTER[1], on("g", "G2", [700, 0, 0, 0, 0, 0, 0, 0])):
            assert seeing.score(d, n) == blind.score(d, n)


def test_committed_pods_use_up_a_models_room_until_it_closes() -> None:
    policy = taught(15, 1, 16)
    policy.see_cluster(CLUSTER)
    assert policy.closed == frozenset()
    revision = policy.revision
    for g in SCARCE.gpus:  # unconstrained pods fill the V100 GPUs: its pinned pods would find no room
        policy.observe(demand(1000), SCARCE, (g,))
    assert policy.idle_by_kind[kind_of(SCARCE)] == 0.0
    assert policy.closed == {kind_of(SCARCE)}
    assert policy.revision > revision  # cached scores must go


def test_a_score_remembered_before_a_kind_closed_is_ranked_as_after() -> None:
    policy = taught(15, 1, 16)
    policy.see_cluster(CLUSTER)
    d, fresh_g2 = demand(500), CLUSTER[1]
    before = policy.score(d, fresh_g2)  # remembered per node state
    assert before < 0.5  # half a fresh GPU strands room for the whole-GPU pods
    for g in SCARCE.gpus:
        policy.observe(demand(1000), SCARCE, (g,))
    assert policy.closed == {kind_of(SCARCE)}
    assert policy.score(d, fresh_g2) == 0.5 * before + 0.5  # G2 displaces nobody: above every V100 node


def test_the_replay_shows_the_policy_the_whole_cluster_once() -> None:
    policy = FragmentationPolicy()
    Replay(Cluster(CLUSTER), policy, builtin())
    assert policy.idle_by_kind == {kind_of(SCARCE): 2.0, kind_of(CLUSTER[1]): 16.0}


def test_idle_gpus_their_nodes_cpu_cannot_feed_are_no_room() -> None:
    # GPU pods asked 32 cores for 20 GPUs (1.6 per GPU); the 64 cores of CPU-only pods do not count
    starved = replace(SCARCE, cpu_free=1000)  # 2 idle GPUs, but 1 core feeds only 0.625 of a GPU
    room = {kind_of(SCARCE): pytest.approx(0.625), kind_of(CLUSTER[1]): pytest.approx(16.0)}
    assert taught(16, 16, 0, cpu_only=64_000, cluster=(starved, *CLUSTER[1:])).idle_by_kind == room  # seen, learned
    policy = taught(16, 16, 0, cpu_only=64_000)
    policy.see_cluster((starved, *CLUSTER[1:]))  # learned, then seen
    assert policy.idle_by_kind == room
    policy.observe(replace(demand(0), gpu_count=0, tflops=0, vram=0, cpu=1000), starved, ())
    assert policy.idle_by_kind[kind_of(SCARCE)] == 0.0  # a CPU-only pod took the core: no GPU can be fed


def test_the_host_name_label_does_not_make_every_node_a_kind_of_its_own() -> None:
    """Every real node carries kubernetes.io/hostname: with it, the view would hold one kind per node."""
    named = [replace(on(n, "G2", [0] * 8), labels={MODEL_LABEL: "G2", LABEL_HOSTNAME: n}) for n in ("g1", "g2")]
    assert kind_of(named[0]) == kind_of(named[1]) == kind_of(on("g3", "G2", [0] * 8))
    policy = FragmentationPolicy()
    policy.see_cluster(named)
    assert list(policy.idle_by_kind.values()) == [16.0]


def test_a_cpu_only_pod_displaces_nobody_on_a_closed_kind_whose_cpu_feeds_all_its_idle_gpus() -> None:
    """A kind is closed for its room: keeping CPU-only pods off it anyway sends their CPU to the open
    kinds, whose idle GPUs it then starves (in overload, 1,000s of cores onto G2)."""
    policy = taught(16, 16, 0)
    policy.see_cluster(CLUSTER)
    assert policy.closed == {kind_of(SCARCE)}
    cpu_only = replace(demand(0), gpu_count=0, tflops=0, vram=0, cpu=1000)
    assert policy.score(cpu_only, SCARCE) > 0.5  # 64 cores feed its 2 idle GPUs after the pod too
    assert policy.score(demand(500), SCARCE) < 0.5  # a GPU pod there still takes room pinned pods need


def test_a_cpu_only_pod_displaces_pinned_demand_where_the_cpu_is_what_feeds_the_idle_gpus() -> None:
    policy = taught(16, 16, 0)
    starved = replace(SCARCE, cpu_free=2000)  # GPU pods asked 1.6 cores per GPU: 2 cores feed 1.25 GPUs
    policy.see_cluster((starved, *CLUSTER[1:]))
    assert policy.closed == {kind_of(SCARCE)}
    cpu_only = replace(demand(0), gpu_count=0, tflops=0, vram=0, cpu=1000)
    assert policy.score(cpu_only, starved) < 0.5 < policy.score(cpu_only, CLUSTER[1])


def counted(pods: int, on_v100: int) -> FragmentationPolicy:
    """A policy shown :data:`CLUSTER` that learned from ``pods`` one-GPU pods, ``on_v100`` of them pinned to V100."""
    policy = FragmentationPolicy()
    policy.see_cluster(CLUSTER)
    elsewhere = on("x", "X", [0])
    for i in range(pods):
        d = pinned(1000, "V100") if i * on_v100 % pods < on_v100 else demand(1000)  # spread evenly
        policy.observe(d, elsewhere, elsewhere.gpus)
    return policy


def test_a_share_counted_from_few_pods_closes_a_kind_its_estimate_alone_would_leave_open() -> None:
    # 3 in 32 pods pinned to V100: 1.7 of the 18 idle GPUs still to come, against V100's 2. Counted from
    # 32 pods that share is 9 % ± 5 %, and a pod that takes V100 room on a wrong guess displaces a pinned
    # pod GPU for GPU, while sending it elsewhere costs little: V100 stays closed until the count is sure.
    few, many = counted(32, 3), counted(2048, 186)
    assert few.closed == {kind_of(SCARCE)}
    assert many.closed == frozenset()


def seen(pods: int, pinned_to_g2: bool) -> FragmentationPolicy:
    """A policy shown a V100 node with one idle GPU beside :data:`CLUSTER`'s G2 nodes that learned from
    ``pods`` one-GPU pods, a quarter of them pinned to G2 when ``pinned_to_g2``, none ever to V100."""
    half_full = on("v", "V100", [1000, 0])
    policy = FragmentationPolicy()
    policy.see_cluster((half_full, *CLUSTER[1:]))
    elsewhere = on("x", "X", [0])
    for i in range(pods):
        d = pinned(1000, "G2") if pinned_to_g2 and i % 4 == 0 else demand(1000)
        policy.observe(d, elsewhere, elsewhere.gpus)
    return policy


def test_once_pins_occur_a_kind_none_was_seen_pinned_to_stays_closed_until_enough_pods_say_so() -> None:
    # After 16 pods with none pinned to V100, up to 1 in 17 might be (one standard error above 0): 1 of
    # the 17 idle GPUs, V100's whole room. Early pods that took it would displace the first V100 pins.
    v100 = kind_of(on("v", "V100", [1000, 0]))
    assert seen(16, pinned_to_g2=True).closed == {v100}
    assert seen(2048, pinned_to_g2=True).closed == frozenset()  # at most 1 in 2049: V100 keeps its room
    assert seen(16, pinned_to_g2=False).closed == frozenset()  # no pins at all: nothing closes
