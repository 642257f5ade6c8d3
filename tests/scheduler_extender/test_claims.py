"""A node's claims: what a replica counts beside its ledger, what it drops and when, the contract on the Lease,
and two replicas over one fake API server where one stalls between its claim and its Binding."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from scheduler_extender.arbiter import Arbiter, ClaimFailed
from scheduler_extender.cache import GONE, ClusterCache
from scheduler_extender.claim_board import ClaimBoard, ClaimsContended, ClaimsUnreadable, lease_name
from scheduler_extender.claims import after_reading, counted_beside, settle
from scheduler_extender.gateway import Kind
from scheduler_extender.handoff import HandoffGate
from scheduler_extender.objects import PodRef, pod_record
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_bind import allocation, bind_body
from tests.scheduler_extender.test_cache import allocated_pod, grant
from tests.scheduler_extender.test_metrics import metric
from vgpu.contract import claims as claims_contract
from vgpu.contract.claims import Claim, NodeClaims
from vgpu.names import CLAIMS_ANNOTATION

NODE = "n1"


def claim(name: str, version: int, index: int = 0, *, at: float = 100.0) -> Claim:
    return Claim(pod_uid=f"uid-default-{name}", pod=f"default/{name}", version=version, gpus=(grant(NODE, index),),
                 slots=1, at=at)  # fmt: skip


def record(name: str, version: int, index: int = 0, *, node: str | None = NODE) -> Any:
    pod = allocated_pod(name, NODE, grant(NODE, index))
    pod["metadata"]["resourceVersion"] = str(version)
    if node is None:
        del pod["spec"]["nodeName"]
    return pod_record(pod)


def test_the_contract_reads_back_what_it_wrote() -> None:
    board = NodeClaims(node=NODE, horizon=41, claims=(claim("a", 7), claim("b", 9, 1, at=1.5)))
    assert claims_contract.decode(claims_contract.encode(board)) == board


def test_counted_beside_the_ledger_only_what_it_does_not_show() -> None:
    board = NodeClaims(node=NODE, claims=(claim("own", 5), claim("seen", 6), claim("past", 7), claim("new", 8)))
    counted = {"uid-default-seen": (grant(NODE, 0),)}  # the ledger holds it with its very grants
    records = {"uid-default-past": record("past", 9, index=1)}  # the pod moved past the claim without its grants
    kept = counted_beside(board, "uid-default-own", counted, records, {})
    assert [c.pod for c in kept] == ["default/new"]
    # a pod without GPUs the cache shows past the claim's version (a status write): its Binding was refused
    assert counted_beside(board, "uid-default-own", counted, records, {"uid-default-new": 9}) == ()
    # a pod the cache shows at the claim's own version with other grants: the claim may still land
    records = {"uid-default-past": record("past", 7, index=1)}
    assert [c.pod for c in counted_beside(board, "uid-default-own", counted, records, {})] == [
        "default/past",
        "default/new",
    ]


def test_settle_drops_what_the_cache_has_settled_and_raises_the_horizon() -> None:
    board = NodeClaims(node=NODE, horizon=3, claims=(
        claim("landed", 5), claim("past", 6), claim("mine", 4), claim("fresh", 8), claim("stale", 9, at=10.0),
    ))  # fmt: skip
    records = {"uid-default-landed": record("landed", 12), "uid-default-past": record("past", 11, index=1)}
    mine = claim("mine", 10, index=1, at=100.0)
    settled = settle(board, mine, records, {"uid-default-fresh": 8}, now=100.0, stale_after=11.0)
    assert [(c.pod, c.version) for c in settled.board.claims] == [
        ("default/fresh", 8), ("default/stale", 9), ("default/mine", 10),
    ]  # fmt: skip
    assert settled.board.horizon == 12  # the landed claim's pod as this replica's cache shows it
    assert [c.pod for c in settled.check] == ["default/stale"]


def test_a_stale_claim_is_settled_by_reading_its_pod() -> None:
    stale = claim("x", 9)
    board = NodeClaims(node=NODE, horizon=3, claims=(stale,))
    pending = make_pod("x", gpu_request())
    pending["metadata"]["resourceVersion"] = "9"
    assert after_reading(board, stale, pending) == board  # still at its version: its Binding may land
    pending["metadata"]["resourceVersion"] = "10"
    assert after_reading(board, stale, pending).claims == ()  # moved on: its Binding can never land
    assert after_reading(board, stale, None).claims == ()  # gone
    bound = allocated_pod("x", NODE, grant(NODE, 0))
    bound["metadata"]["resourceVersion"] = "15"
    landed = after_reading(board, stale, bound)
    assert landed.claims == () and landed.horizon == 15


def test_a_claims_lease_that_cannot_be_read_places_nothing(fake: FakeGateway) -> None:
    fake.leases[("ns", lease_name(NODE))] = {
        "metadata": {"name": lease_name(NODE), "resourceVersion": "3",
                     "annotations": {CLAIMS_ANNOTATION: '{"version": "v9"}'}},
    }  # fmt: skip
    with pytest.raises(ClaimsUnreadable, match=f"Lease ns/{lease_name(NODE)} is unreadable"):
        ClaimBoard(fake, "ns", "me", clock=time.time).read(NODE, timeout=1.0)
    assert lease_name("n" * 250).startswith("tf-gpu-claims.") and len(lease_name("n" * 250)) <= 253


def test_a_replica_whose_pod_watch_is_behind_the_horizon_waits_then_backs_off(fake: FakeGateway) -> None:
    cache = ClusterCache(default_pool="default-pool", gate=HandoffGate(ttl=60))
    cache.replace(Kind.NODE, [make_node(NODE, gpus=1)])
    fake.add_claim("ns", claim("x", 5), NODE)
    board = ClaimBoard(fake, "ns", "me", clock=time.time)
    ticks = iter(range(100))
    arbiter = Arbiter(board, cache, fake, lambda: 20, stale_after=11.0, clock=time.time, monotonic=lambda: next(ticks))
    lease = fake.leases[("ns", lease_name(NODE))]
    text = claims_contract.encode(NodeClaims(node=NODE, horizon=30, claims=()))
    lease["metadata"]["annotations"][CLAIMS_ANNOTATION] = text
    decided: list[tuple[Claim, ...]] = []

    def decide(claims: tuple[Claim, ...]) -> tuple[None, tuple[Any, ...], int]:
        decided.append(claims)
        return None, (grant(NODE, 0),), 1

    with pytest.raises(ClaimFailed, match=r"pod watch \(resourceVersion 20\) is behind .* \(30\)") as failed:
        arbiter.claim(NODE, PodRef(namespace="default", name="p", uid="uid-p"), 7, decide, lambda: None, lambda _: 5.0)
    assert failed.value.stage == "conflict" and decided == []  # nothing placed from a cache that is behind


@pytest.fixture
def one_gpu(fake: FakeGateway) -> FakeGateway:
    """One GPU with room for three 100-TFLOPS pods."""
    fake.auto_receipt = True
    fake.put(Kind.NODE, make_node(NODE, gpus=1))
    for name in ("a1", "b1", "b2", "b3"):
        fake.put(Kind.POD, make_pod(name, gpu_request(tflops=100_000, vram=4 * GI)))
    return fake


def test_a_replica_stalled_between_its_claim_and_its_binding_is_counted_by_the_other(
    run: Callable[..., Running], one_gpu: FakeGateway
) -> None:
    """Replica A claims a1's room and stalls before its Binding (its watch and its API calls frozen, as a
    SIGSTOPped process); replica B then binds b1..b3 onto the same GPU. B counts A's claim, so only two of
    them fit; A resumes, and a1's Binding lands. Never more than the GPU holds."""
    stalled, resume = threading.Event(), threading.Event()
    real_bind = one_gpu.bind

    def bind(namespace: str, name: str, uid: str, node: str, **kw: Any) -> None:
        if name == "a1":
            stalled.set()
            resume.wait(10)
        real_bind(namespace, name, uid, node, **kw)

    one_gpu.bind = bind  # type: ignore[method-assign]
    a, b = run(bind_timeout=30.0, handoff_wait=5.0), run()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(a.post, "/bind", bind_body("a1", NODE))
        assert stalled.wait(5)
        errors = [b.post("/bind", bind_body(name, NODE))["Error"] for name in ("b1", "b2", "b3")]
        resume.set()
        assert first.result(10) == {"Error": ""}
    assert errors[:2] == ["", ""] and "no longer fits on n1" in errors[2], errors
    bound = [n for n in ("a1", "b1", "b2", "b3") if one_gpu.pod("default", n)["spec"].get("nodeName")]
    assert bound == ["a1", "b1", "b2"]
    promised = sum(g.tflops_request for n in bound if (alloc := allocation(one_gpu, n)) for g in alloc.gpus)
    assert promised == 300_000
    for app in (a, b):
        app.settle()
        wait_for(lambda app=app: len(app.ext.cache.entries()) == 3, what="both ledgers counting the three")  # type: ignore[misc]
        assert app.ext.cache.conflicts() == {}


