"""The throughput benchmark's cases are what its table claims: B plain, A one shape, C all different, W bound
by hand with the extender's bind calls, and the scheduler's client limits are the ones it passes."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from benchmarks.throughput import BY_HAND, NAMESPACE, HandBinder, cases
from scheduler_extender.app import create_app
from scheduler_extender.gateway import Kind
from scheduler_extender.settings import Settings
from tests.e2e import deploy
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_bind import bind_body
from vgpu.contract import allocation
from vgpu.names import LABEL_ALLOCATED_NODE, LABEL_ENABLED, SCHEDULER_NAME, Annotation

SHAPE = (Annotation.TFLOPS_REQUEST, Annotation.VRAM_REQUEST, Annotation.PLACEMENT_POLICY)


def test_b_is_plain_through_our_profile_a_one_shape_c_all_different() -> None:
    build = cases("binpack")
    plain = build["B"]("b-0", 0)
    assert plain["spec"]["schedulerName"] == SCHEDULER_NAME and not plain["metadata"].get("labels")
    for case, distinct in (("A", 1), ("C", 20)):
        pods = [build[case](f"{case}-{i}", i) for i in range(20)]
        assert all(p["metadata"]["labels"][LABEL_ENABLED] == "true" for p in pods)
        shapes = {tuple(p["metadata"]["annotations"][k] for k in SHAPE) for p in pods}
        assert len(shapes) == distinct
        assert {s[2] for s in shapes} == {"binpack"}


def test_the_scheduler_config_takes_the_client_limits_and_keeps_the_rest() -> None:
    shipped = deploy.scheduler_config(Path("/kubeconfig"), 8080)
    raised = deploy.scheduler_config(Path("/kubeconfig"), 8080, (1234.0, 4321))
    assert raised["clientConnection"] == {"kubeconfig": "/kubeconfig", "qps": 1234.0, "burst": 4321}
    assert shipped.pop("clientConnection") == {"kubeconfig": "/kubeconfig", "qps": 1000, "burst": 2000}
    del raised["clientConnection"]
    assert raised == shipped


def test_w_is_bound_by_hand_with_the_calls_of_the_extenders_bind() -> None:
    """Case W measures the extender's bind protocol alone, so its binder must make the same API calls in the
    same order as a real bind of a GPU pod: if the bind changes its calls, W no longer bounds it."""
    fake = FakeGateway()
    fake.put(Kind.NODE, make_node("n1", gpus=2, vram=16 * GI, tflops=100_000))
    fake.put(Kind.POD, make_pod("p1", gpu_request(tflops=10_000, vram=2 * GI)))
    with TestClient(create_app(Settings(handoff_wait=1.0), fake)) as client:
        app = Running(client, fake)
        wait_for(lambda: app.ext.ready, what="informers to sync")
        assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
        wait_for(lambda: fake.events, what="the GpuGranted event")
    extender_calls, extender_events = [c.split()[0] for c in fake.calls], [e.reason for e in fake.events]
    extender_claims = [c.split()[0] for c in fake.lease_calls if "gpu-claims" in c]
    fake.close()

    by_hand = FakeGateway()
    pod = cases("binpack")["W"]("w-0", 0)
    assert pod["spec"]["schedulerName"] == BY_HAND and not pod["metadata"].get("labels")
    pod["metadata"] |= {"namespace": NAMESPACE, "uid": "uid-w-0"}
    binder = HandBinder(by_hand, nodes=3)
    binder.give(by_hand.put(Kind.POD, pod))
    binder.stop()
    assert not binder.failures
    assert [c.split()[0] for c in by_hand.lease_calls] == extender_claims == ["get", "create"]
    assert [c.split()[0] for c in by_hand.calls] == extender_calls == ["bind"]
    assert [e.reason for e in by_hand.events] == extender_events == ["GpuGranted"]
    bound = by_hand.pod(NAMESPACE, "w-0")
    granted = allocation.decode(bound["metadata"]["annotations"][allocation.KEY])
    assert bound["spec"]["nodeName"] == granted.node == "bench-00000"
    assert bound["metadata"]["labels"] == {LABEL_ALLOCATED_NODE: "bench-00000"}


def test_w_leaves_out_only_the_calls_it_is_told_to_price() -> None:
    for without, claims, events in (({"event"}, 2, 0), ({"claim"}, 0, 1)):
        fake = FakeGateway()
        pod = cases("binpack")["W"]("w-0", 0)
        pod["metadata"] |= {"namespace": NAMESPACE, "uid": "uid-w-0"}
        binder = HandBinder(fake, nodes=1, without=frozenset(without))
        binder.give(fake.put(Kind.POD, pod))
        binder.stop()
        assert not binder.failures
        assert (fake.calls, len(fake.lease_calls), len(fake.events)) == (
            [f"bind {NAMESPACE}/w-0 bench-00000"],
            claims,
            events,
        )
        assert fake.pod(NAMESPACE, "w-0")["spec"]["nodeName"] == "bench-00000"
