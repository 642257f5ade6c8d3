"""bind under hostile load: a Binding once posted is never reported failed, a stalled API server gets an
answer within ``bind_timeout``, and two binds of one pod never run at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

from scheduler_extender.binder import BindError
from scheduler_extender.gateway import Kind
from scheduler_extender.wire import ExtenderBindingArgs
from tests.scheduler_extender.conftest import Running
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_bind import allocation, bind_body


@pytest.fixture
def cluster(fake: FakeGateway) -> FakeGateway:
    """As in test_bind: n1 with 2 GPUs of 16Gi and 100 TFLOPS; p1, pending, asks for 30 TFLOPS and 6Gi."""
    fake.put(Kind.NODE, make_node("n1", gpus=2, vram=16 * GI, tflops=100_000))
    fake.put(Kind.POD, make_pod("p1", gpu_request(tflops=30_000, vram=6 * GI)))
    return fake


@contextmanager
def slow_binding(app: Running) -> Iterator[tuple[Future[Any], threading.Event]]:
    """POST /bind for p1 in a thread whose Binding POST waits until the yielded event is set."""
    fake = app.fake
    posting, go = threading.Event(), threading.Event()
    real = fake.bind

    def bind(*args: Any, **kwargs: Any) -> None:
        posting.set()
        assert go.wait(5)
        real(*args, **kwargs)

    fake.bind = bind  # type: ignore[method-assign]
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(app.post, "/bind", bind_body("p1", "n1"))
        assert posting.wait(5), "the bind never posted its Binding"
        try:
            yield reply, go
        finally:
            go.set()


def scheduled_again_by_filter(app: Running) -> None:
    """The next attempt's filter passes two nodes: it drops the pod's tentative reservation, reserves none."""
    pod = app.fake.pod("default", "p1")
    reply = app.post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": ["n1", "n2"]})
    assert reply["NodeNames"] == ["n1", "n2"]


def expired_by_the_sweeper(app: Running) -> None:
    time.sleep(app.ext.settings.reservation_ttl + 0.7)


@pytest.mark.parametrize("then", [scheduled_again_by_filter, expired_by_the_sweeper])
def test_a_pod_scheduled_again_while_its_bind_runs_keeps_the_binds_hold(
    run: Callable[..., Running], cluster: FakeGateway, then: Callable[[Running], None]
) -> None:
    """kube-scheduler gave up on a slow bind and scheduled the pod again while the Binding was still on its
    way. The retry's prioritize used to relabel the bind's hold as a tentative reservation, which the next
    filter (or its TTL) released: the Binding then landed, the commit was refused ("holds no reservation
    (expired or never made)"), the scheduler was told the bind failed, and the pod's GPUs were counted free."""
    cluster.put(Kind.NODE, make_node("n2", gpus=2, vram=16 * GI, tflops=100_000))
    app = run(reservation_ttl=0.2)
    with slow_binding(app) as (reply, go):
        pod = cluster.pod("default", "p1")
        assert app.post("/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": ["n1"]}) == [
            {"Host": "n1", "Score": 10}
        ]
        assert app.ext.cache.tentative_count() == 0  # the bind's hold stays the bind's
        then(app)
        assert app.ext.cache.entry("default/p1") is not None
        go.set()
        assert reply.result(5) == {"Error": ""}
    alloc, entry = allocation(cluster, "p1"), app.ext.cache.entry("default/p1")
    assert alloc is not None and entry is not None and entry.state == "committed" and entry.grants == alloc.gpus
    used = {g.uuid: g.vram_used for g in app.ext.cache.node("n1").gpus}  # type: ignore[union-attr]
    assert used[alloc.gpus[0].uuid] == 6 * GI
    assert cluster.bindings == [("default", "p1", "n1")]


def test_a_second_bind_of_a_pod_whose_bind_runs_is_refused_and_undoes_nothing(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    """It would give the first bind's reservation back under it."""
    app = run()
    with slow_binding(app) as (first, go):
        error = app.post("/bind", bind_body("p1", "n1"))["Error"]
        assert error == "a bind of pod default/p1 is still in progress; the scheduler will retry"
        go.set()
        assert first.result(5) == {"Error": ""}
    assert cluster.calls == ["bind default/p1 n1"]
    app.settle()
    assert allocation(cluster, "p1") is not None
    assert 'tf_extender_binds_total{result="busy"} 1.0' in app.client.get("/metrics").text


BOUND = 0.6  # bind_timeout of these tests; handoff_wait must then be at most 0.4
SLACK = 0.25  # a cleanup call may pass the bound by MIN_CALL; the rest is the test client and a loaded box


@pytest.mark.parametrize("stall_at", ["get", "lease", "bind"])
def test_bind_answers_within_its_bound_while_the_api_server_stalls_and_recovers_after(
    run: Callable[..., Running], cluster: FakeGateway, stall_at: str
) -> None:
    """The API server stops answering at the pod read, the claim or the Binding POST. Every call
    gets a timeout cut from the bind's deadline, so bind answers an Error naming the stall within its bound.
    Once the API server runs again, nothing is left holding the node, and the pod binds on its next try."""
    app = run(bind_timeout=BOUND, handoff_wait=0.4)
    cluster.stall_at = stall_at
    start = time.monotonic()
    error = app.post("/bind", bind_body("p1", "n1"))["Error"]
    took = time.monotonic() - start
    assert took < BOUND + SLACK, f"bind answered after {took:.2f}s"
    assert "the API server did not answer within" in error and "(stalled?)" in error
    assert cluster.timeouts and all(t is not None and 0 < t <= BOUND for _, t in cluster.timeouts)
    cluster.resume()
    app.settle()
    assert app.ext.gate.holders("n1") == () or stall_at == "bind"  # an unknown Binding keeps the gate
    if stall_at == "get":
        assert app.ext.cache.entries() == {} and allocation(cluster, "p1") is None
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    app.settle()
    alloc, entry = allocation(cluster, "p1"), app.ext.cache.entry("default/p1")
    assert alloc is not None and entry is not None and entry.state == "committed" and entry.grants == alloc.gpus
    assert len(app.ext.cache.entries()) == 1 and cluster.bindings == [("default", "p1", "n1")]
    assert [h.pod_key for h in app.ext.gate.holders("n1")] == ["default/p1"]  # its own hand-off, until the receipt


def test_the_gate_wait_is_cut_to_what_the_deadline_leaves(run: Callable[..., Running], cluster: FakeGateway) -> None:
    """p0 is in hand-off on n1; p1's bind may wait for it only as long as the calls after the wait still fit."""
    cluster.put(Kind.POD, make_pod("p0", gpu_request(tflops=10_000, vram=GI)))
    app = run(bind_timeout=BOUND, handoff_wait=0.4)
    assert app.post("/bind", bind_body("p0", "n1")) == {"Error": ""}
    deadline = app.ext.binder.deadline()
    time.sleep(0.2)  # as if the request had waited for a worker thread: 0.4 s left, 0.2 s of it for the wait
    start = time.monotonic()
    with pytest.raises(BindError, match="still handing GPUs over to pod default/p0") as failed:
        app.ext.binder.bind(ExtenderBindingArgs(**bind_body("p1", "n1")), deadline)
    waited = time.monotonic() - start
    assert failed.value.stage == "gate"
    assert 0.15 < waited < 0.35, f"waited {waited:.2f}s for the gate (handoff_wait 0.4 s, the deadline left 0.2 s)"