def test_a_claims_lease_deleted_since_it_was_read_is_read_again(fake: FakeGateway) -> None:
    board = ClaimBoard(fake, "ns", "me", clock=time.time)
    assert board.current(NODE, timeout=1.0) == NodeClaims(node=NODE)
    board.write(NodeClaims(node=NODE, claims=(claim("a", 3),)), timeout=1.0)
    del fake.leases[("ns", lease_name(NODE))]  # an operator deleted it
    with pytest.raises(ClaimsContended):
        board.write(NodeClaims(node=NODE, claims=(claim("a", 3), claim("b", 4))), timeout=1.0)
    assert board.read(NODE, timeout=1.0) == NodeClaims(node=NODE)
    board.write(NodeClaims(node=NODE, claims=(claim("b", 4),)), timeout=1.0)
    assert [c.pod for c in board.read(NODE, timeout=1.0).claims] == ["default/b"]


def test_claims_that_can_never_land_stop_holding_room(run: Callable[..., Running], fake: FakeGateway) -> None:
    """Room for two 150-TFLOPS pods. A stale claim for a pod that no longer exists is read and dropped, so p1
    binds; a fresh claim for pending p2 holds the other place until p2 moves past the version it names (a status
    write, as kube-scheduler's after a failed bind), which the watch shows: then p3 binds there."""
    fake.put(Kind.NODE, make_node(NODE, gpus=1))
    for name in ("p1", "p2", "p3"):
        fake.put(Kind.POD, make_pod(name, gpu_request(tflops=150_000, vram=4 * GI)))
    p2_version = int(fake.pod("default", "p2")["metadata"]["resourceVersion"])
    big = (replace(grant(NODE, 0), tflops_request=150_000, tflops_limit=150_000),)
    ghost = Claim(pod_uid="uid-default-ghost", pod="default/ghost", version=1, gpus=big, slots=1, at=0.0)
    waiting = Claim(pod_uid="uid-default-p2", pod="default/p2", version=p2_version, gpus=big, slots=1, at=time.time())
    fake.add_claim("default", ghost, NODE)
    fake.add_claim("default", waiting, NODE)
    app = run()
    assert app.post("/bind", bind_body("p1", NODE)) == {"Error": ""}
    fake.write_receipt("default", "p1")
    app.settle()
    assert "no longer fits on n1" in app.post("/bind", bind_body("p3", NODE))["Error"]
    fake.write_status("default", "p2", {"conditions": [{"type": "PodScheduled", "status": "False"}]})
    app.settle()
    assert app.post("/bind", bind_body("p3", NODE)) == {"Error": ""}
    board = claims_contract.decode(
        fake.leases[("default", lease_name(NODE))]["metadata"]["annotations"][claims_contract.KEY]
    )
    assert [c.pod for c in board.claims] == ["default/p3"]  # the ghost's and p2's dropped, p1's landed and seen
    assert metric(app, "tf_extender_claims_total", result="stale-read") == 1  # the ghost's pod, read once


