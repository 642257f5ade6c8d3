"""bind through the HTTP API: the claim and the Binding carrying the allocation, nothing left behind by a
failing step, no over-commit under concurrent binds, and a restarted extender rebuilding the same ledger
from pods alone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from scheduler_extender.claim_board import lease_name
from scheduler_extender.gateway import Kind
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tf_shell.kube.api import GatewayError
from vgpu.contract import allocation as allocation_contract
from vgpu.contract import claims as claims_contract
from vgpu.names import LABEL_ALLOCATED_NODE, SystemAnnotation


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


def test_a_bind_that_cannot_claim_its_gpus_undoes_itself(run: Callable[..., Running], cluster: FakeGateway) -> None:
    """Without its claim on the node the placement is unconfirmed (another replica may be writing beside it)."""
    app = run()
    cluster.fail["lease"] = GatewayError("etcdserver: request timed out", 504)
    error = app.post("/bind", bind_body("p1", "n1"))["Error"]
    assert "pod default/p1 was not placed on n1: could not claim the GPUs on node n1" in error
    assert allocation(cluster, "p1") is None and cluster.bindings == [] and cluster.calls == []
    app.settle()
    assert app.ext.cache.entry("default/p1") is None and app.ext.gate.holders("n1") == ()


def claims_on(fake: FakeGateway, node: str) -> claims_contract.NodeClaims:
    lease = fake.leases[("default", lease_name(node))]  # the extender's namespace outside a pod
    return claims_contract.decode(lease["metadata"]["annotations"][claims_contract.KEY])


def claim_calls(fake: FakeGateway) -> list[str]:
    """The calls on claims Leases (not the leader election's)."""
    return [c for c in fake.lease_calls if "gpu-claims" in c]


def test_one_write_binds_and_grants_after_the_claim(run: Callable[..., Running], cluster: FakeGateway) -> None:
    """The claim on the node's Lease, then one pod write: the Binding, carrying the allocation and the node label,
    conditional on the resourceVersion the pod was placed at."""
    version = cluster.pod("default", "p1")["metadata"]["resourceVersion"]
    app = run()
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    alloc = allocation(cluster, "p1")
    assert alloc is not None and alloc.node == "n1" and alloc.pod_uid == "uid-default-p1"
    assert [(g.tflops_request, g.vram_request) for g in alloc.gpus] == [(30_000, 6 * GI)]
    assert cluster.calls == ["bind default/p1 n1"]
    assert claim_calls(cluster) == ["get tf-gpu-claims.n1", "create tf-gpu-claims.n1"]
    bound = cluster.pod("default", "p1")
    assert bound["spec"]["nodeName"] == "n1" and bound["metadata"]["labels"][LABEL_ALLOCATED_NODE] == "n1"
    [claim] = claims_on(cluster, "n1").claims
    assert (claim.pod, claim.version, claim.gpus) == ("default/p1", int(version), alloc.gpus)
    entry = app.ext.cache.entry("default/p1")
    assert entry is not None and entry.state == "committed" and entry.grants == alloc.gpus
    # The next bind there needs no read of the Lease, and drops the claim its cache has seen land.
    cluster.put(Kind.POD, make_pod("p2", gpu_request(tflops=30_000, vram=6 * GI)))
    cluster.write_receipt("default", "p1")  # the node's gate opens
    bound = cluster.pod("default", "p1")
    app.settle()
    assert app.post("/bind", bind_body("p2", "n1")) == {"Error": ""}
    assert claim_calls(cluster)[2:] == ["update tf-gpu-claims.n1"]
    board = claims_on(cluster, "n1")
    assert [c.pod for c in board.claims] == ["default/p2"] and board.horizon == int(
        bound["metadata"]["resourceVersion"]
    )


def test_a_binding_refused_for_a_stale_resource_version_binds_from_a_fresh_read(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    """A status write moved the pod on between the read and the Binding: the 409 leaves the pod unbound and
    unallocated, so the bind places and claims again for the pod as it is now."""
    app = run()
    real_bind = cluster.bind

    def bind(*args: Any, **kw: Any) -> None:
        if len(cluster.calls) == 0:
            cluster.write_status("default", "p1", {"conditions": [{"type": "PodScheduled", "status": "False"}]})
        real_bind(*args, **kw)

    cluster.bind = bind  # type: ignore[method-assign]
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    assert cluster.calls == ["bind default/p1 n1", "bind default/p1 n1"]
    versions = [c.version for c in claims_on(cluster, "n1").claims]
    assert len(versions) == 1  # the first claim, for a version the pod has left, dropped by the second
    assert versions[0] < int(cluster.pod("default", "p1")["metadata"]["resourceVersion"])
    app.settle()
    assert len(app.ext.cache.entries()) == 1


@pytest.mark.parametrize(("failing", "stage"), [("lease", "could not claim the GPUs"), ("bind", "could not bind pod")])
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
    assert cluster.calls == ["bind default/p1 n1"]  # and nothing else
    alloc = allocation(cluster, "p1")
    entry = app.ext.cache.entry("default/p1")
    assert alloc is not None and entry is not None and entry.state == "committed" and entry.grants == alloc.gpus
    app.settle()
    assert [h.pod_key for h in app.ext.gate.holders("n1")] == ["default/p1"]  # in hand-off until its receipt


def test_binding_that_timed_out_and_did_not_happen_leaves_nothing(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    app = run()
    error = GatewayError("bind pod default/p1 to n1: ReadTimeoutError: read timed out")
    cluster.fail["bind"] = error
    reply = app.post("/bind", bind_body("p1", "n1"))
    assert reply["Error"] == f"could not bind pod default/p1 to n1: {error}"
    assert cluster.calls == ["bind default/p1 n1"]  # nothing to undo on the pod
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
    assert reads == ["p1", "p1"] and cluster.calls == ["bind default/p1 n1"]
    app.settle()
    assert allocation(cluster, "p1") is None and cluster.bindings == []
    assert app.ext.cache.entry("default/p1") is not None  # held: the Binding may still land
    assert [h.pod_key for h in app.ext.gate.holders("n1")] == ["default/p1"]  # it may still get bound there
    # The Binding did not land: the scheduler's next bind gives the hold back and binds afresh.
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    assert cluster.calls == ["bind default/p1 n1", "bind default/p1 n1"]
    app.settle()
    entry, alloc = app.ext.cache.entry("default/p1"), allocation(cluster, "p1")
    assert alloc is not None and entry is not None and entry.state == "committed" and entry.grants == alloc.gpus
    assert len(app.ext.cache.entries()) == 1 and cluster.bindings == [("default", "p1", "n1")]


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


@pytest.mark.parametrize("indices", [None, (3, 1, 0)], ids=["by index", "in gpu-indices order"])
def test_a_pod_asking_gpus_per_container_is_granted_their_sum_split_among_them(
    run: Callable[..., Running], fake: FakeGateway, indices: tuple[int, ...] | None
) -> None:
    """container-gpu-count {"pre": 1, "inference": 2}: 3 GPUs, the first of them (by index, or as gpu-indices
    lists them) to pre, the next two to inference."""
    fake.put(Kind.NODE, make_node("n1", gpus=4))
    counts = (("pre", 1), ("inference", 2))
    request = replace(gpu_request(count=3, gpu_indices=indices), containers=("pre", "inference"))
    fake.put(Kind.POD, make_pod("split", replace(request, container_gpu_counts=counts)))
    assert run().post("/bind", bind_body("split", "n1")) == {"Error": ""}
    alloc = allocation(fake, "split")
    assert alloc is not None and len(alloc.gpus) == 3
    order = indices or sorted(g.index for g in alloc.gpus)
    uuid = {g.index: g.uuid for g in alloc.gpus}
    assert alloc.container_gpus == (("pre", (uuid[order[0]],)), ("inference", (uuid[order[1]], uuid[order[2]])))


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
    cluster.fail["lease"] = GatewayError("x", 500)
    app.post("/bind", bind_body("p1", "n1"))
    app.post("/bind", bind_body("p1", "n1"))
    text = app.client.get("/metrics").text
    assert 'tf_extender_binds_total{result="claim"} 1.0' in text
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
    """An extender of the earlier protocol died between writing the allocation and posting the Binding; the
    retry must not stick: its Binding replaces the allocation."""
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
    assert fake.calls == ["bind default/p1 n1"]
