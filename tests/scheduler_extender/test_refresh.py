"""The extender's background refresher: learning policies learn off the bind path, one refresh at a time."""

from __future__ import annotations

from collections.abc import Callable

from scheduler_extender.gateway import Kind
from scheduler_extender.refresh import Refresher
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, make_node
from tests.scheduler_extender.test_replay_fragmentation import demand, gpu, node
from vgpu.scheduling.fragmentation import FragmentationPolicy
from vgpu.scheduling.model import NodeState
from vgpu.scheduling.policy import Policies


def observe(policy: FragmentationPolicy, pods: int) -> None:
    for _ in range(pods):
        policy.observe(demand(500), node("x", [0]), (gpu(0),))


def test_policies_made_through_the_hook_are_deferred_and_refreshed_by_the_worker_only() -> None:
    seconds: list[float] = []
    refresher = Refresher(on_refresh=seconds.append)
    policies = Policies("fragmentation", on_create=refresher.track)
    policy = policies.default
    assert isinstance(policy, FragmentationPolicy) and policy.deferred
    policies.get("binpack")  # stateless: made through the same hook, nothing for the refresher
    observe(policy, 8)  # due: inline, this observe would have solved the LP inside a bind
    assert policy.revision == 0 and policy.due
    assert refresher.run_once() == 1
    assert policy.revision == 1 and len(policy.mix) == 1 and len(seconds) == 1
    assert refresher.run_once() == 0  # nothing new is due


def test_the_worker_thread_adopts_a_due_refresh_on_its_own() -> None:
    refresher = Refresher(interval=0.01)
    policy = FragmentationPolicy()
    refresher.track(policy)
    refresher.worker.start()
    try:
        observe(policy, 8)
        wait_for(lambda: policy.revision == 1, what="the refresher thread")
    finally:
        refresher.worker.stop()
    assert len(policy.mix) == 1


def test_cluster_aware_policies_are_shown_every_node_when_new_and_then_every_see_every_seconds() -> None:
    """Pods that leave never reach ``observe``: only the periodic view of the cache returns their GPUs."""
    now = [100.0]
    cluster = [node("a", [0, 0]), node("b", [0, 0])]
    calls: list[int] = []

    def nodes() -> tuple[NodeState, ...]:
        calls.append(1)
        return tuple(cluster)

    refresher = Refresher(cluster=nodes, see_every=5.0, monotonic=lambda: now[0])
    policy = FragmentationPolicy()
    refresher.track(policy)
    refresher.run_once()
    assert sum(policy.idle_by_kind.values()) == 4.0 and len(calls) == 1  # new: shown at once
    cluster[1] = node("b", [1000, 1000])  # two GPUs taken on b (as the cache now holds it)
    now[0] += 4.9
    refresher.run_once()
    assert sum(policy.idle_by_kind.values()) == 4.0 and len(calls) == 1  # not yet due
    now[0] += 0.1
    refresher.run_once()
    assert sum(policy.idle_by_kind.values()) == 2.0 and len(calls) == 2


def test_without_a_cluster_provider_nothing_is_shown_and_nothing_closes() -> None:
    refresher = Refresher()
    policy = FragmentationPolicy()
    refresher.track(policy)
    refresher.run_once()
    assert dict(policy.idle_by_kind) == {} and policy.closed == frozenset()


def test_the_extender_shows_its_default_policy_every_node_of_its_cache(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    for name in ("n1", "n2"):
        fake.put(Kind.NODE, make_node(name, gpus=2, vram=16 * GI))
    app = run(policy="fragmentation")
    policy = app.ext.verbs.policies.default
    assert isinstance(policy, FragmentationPolicy)
    wait_for(lambda: sum(policy.idle_by_kind.values()) == 4.0, what="the refresher to show the policy both nodes")
