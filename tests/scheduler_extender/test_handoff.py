"""The per-node hand-off gate: one pod in hand-off per node and Allocate size; waits end on receipt, deletion,
finish or TTL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from scheduler_extender.gateway import Kind
from scheduler_extender.handoff import GateBusy, HandoffGate
from scheduler_extender.objects import PodRecord, PodRef
from tests.scheduler_extender.conftest import Running
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.names import RESOURCE_VGPU, Qos
from vgpu.request import GpuRequest

GRANT = GpuGrant(uuid="g", index=0, tflops_request=1, tflops_limit=1, vram_request=1, vram_limit=1, gpu_tflops=1)


def record(
    uid: str,
    *,
    node: str = "n1",
    receipt: bool = False,
    phase: str = "Pending",
    deleting: bool = False,
    bound_at: float | None = None,
    allocated: bool = True,
    sizes: frozenset[int] = frozenset(),
    admitted: bool = False,
) -> PodRecord:
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(bound_at if bound_at is not None else time.time()))
    alloc = PodAllocation(
        pod_uid=uid, node=node, pool="p", qos=Qos.MEDIUM, containers=("main",), gpus=(GRANT,), bound_at=at
    )
    return PodRecord(
        ref=PodRef(namespace="default", name=uid, uid=uid),
        node_name=node,
        phase=phase,
        deleting=deleting,
        allocation=alloc if allocated else None,
        allocation_error=None,
        receipt=receipt,
        admitted=admitted,
        allocate_sizes=sizes,
    )


def acquire_in_thread(
    gate: HandoffGate, uid: str, wait: float, sizes: frozenset[int] = frozenset()
) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def target() -> None:
        try:
            out.append(gate.acquire("n1", uid, f"default/{uid}", wait, sizes))
        except GateBusy as exc:
            out.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


@pytest.mark.parametrize(
    "release",
    [
        pytest.param(lambda g: g.observe(record("a", receipt=True)), id="receipt"),
        pytest.param(lambda g: g.observe(record("a", admitted=True)), id="admitted-by-the-kubelet"),
        pytest.param(lambda g: g.forget("a"), id="deleted"),
        pytest.param(lambda g: g.observe(record("a", deleting=True)), id="terminating"),
        pytest.param(lambda g: g.observe(record("a", phase="Failed")), id="failed"),
        pytest.param(lambda g: g.observe(record("a", phase="Succeeded")), id="succeeded"),
        pytest.param(lambda g: g.observe(record("a", allocated=False)), id="allocation-removed"),
    ],
)
def test_waiting_bind_proceeds_as_soon_as_the_holder_is_released(release: Callable[[HandoffGate], None]) -> None:
    gate = HandoffGate(ttl=60)
    gate.observe(record("a"))
    thread, out = acquire_in_thread(gate, "b", wait=5)
    time.sleep(0.1)
    assert thread.is_alive() and not out  # waiting
    released_at = time.monotonic()
    release(gate)
    thread.join(2)
    assert out and isinstance(out[0], float) and 0.05 < out[0] < 1.0
    assert time.monotonic() - released_at < 0.5  # event-driven, not polled
    assert [h.uid for h in gate.holders("n1")] == ["b"]


def test_wait_is_bounded_and_names_the_holder() -> None:
    gate = HandoffGate(ttl=60)
    gate.observe(record("a"))
    start = time.monotonic()
    with pytest.raises(GateBusy, match=r"handing GPUs over to pod default/a .* gave up after 0\.2"):
        gate.acquire("n1", "b", "default/b", 0.2)
    assert 0.2 <= time.monotonic() - start < 1.0
    assert [h.uid for h in gate.holders("n1")] == ["a"]


def test_ttl_counted_from_bound_at_releases_a_stuck_holder() -> None:
    gate = HandoffGate(ttl=0.5)
    gate.observe(record("a", bound_at=time.time() - 0.2))  # second resolution: held ~0.2-1.2 s more at most
    waited = gate.acquire("n1", "b", "default/b", wait=3)
    assert waited < 1.3
    assert [h.uid for h in gate.holders("n1")] == ["b"]


def test_other_nodes_and_the_same_pod_are_not_blocked() -> None:
    gate = HandoffGate(ttl=60)
    gate.observe(record("a"))
    assert gate.acquire("n2", "b", "default/b", 0.01) < 0.01
    assert gate.acquire("n1", "a", "default/a", 0.01) < 0.01  # a retried bind of the holder itself


def test_busy_nodes_are_those_another_pod_holds_within_the_ttl() -> None:
    now = [1000.0]
    gate = HandoffGate(ttl=60, clock=lambda: now[0])
    gate.observe(record("a", node="n1", bound_at=now[0]))
    now[0] += 30
    gate.acquire("n2", "b", "default/b", 0)
    assert gate.busy_nodes("c") == {"n1", "n2"}
    assert gate.busy_nodes("a") == {"n2"}  # a pod's own hold does not make its node busy for it
    now[0] += 40
    assert gate.busy_nodes("c") == {"n2"}  # a's hold is past the TTL


def test_an_in_flight_bind_is_not_released_by_a_stale_event() -> None:
    gate = HandoffGate(ttl=60)
    gate.acquire("n1", "a", "default/a", 0.01)
    gate.observe(record("a", allocated=False))  # an older event of the pod, before our patch landed
    with pytest.raises(GateBusy):
        gate.acquire("n1", "b", "default/b", 0.05)
    gate.release("n1", "a")
    assert gate.acquire("n1", "b", "default/b", 0.05) < 0.05


def test_relist_rebuilds_observed_holds_and_keeps_binds_in_flight() -> None:
    gate = HandoffGate(ttl=60)
    gate.observe(record("old"))
    gate.acquire("n2", "flying", "default/flying", 0.01)
    gate.replace([record("new", node="n3")])
    assert gate.holders("n1") == ()
    assert [h.uid for h in gate.holders("n2")] == ["flying"]
    assert [h.uid for h in gate.holders("n3")] == ["new"]


ONE, TWO = frozenset({1}), frozenset({2})


def test_pods_of_disjoint_allocate_sizes_hand_over_at_once_and_equal_sizes_wait() -> None:
    """The device plugin tells a 1-device Allocate from a 2-device one: such pods share a node's gate."""
    gate = HandoffGate(ttl=60)
    gate.observe(record("a", sizes=ONE))
    assert gate.acquire("n1", "b", "default/b", 0.01, TWO) < 0.01
    assert sorted(h.uid for h in gate.holders("n1")) == ["a", "b"]
    for sizes in (ONE, frozenset({1, 2}), frozenset({2, 3}), frozenset()):  # shares a size, or unknown
        with pytest.raises(GateBusy):
            gate.acquire("n1", "c", "default/c", 0.01, sizes)
    assert gate.acquire("n1", "c", "default/c", 0.01, frozenset({3})) < 0.01
    assert gate.shared() == 2  # b beside a, c beside a and b; the refused tries count nothing
    assert gate.busy_nodes("d", ONE) == {"n1"} and gate.busy_nodes("d", frozenset({4})) == set()


