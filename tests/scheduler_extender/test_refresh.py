"""The extender's background refresher: learning policies learn off the bind path, one refresh at a time."""

from __future__ import annotations

from scheduler_extender.core.fragmentation import FragmentationPolicy
from scheduler_extender.core.policy import Policies
from scheduler_extender.refresh import Refresher
from tests.scheduler_extender.conftest import wait_for
from tests.scheduler_extender.test_replay_fragmentation import demand, gpu, node


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
