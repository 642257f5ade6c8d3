"""bind through the HTTP API: the allocation and the Binding, rollback on every failing step, no over-commit
under concurrent binds, and a restarted extender rebuilding the same ledger from pods alone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from scheduler_extender.gateway import Kind
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tf_shell.kube.api import GatewayError
from vgpu.contract import allocation as allocation_contract
from vgpu.names import SystemAnnotation


def bind_body(name: str, node: str, namespace: str = "default") -> dict[str, str]:
    return {"PodName": name, "PodNamespace": namespace, "PodUID": f"uid-{namespace}-{name}", "Node": node}


def allocation(fake: FakeGateway, name: str) -> allocation_contract.PodAllocation | None:
    raw = fake.pod("default", name)["metadata"]["annotations"].get(SystemAnnotation.ALLOCATION)
    return None if raw is None else allocation_contract.decode(raw)


@pytest.fixture
def cluster(fake: FakeGateway) -> FakeGateway:
    fake.put(Kind.NODE, make_node("n1", gpus=2, vram=16 * GI, tflops=100_000))
    fake.put(Kind.POD, make_pod("p1", gpu_request(tflops=30_000, vram=6 * GI)))
    return fake


def test_a_bind_that_cannot_list_its_nodes_allocations_undoes_itself(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    """Without the consistent list the placement is unconfirmed (another replica may have written beside it)."""
    app = run()
    cluster.fail["list-pods"] = GatewayError("etcdserver: request timed out", 504)
    error = app.post("/bind", bind_body("p1", "n1"))["Error"]
    assert "could not list the allocations on n1 to confirm the placement of pod default/p1" in error
    assert allocation(cluster, "p1") is None and cluster.bindings == []
    app.settle()
    assert app.ext.cache.entry("default/p1") is None and app.ext.gate.holders("n1") == ()
    assert cluster.pod("default", "p1")["metadata"]["labels"]["tensor-fusion.ai/allocated-node"] == "n1"


def test_bind_records_allocation_then_binds_and_commits(run: Callable[..., Running], cluster: FakeGateway) -> None:
    app = run()
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    alloc = allocation(cluster, "p1")
    assert alloc is not None and alloc.node == "n1" and alloc.pod_uid == "uid-default-p1"
    assert [(g.tflops_request, g.vram_request) for g in alloc.gpus] == [(30_000, 6 * GI)]
    assert cluster.calls == [
        "patch default/p1 ['tensor-fusion.ai/allocation']",
        "list pods tensor-fusion.ai/allocated-node=n1",
        "bind default/p1 n1",
    ]
    entry = app.ext.cache.entry("default/p1")
    assert entry is not None and entry.state == "committed" and entry.grants == alloc.gpus


@pytest.mark.parametrize(
    ("failing", "stage"), [("patch", "could not record the GPU allocation"), ("bind", "could not bind pod")]
)
def test_failed_step_leaves_no_reservation_no_annotation_no_gate(
    run: Callable[..., Running], cluster: FakeGateway, failing: str, stage: str
) -> None:
    app = run()
    cluster.fail[failing] = GatewayError("boom", 500)
    reply = app.post("/bind", bind_body("p1", "n1"))
    assert stage in reply["Error"] and "boom" in reply["Error"]
    app.settle()
    assert allocation(cluster, "p1") is None
    assert app.ext.cache.entries() == {}
    assert app.ext.gate.holders("n1") == ()
    assert cluster.bindings == []
    assert sum(g.vram_used for g in app.ext.cache.node("n1").gpus) == 0  # type: ignore[union-attr]
    # and the pod can be bound on the next attempt
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}


AMBIGUOUS = [
    pytest.param(GatewayError("bind pod default/p1 to n1: ReadTimeoutError: read timed out"), id="timeout"),
    pytest.param(GatewayError("Operation cannot be fulfilled: pod p1 is already assigned", 409), id="conflict"),
]


@pytest.mark.parametrize("error", AMBIGUOUS)
def test_binding_committed_despite_a_failed_answer_keeps_the_allocation(
    run: Callable[..., Running], cluster: FakeGateway, error: GatewayError
) -> None:
    """The API server bound the pod but the answer was a timeout or a conflict: the bind happened."""
    app = run()
    cluster.lost_bind_answer = error
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    assert cluster.bindings == [("default", "p1", "n1")]
    assert cluster.calls == [
        "patch default/p1 ['tensor-fusion.ai/allocation']",
        "list pods tensor-fusion.ai/allocated-node=n1",
        "bind default/p1 n1",
    ]  # no undo
    alloc = allocation(cluster, "p1")
    entry = app.ext.cache.entry("default/p1")
    assert alloc is not None and entry is not None and entry.state == "committed" and entry.grants == alloc.gpus
    app.settle()
    assert [h.pod_key for h in app.ext.gate.holders("n1")] == ["default/p1"]  # in hand-off until its receipt


@pytest.mark.parametrize("error", AMBIGUOUS)
def test_binding_that_failed_ambiguously_and_did_not_happen_is_rolled_back(
    run: Callable[..., Running], cluster: FakeGateway, error: GatewayError
) -> None:
    app = run()
    cluster.fail["bind"] = error
    reply = app.post("/bind", bind_body("p1", "n1"))
    assert reply["Error"] == f"could not bind pod default/p1 to n1: {error}"
    assert cluster.calls[-1] == "patch default/p1 ['tensor-fusion.ai/allocation']"  # the undo
    app.settle()
    assert allocation(cluster, "p1") is None and cluster.bindings == []
    assert app.ext.cache.entries() == {} and app.ext.gate.holders("n1") == ()


def test_binding_whose_outcome_cannot_be_read_back_keeps_the_allocation_for_the_next_bind(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    """The Binding POST got no answer and the pod cannot be re-read: the Binding may still land, and a bound
    pod without its allocation would get no GPUs. So nothing is undone; the next bind of the pod settles it."""
    app = run()
    real_get = cluster.get_pod
    reads: list[str] = []

    def get_pod(namespace: str, name: str, *, timeout: float | None = None) -> Any:
        reads.append(name)
        if len(reads) == 2:  # the binder's first read (the pod to bind) succeeds; the re-read does not
            raise GatewayError("api down", 503)
        return real_get(namespace, name, timeout=timeout)

    cluster.get_pod = get_pod  # type: ignore[method-assign]
    cluster.fail["bind"] = GatewayError("read timed out")
    error = app.post("/bind", bind_body("p1", "n1"))["Error"]
    assert "read timed out" in error and "could not be read back, so nothing is undone" in error
    assert reads == ["p1", "p1"] and cluster.calls[-1] == "bind default/p1 n1"  # no undo
    app.settle()
    assert allocation(cluster, "p1") is not None and cluster.bindings == []
    assert app.ext.cache.entry("default/p1") is not None  # counted while the allocation is on the pod
    assert [h.pod_key for h in app.ext.gate.holders("n1")] == ["default/p1"]  # it may still get bound there
    # The Binding did not land: the scheduler's next bind removes the allocation, then binds afresh.
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    assert cluster.calls[-4:] == [
        "patch default/p1 ['tensor-fusion.ai/allocation']",
        "patch default/p1 ['tensor-fusion.ai/allocation']",
        "list pods tensor-fusion.ai/allocated-node=n1",
        "bind default/p1 n1",
    ]
    app.settle()
    entry, alloc = app.ext.cache.entry("default/p1"), allocation(cluster, "p1")
    assert alloc is not None and entry is not None and entry.state == "committed" and entry.grants == alloc.gpus
    assert len(app.ext.cache.entries()) == 1 and cluster.bindings == [("default", "p1", "n1")]


def test_rollback_reports_when_removing_the_annotation_fails_too(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    app = run()
    cluster.fail["bind"] = GatewayError("refused", 409)
    cluster.fail["unpatch"] = GatewayError("api down", 503)
    reply = app.post("/bind", bind_body("p1", "n1"))
    assert "refused" in reply["Error"] and "removing its allocation annotation failed" in reply["Error"]
    # The allocation is still written on the pod, so it still counts, from the pod (never forgotten).
    app.settle()
    assert allocation(cluster, "p1") is not None
    assert app.ext.cache.entry("default/p1") is not None
    assert app.ext.gate.holders("n1") == ()  # the pod is not bound, so it holds no hand-off gate


def test_pod_that_no_longer_fits_gets_the_reason(run: Callable[..., Running], cluster: FakeGateway) -> None:
    cluster.put(Kind.POD, make_pod("big", gpu_request(vram=40 * GI)))
    app = run()
    reply = app.post("/bind", bind_body("big", "n1"))
    assert "no longer fits on n1" in reply["Error"] and "VRAM" in reply["Error"]
    assert app.ext.gate.holders("n1") == () and app.ext.cache.entries() == {}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**bind_body("p1", "n1"), "PodUID": "other"}, "has UID uid-default-p1, not other"),
        (bind_body("ghost", "n1"), "does not exist"),
        ({"PodName": "p1"}, "must carry PodName"),
        (bind_body("p1", "n9"), "unknown to the GPU extender"),
    ],
)
def test_bad_bind_requests_are_errors(
    run: Callable[..., Running], cluster: FakeGateway, body: dict[str, Any], message: str
) -> None:
    app = run()
    assert message in app.post("/bind", body)["Error"]
    assert cluster.bindings == [] and app.ext.cache.entries() == {}


def test_pod_without_gpu_request_is_bound_plainly(run: Callable[..., Running], cluster: FakeGateway) -> None:
    cluster.put(Kind.POD, make_pod("web"))
    app = run()
    assert app.post("/bind", bind_body("web", "n1")) == {"Error": ""}
    assert cluster.bindings == [("default", "web", "n1")] and allocation(cluster, "web") is None


@pytest.mark.parametrize("error", AMBIGUOUS)
def test_plain_pod_bound_despite_a_failed_answer_is_a_success(
    run: Callable[..., Running], cluster: FakeGateway, error: GatewayError
) -> None:
    cluster.put(Kind.POD, make_pod("web"))
    app = run()
    cluster.lost_bind_answer = error
    assert app.post("/bind", bind_body("web", "n1")) == {"Error": ""}
    assert cluster.bindings == [("default", "web", "n1")]
    cluster.fail["bind"] = error  # a Binding that really failed is still reported
    cluster.put(Kind.POD, make_pod("api"))
    assert app.post("/bind", bind_body("api", "n1")) == {"Error": f"could not bind pod default/api to n1: {error}"}


def test_retried_bind_after_lost_answer_is_success(run: Callable[..., Running], cluster: FakeGateway) -> None:
    app = run()
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    app.settle()
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    assert len(cluster.bindings) == 1
    assert "already bound to n1" in app.post("/bind", bind_body("p1", "n2"))["Error"]


def test_concurrent_binds_never_over_commit(run: Callable[..., Running], fake: FakeGateway) -> None:
    """24 pods of 6Gi race for 2 nodes × 2 GPUs × 16Gi (room for 8): at most 8 bind, the rest leave no trace."""
    fake.auto_receipt = True  # the device plugin confirms at once, so the gate only serialises
    for node in ("n1", "n2"):
        fake.put(Kind.NODE, make_node(node, gpus=2, vram=16 * GI, tflops=100_000))
    names = [f"p{i}" for i in range(24)]
    for name in names:
        fake.put(Kind.POD, make_pod(name, gpu_request(tflops=10_000, vram=6 * GI)))
    app = run(handoff_wait=3.0)
    barrier = threading.Barrier(12)

    def bind(i_name: tuple[int, str]) -> str:
        i, name = i_name
        if i < 12:
            barrier.wait()
        reply: dict[str, str] = app.post("/bind", bind_body(name, "n1" if i % 2 else "n2"))
        return reply["Error"]

    with ThreadPoolExecutor(12) as pool:
        errors = list(pool.map(bind, enumerate(names)))
    app.settle()
    bound = [n for n, e in zip(names, errors, strict=True) if not e]
    assert len(bound) == 8
    assert all("no longer fits" in e or "cannot reserve" in e for e in errors if e)
    for node in ("n1", "n2"):
        for gpu in app.ext.cache.node(node).gpus:  # type: ignore[union-attr]
            assert gpu.vram_used <= gpu.vram and gpu.tflops_used <= gpu.tflops
    assert set(app.ext.cache.entries()) == {f"default/{n}" for n in bound}
    for name in names:
        assert (allocation(fake, name) is not None) == (name in bound)
    assert sorted(n for _, n, _ in fake.bindings) == sorted(bound)


def test_restart_rebuilds_the_ledger_from_pods_alone(run: Callable[..., Running], fake: FakeGateway) -> None:
    fake.auto_receipt = True
    fake.put(Kind.NODE, make_node("n1", gpus=2, vram=16 * GI))
    for i in range(5):
        fake.put(Kind.POD, make_pod(f"p{i}", gpu_request(vram=5 * GI)))
    first = run()
    for i in range(5):
        first.post("/bind", bind_body(f"p{i}", "n1"))
    first.settle()
    before = first.ext.cache.entries()
    assert len(before) == 5 and all(e.state == "committed" for e in before.values())
    second = run()  # a new process: nothing shared but the API server
    wait_for(lambda: second.ext.cache.entries() == before, what="ledger rebuild")
    assert second.ext.cache.node("n1") == first.ext.cache.node("n1")
    assert second.ext.gate.holders("n1") == ()  # every pod has its receipt


def test_bind_metrics_count_outcomes_and_gate_waits(run: Callable[..., Running], cluster: FakeGateway) -> None:
    app = run()
    cluster.fail["patch"] = GatewayError("x", 500)
    app.post("/bind", bind_body("p1", "n1"))
    app.post("/bind", bind_body("p1", "n1"))
    text = app.client.get("/metrics").text
    assert 'tf_extender_binds_total{result="annotate"} 1.0' in text
    assert 'tf_extender_binds_total{result="bound"} 1.0' in text
    assert "tf_extender_bind_gate_wait_seconds_count 1.0" in text


def test_fragmentation_policy_scores_binds_and_learns_from_commits(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    """The benchmark's policy runs in the extender as configured, and learns from every committed bind.

    Its refresh runs on the app's background refresher, not inside a bind."""
    fake.auto_receipt = True  # play the device plugin, so the node's hand-off gate opens after each bind
    fake.put(Kind.NODE, make_node("n1", gpus=8, vram=80 * GI, tflops=300_000))
    fake.put(Kind.NODE, make_node("n2", gpus=8, vram=80 * GI, tflops=300_000))
    names = [f"p{i}" for i in range(8)]  # FIRST_REFRESH committed pods make the policy learn its first mix
    for name in names:
        fake.put(Kind.POD, make_pod(name, gpu_request(tflops=30_000, vram=6 * GI)))
    app = run(policy="fragmentation")
    policy = app.ext.binder.policies.default
    assert policy.name == "fragmentation" and policy.mix == ()  # type: ignore[attr-defined]
    scores = app.post(
        "/prioritize", {"Pod": make_pod("probe", gpu_request(vram=GI)), "Nodes": None, "NodeNames": ["n1", "n2"]}
    )
    assert sorted(s["Host"] for s in scores) == ["n1", "n2"] and all(0 <= s["Score"] <= 10 for s in scores)
    for name in names:
        assert app.post("/bind", bind_body(name, "n1")) == {"Error": ""}
    assert allocation(fake, "p7") is not None
    assert policy.deferred  # type: ignore[attr-defined]
    wait_for(lambda: policy.revision == 1, what="the background refresh")  # type: ignore[attr-defined]
    assert len(policy.mix) == 1  # type: ignore[attr-defined]


def test_a_pod_left_allocated_but_unbound_by_a_dead_extender_binds_on_retry(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    """The extender died between writing the allocation and posting the Binding; the retry must not stick."""
    from tests.scheduler_extender.test_cache import allocated_pod, grant

    fake.put(Kind.NODE, make_node("n1", gpus=1, vram=16 * GI, tflops=100_000))
    orphan = allocated_pod("p1", "n1", grant("n1", 0, 10 * GI), phase="Pending")
    del orphan["spec"]["nodeName"]
    fake.put(Kind.POD, orphan)
    app = run()
    assert app.ext.gate.holders("n1") == ()  # an unbound pod holds no hand-off gate
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    alloc = allocation(fake, "p1")
    assert alloc is not None and alloc.node == "n1" and alloc.bound_at != "2026-01-01T00:00:00Z"  # written afresh
    entry = app.ext.cache.entry("default/p1")
    assert entry is not None and entry.state == "committed" and entry.grants == alloc.gpus
    assert fake.calls[-3:] == [
        "patch default/p1 ['tensor-fusion.ai/allocation']",
        "list pods tensor-fusion.ai/allocated-node=n1",
        "bind default/p1 n1",
    ]