def test_binds_of_one_size_take_a_node_gate_in_the_order_they_came() -> None:
    """A late bind never overtakes an early one, which would otherwise give up into the scheduler's backoff."""
    gate = HandoffGate(ttl=60)
    gate.observe(record("a", sizes=ONE))
    order: list[str] = []
    workers = []
    for uid in ("b", "c", "d"):
        worker = threading.Thread(target=lambda u=uid: (gate.acquire("n1", u, f"default/{u}", 3, ONE), order.append(u)))
        worker.start()
        workers.append(worker)
        time.sleep(0.05)  # arrival order b, c, d
    other = gate.acquire("n1", "e", "default/e", 0.01, TWO)  # another size neither waits nor overtakes them
    assert other < 0.01 and order == []
    holder = "a"
    for expected in ("b", "c", "d"):
        gate.observe(record(holder, sizes=ONE, receipt=True))
        deadline = time.monotonic() + 2
        while len(order) < ("b", "c", "d").index(expected) + 1:
            assert time.monotonic() < deadline, order
            time.sleep(0.01)
        gate.observe(record(expected, sizes=ONE))  # the bind's pod, bound: it holds the gate now
        holder = expected
    for worker in workers:
        worker.join(2)
    assert order == ["b", "c", "d"]


def test_a_bind_behind_a_waiting_bind_of_a_shared_size_waits_for_it_and_names_it() -> None:
    """c (2 devices) could hand over beside a (1), but b (1 or 2) came first and waits for a: c waits behind b."""
    gate = HandoffGate(ttl=60)
    gate.observe(record("a", sizes=ONE))
    waiting, out = acquire_in_thread(gate, "b", 1.0, frozenset({1, 2}))
    time.sleep(0.05)
    with pytest.raises(GateBusy, match="still awaited by the bind of pod default/b, which came first"):
        gate.acquire("n1", "c", "default/c", 0.05, TWO)
    waiting.join(2)
    assert isinstance(out[0], GateBusy)  # b gave up too (a kept the gate): nobody is ahead of c now
    assert gate.acquire("n1", "c", "default/c", 0.01, TWO) < 0.01


