"""A bind takes its pod from what kube-scheduler sent prioritize, never trusting it beyond the conditional write.

The copy saves the bind's read of the pod; the Binding's resourceVersion precondition is what makes it safe,
so a pod that changed since the copy is read and bound exactly as a bind without a copy binds it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scheduler_extender.gateway import Kind
from scheduler_extender.shown import ShownPods
from tests.scheduler_extender.conftest import Running
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_bind import allocation, bind_body
from tests.scheduler_extender.test_two_replicas import assert_one_allocation_never_removed
from tf_shell.kube.api import GatewayError

BIND = "bind default/p1 n1"


def shown_to_prioritize(app: Running, fake: FakeGateway) -> None:
    app.post("/prioritize", {"Pod": fake.pod("default", "p1"), "Nodes": None, "NodeNames": ["n1"]})


@pytest.fixture
def cluster(fake: FakeGateway) -> FakeGateway:
    fake.put(Kind.NODE, make_node("n1", gpus=2, vram=16 * GI))
    fake.put(Kind.POD, make_pod("p1", gpu_request(vram=6 * GI)))
    return fake


@pytest.fixture
def app(run: Callable[..., Running], cluster: FakeGateway) -> Running:
    """An extender that kube-scheduler has shown pod p1 to (prioritize), not yet bound."""
    started = run()
    shown_to_prioritize(started, cluster)
    return started


def test_a_bind_after_prioritize_writes_on_the_pod_as_sent_without_reading_it(app: Running, fake: FakeGateway) -> None:
    fake.fail["get"] = GatewayError("the bind read the pod", 500)
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    assert "get" in fake.fail, "the pod was read"
    assert fake.calls == [BIND]
    alloc = allocation(fake, "p1")
    assert alloc is not None and alloc.node == "n1"


def test_a_pod_changed_since_it_was_sent_is_read_and_bound_as_it_is_now(app: Running, fake: FakeGateway) -> None:
    pod = fake.pod("default", "p1")
    pod["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}
    fake.put(Kind.POD, pod)  # a new resourceVersion: the copy's Binding is refused
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    assert fake.calls == [BIND, BIND]
    assert fake.bindings == [("default", "p1", "n1")]
    app.settle()
    entry = app.ext.cache.entry("default/p1")
    assert entry is not None and entry.state == "committed"


def test_a_pod_another_replica_bound_since_it_was_sent_keeps_that_replicas_allocation(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    late, winner = run(), run()
    shown_to_prioritize(late, cluster)
    assert winner.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    late.post("/bind", bind_body("p1", "n1"))
    assert cluster.bindings == [("default", "p1", "n1")]
    assert_one_allocation_never_removed(cluster, "p1")


def test_each_copy_is_taken_once_and_the_oldest_go_first() -> None:
    shown = ShownPods(most=2)
    for uid in ("a", "b", "c"):
        shown.put(uid, {"metadata": {"uid": uid}})
    assert shown.take("a") is None
    assert shown.take("b") == {"metadata": {"uid": "b"}}
    assert shown.take("b") is None
    assert shown.take("c") is not None