def test_a_claim_for_a_pod_the_watch_saw_deleted_holds_no_room_and_is_not_read(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    """A bind retried by kube-scheduler answers 409 "yet the pod is bound there" and leaves a fresh claim; the pod
    is deleted before any write settles it. A UID is never reused, so the claim can never land: the next bind
    on the node places beside it at once, reading nothing (before, it held the room until stale, a bind's
    timeout later: a failover e2e lost a pod that way)."""
    fake.put(Kind.NODE, make_node(NODE, gpus=1))
    for name in ("gone", "p1"):
        fake.put(Kind.POD, make_pod(name, gpu_request(tflops=200_000, vram=4 * GI)))
    big = (replace(grant(NODE, 0), tflops_request=200_000, tflops_limit=200_000),)
    version = int(fake.pod("default", "gone")["metadata"]["resourceVersion"])
    fake.add_claim("default", Claim(pod_uid="uid-default-gone", pod="default/gone", version=version, gpus=big,
                                    slots=1, at=time.time()), NODE)  # fmt: skip
    app = run()
    app.settle()
    assert "no longer fits on n1" in app.post("/bind", bind_body("p1", NODE))["Error"]  # live: it holds the room
    fake.delete(Kind.POD, "default/gone")
    app.settle()
    assert app.ext.cache.pod_version("uid-default-gone") == GONE
    assert app.post("/bind", bind_body("p1", NODE)) == {"Error": ""}
    assert metric(app, "tf_extender_claims_total", result="stale-read") == 0
    board = claims_contract.decode(
        fake.leases[("default", lease_name(NODE))]["metadata"]["annotations"][claims_contract.KEY]
    )
    assert [c.pod for c in board.claims] == ["default/p1"]


def test_a_relist_remembers_the_pods_it_no_longer_shows_as_gone() -> None:
    cache = ClusterCache(default_pool="default-pool", gate=HandoffGate(ttl=60.0))
    pods = [make_pod(name, gpu_request()) for name in ("stays", "goes")]
    cache.replace(Kind.POD, pods)
    assert cache.pod_version("uid-default-goes") is not None
    cache.replace(Kind.POD, pods[:1])  # deleted while the watch was down
    assert cache.pod_version("uid-default-goes") == GONE
    assert cache.pod_version("uid-default-stays") not in (None, GONE)
    assert cache.pod_version("uid-default-never") is None