def test_a_pod_of_unknown_sizes_holds_the_gate_against_every_size() -> None:
    gate = HandoffGate(ttl=60)
    gate.observe(record("a"))  # a pod whose containers ask no vGPU count the extender can read
    for sizes in (ONE, TWO, frozenset()):
        with pytest.raises(GateBusy):
            gate.acquire("n1", "b", "default/b", 0.01, sizes)
    assert gate.busy_nodes("b", TWO) == {"n1"}


def test_a_waiting_bind_proceeds_when_the_pod_of_its_size_hands_over_while_another_size_still_holds() -> None:
    gate = HandoffGate(ttl=60)
    gate.observe(record("a", sizes=ONE))
    gate.observe(record("b", sizes=TWO))
    waiting: list[object] = []
    worker = threading.Thread(target=lambda: waiting.append(gate.acquire("n1", "c", "default/c", 3, ONE)))
    worker.start()
    time.sleep(0.1)
    gate.observe(record("b", sizes=TWO, receipt=True))  # the other size: c still waits
    time.sleep(0.1)
    assert not waiting
    gate.observe(record("a", sizes=ONE, receipt=True))
    worker.join(2)
    assert len(waiting) == 1 and isinstance(waiting[0], float)
    assert [h.uid for h in gate.holders("n1")] == ["c"]


def test_a_one_gpu_and_a_two_gpu_pod_bind_to_one_node_without_waiting_for_each_other(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2, vram=16 * GI))
    fake.put(Kind.POD, vgpu_pod("one", gpu_request(vram=GI), 1))
    fake.put(Kind.POD, vgpu_pod("two", gpu_request(vram=GI, count=2), 2))
    fake.put(Kind.POD, vgpu_pod("three", gpu_request(vram=GI), 1))
    app = run(handoff_wait=0.3)
    for name in ("one", "two"):
        reply = app.post(
            "/bind", {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-default-{name}", "Node": "n1"}
        )
        assert reply == {"Error": ""}, (name, reply)
    assert sorted(h.pod_key for h in app.ext.gate.holders("n1")) == ["default/one", "default/two"]
    assert "tf_extender_handoff_gates_shared_total 1.0" in app.client.get("/metrics").text
    reply = app.post(
        "/bind", {"PodName": "three", "PodNamespace": "default", "PodUID": "uid-default-three", "Node": "n1"}
    )
    assert "still handing GPUs over to pod default/one" in reply["Error"]  # the same size as one: it waits


def vgpu_pod(name: str, request: GpuRequest, devices: int) -> dict[str, object]:
    """A pod whose container asks the kubelet for ``devices`` vGPU IDs, as the webhook makes it."""
    pod = make_pod(name, request)
    pod["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE_VGPU: str(devices)}}
    return pod


@pytest.mark.parametrize(
    "hand_over",
    [
        pytest.param(lambda fake: fake.write_receipt("default", "a"), id="the-device-plugins-receipt"),
        # status.startTime is the kubelet's: it admitted the pod, so its Allocates are over, whatever the
        # device plugin's receipt is doing.
        pytest.param(
            lambda fake: fake.write_status("default", "a", {"phase": "Pending", "startTime": "2026-01-01T00:00:00Z"}),
            id="the-kubelets-first-status-write",
        ),
    ],
)
def test_second_bind_on_a_node_waits_until_the_first_pod_is_handed_over(
    run: Callable[..., Running],
    fake: FakeGateway,
    hand_over: Callable[[FakeGateway], None],
    request: pytest.FixtureRequest,
) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2, vram=16 * GI))
    for name in ("a", "b"):
        fake.put(Kind.POD, make_pod(name, gpu_request(vram=GI)))
    app = run(handoff_wait=4.0)
    assert app.post("/bind", {"PodName": "a", "PodNamespace": "default", "PodUID": "uid-default-a", "Node": "n1"}) == {
        "Error": ""
    }
    replies: list[dict[str, str]] = []
    thread = threading.Thread(
        target=lambda: replies.append(
            app.post("/bind", {"PodName": "b", "PodNamespace": "default", "PodUID": "uid-default-b", "Node": "n1"})
        )
    )
    thread.start()
    time.sleep(0.3)
    assert not replies  # b waits while a is in hand-off
    hand_over(fake)
    thread.join(3)
    assert replies == [{"Error": ""}]
    text = app.client.get("/metrics").text
    assert "tf_extender_bind_gate_wait_seconds_count 2.0" in text
    assert 'tf_extender_bind_gate_wait_seconds_bucket{le="0.1"} 1.0' in text  # b waited ≥ 0.3 s
    receipt = "handoff" in str(fake.objects[Kind.POD]["default/a"]["metadata"]["annotations"])
    assert receipt is (request.node.callspec.id == "the-device-plugins-receipt")  # the kubelet's write alone did


