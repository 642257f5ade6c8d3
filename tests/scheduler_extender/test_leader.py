"""Leader election over the extender's Lease, and the status writer following it."""

from __future__ import annotations

from scheduler_extender.leader import LeaseElector, LeaseTerms
from tests.scheduler_extender.fakes import FakeGateway
from tests.scheduler_extender.test_workload_status import record, writer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(fake: FakeGateway, identity: str, clock: Clock) -> LeaseElector:
    return LeaseElector(fake, "tf-system", "tensor-fusion-extender", identity, clock=clock, monotonic=clock)


def test_one_replica_holds_the_lease_and_the_other_takes_over_only_after_it_expired() -> None:
    fake, clock = FakeGateway(), Clock()
    a, b = elector(fake, "a", clock), elector(fake, "b", clock)
    assert a.step() and a.is_leader()
    assert not b.step() and not b.is_leader()
    lease = fake.leases[("tf-system", "tensor-fusion-extender")]["spec"]
    assert (lease["holderIdentity"], lease["leaseDurationSeconds"], lease["leaseTransitions"]) == ("a", 15, 0)
    for _ in range(6):  # a renews every 5 s: b never sees the same record for 15 s
        clock.now += 5
        assert a.step() and not b.step()
    # a stops renewing (its pod is gone, or it is partitioned from the API server).
    clock.now += 10
    assert not a.is_leader()  # past its renew deadline, a stops before anyone else may start
    assert not b.step()  # b has seen the same record for 10 s only
    clock.now += 5.1
    assert b.step() and b.is_leader()
    lease = fake.leases[("tf-system", "tensor-fusion-extender")]["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == ("b", 1)
    assert not a.step() and not a.is_leader()  # a comes back: b holds a fresh record


def test_a_stopping_leader_releases_the_lease_and_the_other_takes_over_at_once() -> None:
    fake, clock = FakeGateway(), Clock()
    a, b = elector(fake, "a", clock), elector(fake, "b", clock)
    assert a.step() and not b.step()
    a.stop()
    assert not a.is_leader()
    lease = fake.leases[("tf-system", "tensor-fusion-extender")]["spec"]
    assert (lease["holderIdentity"], lease["leaseDurationSeconds"]) == ("", 1)
    clock.now += 0.1  # not a lease duration: a released it
    assert b.step() and b.is_leader()
    assert fake.leases[("tf-system", "tensor-fusion-extender")]["spec"]["leaseTransitions"] == 1
    b.stop()
    a.stop()  # not the holder: changes nothing
    assert fake.leases[("tf-system", "tensor-fusion-extender")]["spec"]["holderIdentity"] == ""


def test_of_two_replicas_racing_for_an_expired_lease_exactly_one_wins() -> None:
    fake, clock = FakeGateway(), Clock()
    old, a, b = elector(fake, "old", clock), elector(fake, "a", clock), elector(fake, "b", clock)
    assert old.step()
    assert not a.step() and not b.step()
    clock.now += LeaseTerms().duration + 1
    real_replace = fake.replace_lease

    def b_first(namespace: str, name: str, body: dict[str, object]) -> None:
        fake.replace_lease = real_replace  # type: ignore[method-assign]
        assert b.step()  # b's takeover lands between a's read and a's write
        real_replace(namespace, name, body)

    fake.replace_lease = b_first  # type: ignore[method-assign]
    assert not a.step() and not a.is_leader()
    assert b.is_leader() and fake.leases[("tf-system", "tensor-fusion-extender")]["spec"]["holderIdentity"] == "b"


def test_the_status_writer_writes_nothing_while_not_leader() -> None:
    fake = FakeGateway()
    fake.workloads[("team-a", "train")] = {"metadata": {"namespace": "team-a", "name": "train"}}
    leading = False
    status_writer = writer(fake, [record("p1")], leading=lambda: leading)
    assert status_writer.sync() == 0 and fake.status_patches == []
    leading = True
    assert status_writer.sync() == 1 and fake.workloads[("team-a", "train")]["status"]["replicas"] == 1