def test_bind_gives_up_with_a_clear_error_after_handoff_wait(run: Callable[..., Running], fake: FakeGateway) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2, vram=16 * GI))
    for name in ("a", "b"):
        fake.put(Kind.POD, make_pod(name, gpu_request(vram=GI)))
    app = run(handoff_wait=0.3)
    app.post("/bind", {"PodName": "a", "PodNamespace": "default", "PodUID": "uid-default-a", "Node": "n1"})
    reply = app.post("/bind", {"PodName": "b", "PodNamespace": "default", "PodUID": "uid-default-b", "Node": "n1"})
    assert "node n1 is still handing GPUs over to pod default/a" in reply["Error"]
    assert app.ext.cache.entry("default/b") is None
    assert 'tf_extender_binds_total{result="gate"} 1.0' in app.client.get("/metrics").text


@pytest.mark.parametrize(
    "delete",
    [
        pytest.param(lambda g: g.forget("a"), id="deleted"),
        pytest.param(lambda g: g.observe(record("a", deleting=True)), id="terminating"),
    ],
)
def test_a_holder_deleted_before_its_receipt_keeps_the_gate_for_the_grace(
    delete: Callable[[HandoffGate], None],
) -> None:
    """The kubelet may still be admitting the deleted pod; a successor must not meet its Allocate."""
    gate = HandoffGate(ttl=60, deletion_grace=0.4)
    gate.observe(record("a"))
    delete(gate)
    delete(gate)  # repeated deletion events do not extend the grace
    start = time.monotonic()
    waited = gate.acquire("n1", "b", "default/b", wait=3)
    assert 0.3 < waited < 1.0 and time.monotonic() - start < 1.0
    assert [h.uid for h in gate.holders("n1")] == ["b"]


def test_a_receipt_or_a_finished_pod_still_releases_at_once_with_a_grace() -> None:
    for release in (record("a", receipt=True), record("a", phase="Failed")):
        gate = HandoffGate(ttl=60, deletion_grace=5)
        gate.observe(record("a"))
        gate.observe(release)
        assert gate.acquire("n1", "b", "default/b", wait=0.1) < 0.1


def test_an_unbound_pod_with_an_allocation_does_not_hold_the_gate() -> None:
    """The orphan of a bind that died before its Binding: the kubelet cannot be admitting it."""
    gate = HandoffGate(ttl=60)
    orphan = record("a")
    gate.observe(PodRecord(**{**{f: getattr(orphan, f) for f in PodRecord.__dataclass_fields__}, "node_name": None}))
    assert gate.holders("n1") == ()
    gate.observe(record("a"))  # once bound, it holds the gate until its receipt
    assert [h.uid for h in gate.holders("n1")] == ["a"]
