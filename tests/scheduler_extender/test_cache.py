"""The cluster cache's event → state transitions, and the informer's list/watch/relist loop around it."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from scheduler_extender import feeds
from scheduler_extender.cache import ClusterCache
from scheduler_extender.gateway import Kind
from scheduler_extender.handoff import HandoffGate
from scheduler_extender.objects import PodRef
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tf_shell.kube.api import GatewayError, WatchEvent
from tf_shell.kube.list_watch import Backoff, Informer
from vgpu.contract import allocation as allocation_contract
from vgpu.contract import inventory as inventory_contract
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.names import Qos, SystemAnnotation
from vgpu.scheduling.ledger import LedgerRefusal


def grant(node: str, index: int = 0, vram: int = 4 * GI) -> GpuGrant:
    return GpuGrant(
        uuid=f"GPU-{node}-{index}",
        index=index,
        tflops_request=1000,
        tflops_limit=1000,
        vram_request=vram,
        vram_limit=vram,
        gpu_tflops=312_000,
    )


def allocated_pod(name: str, node: str, *grants: GpuGrant, phase: str = "Running", **kw: Any) -> dict[str, Any]:
    pod = make_pod(name, gpu_request(), **kw)
    uid = pod["metadata"]["uid"]
    alloc = PodAllocation(
        pod_uid=uid,
        node=node,
        pool="default-pool",
        qos=Qos.LOW,
        containers=("main",),
        gpus=grants or (grant(node),),
        bound_at="2026-01-01T00:00:00Z",
    )
    pod["metadata"]["annotations"][SystemAnnotation.ALLOCATION] = allocation_contract.encode(alloc)
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = phase
    return pod


@pytest.fixture
def cache() -> ClusterCache:
    return ClusterCache(default_pool="default-pool", gate=HandoffGate(ttl=60), clock=lambda: 1000.0)


def vram_used(cache: ClusterCache, node: str) -> list[int]:
    view = cache.node(node)
    assert view is not None
    return [g.vram_used for g in view.gpus]


def test_allocations_from_pods_are_committed_on_their_gpus(cache: ClusterCache) -> None:
    cache.replace(Kind.NODE, [make_node("n1"), make_node("n2")])
    cache.replace(Kind.POD, [allocated_pod("a", "n1"), allocated_pod("b", "n1", grant("n1", 1, 8 * GI)), make_pod("x")])
    assert vram_used(cache, "n1") == [4 * GI, 8 * GI] and vram_used(cache, "n2") == [0, 0]
    assert {k: e.state.value for k, e in cache.entries().items()} == {
        "default/a": "committed",
        "default/b": "committed",
    }


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: {**p, "status": {"phase": "Succeeded"}}, id="succeeded"),
        pytest.param(lambda p: {**p, "status": {"phase": "Failed"}}, id="failed"),
        pytest.param(lambda p: {**p, "metadata": {**p["metadata"], "annotations": {}}}, id="allocation-removed"),
    ],
)
def test_finished_or_unallocated_pods_give_their_gpus_back(cache: ClusterCache, change: Any) -> None:
    cache.replace(Kind.NODE, [make_node("n1")])
    pod = allocated_pod("a", "n1")
    cache.apply(Kind.POD, WatchEvent("ADDED", pod))
    assert vram_used(cache, "n1") == [4 * GI, 0]
    cache.apply(Kind.POD, WatchEvent("MODIFIED", change(pod)))
    assert vram_used(cache, "n1") == [0, 0] and cache.entries() == {}


def test_deleted_pod_releases_only_its_own_entry(cache: ClusterCache) -> None:
    cache.replace(Kind.NODE, [make_node("n1")])
    old = allocated_pod("a", "n1", uid="old")
    cache.apply(Kind.POD, WatchEvent("ADDED", old))
    new = allocated_pod("a", "n1", grant("n1", 1), uid="new")  # same name, recreated (a StatefulSet pod)
    cache.apply(Kind.POD, WatchEvent("ADDED", new))
    cache.apply(Kind.POD, WatchEvent("DELETED", old))
    assert vram_used(cache, "n1") == [0, 4 * GI]


def test_terminating_pod_still_holds_gpus_until_gone(cache: ClusterCache) -> None:
    cache.replace(Kind.NODE, [make_node("n1")])
    pod = allocated_pod("a", "n1")
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    cache.apply(Kind.POD, WatchEvent("ADDED", pod))
    assert vram_used(cache, "n1") == [4 * GI, 0]
    assert cache.gate.holders("n1") == ()  # but it no longer holds the hand-off gate


def test_pod_seen_before_its_node_is_accounted_when_the_node_arrives(cache: ClusterCache) -> None:
    cache.replace(Kind.POD, [allocated_pod("a", "n1")])
    assert cache.conflicts()
    cache.apply(Kind.NODE, WatchEvent("ADDED", make_node("n1")))
    assert vram_used(cache, "n1") == [4 * GI, 0] and not cache.conflicts()


def test_allocation_beyond_capacity_is_a_conflict_not_a_crash(cache: ClusterCache) -> None:
    cache.replace(Kind.NODE, [make_node("n1", vram=10 * GI)])
    cache.replace(
        Kind.POD, [allocated_pod("a", "n1", grant("n1", 0, 8 * GI)), allocated_pod("b", "n1", grant("n1", 0, 8 * GI))]
    )
    assert sum(vram_used(cache, "n1")) == 8 * GI
    assert "over-commit" in next(iter(cache.conflicts().values()))


def test_a_pods_vram_limit_is_held_and_written_limits_past_the_gpu_are_counted_not_refused(
    cache: ClusterCache,
) -> None:
    """VRAM is counted as each pod's larger of request and limit. An allocation already written whose limit does
    not fit beside the others' (written before limits were held, or raised by another replica) is still counted
    — only its requests must fit — so the GPU shows no room at all until one goes, instead of the pod counting
    nothing (a conflict)."""
    cache.replace(Kind.NODE, [make_node("n1", gpus=1)])  # 80Gi
    hog = replace(grant("n1", vram=GI), vram_limit=60 * GI)
    neighbour = replace(grant("n1", vram=20 * GI), vram_limit=30 * GI)
    cache.replace(Kind.POD, [allocated_pod("hog", "n1", hog)])
    assert vram_used(cache, "n1") == [60 * GI]
    cache.apply(Kind.POD, WatchEvent("ADDED", allocated_pod("neighbour", "n1", neighbour)))
    assert cache.conflicts() == {} and vram_used(cache, "n1") == [90 * GI]
    with pytest.raises(LedgerRefusal):  # nothing more is placed there
        cache.reserve(PodRef(namespace="default", name="x", uid="ux"), "n1", [grant("n1", vram=1)], qos=Qos.LOW,
                      expires_at=None)  # fmt: skip
    # On the over-committed GPU a limit may still come down (the over-commitment only shrinks), but not go up.
    ref = PodRef(namespace="default", name="neighbour", uid="uid-default-neighbour")
    assert cache.resize(ref, [replace(neighbour, vram_limit=31 * GI)]) is None
    assert cache.resize(ref, [replace(neighbour, vram_limit=25 * GI)]) is not None
    assert vram_used(cache, "n1") == [85 * GI]
    cache.apply(Kind.POD, WatchEvent("DELETED", allocated_pod("hog", "n1", hog)))
    assert vram_used(cache, "n1") == [25 * GI]


@pytest.mark.parametrize(
    ("inventory", "error"),
    [("{not json", "not valid JSON"), ('{"version":"v9"}', "unsupported"), ('{"version":"v1"}', "missing")],
)
def test_corrupt_inventory_becomes_the_nodes_reason(cache: ClusterCache, inventory: str, error: str) -> None:
    cache.apply(Kind.NODE, WatchEvent("ADDED", make_node("n1", inventory=inventory)))
    view = cache.node("n1")
    assert view is not None and view.gpus == () and error in (view.inventory_error or "")


def test_inventory_copied_from_another_node_is_rejected(cache: ClusterCache) -> None:
    node = make_node("n2")
    node["metadata"]["name"] = "n1"
    cache.apply(Kind.NODE, WatchEvent("ADDED", node))
    assert "written for node 'n2'" in (cache.node("n1").inventory_error or "")  # type: ignore[union-attr]


def test_allocation_written_for_another_uid_is_ignored(cache: ClusterCache) -> None:
    cache.replace(Kind.NODE, [make_node("n1")])
    pod = allocated_pod("a", "n1")
    pod["metadata"]["uid"] = "copied"
    cache.apply(Kind.POD, WatchEvent("ADDED", pod))
    assert vram_used(cache, "n1") == [0, 0]


def test_tentative_reservation_counts_until_it_expires_or_is_replaced(cache: ClusterCache) -> None:
    now = [1000.0]
    cache.clock = lambda: now[0]
    cache.replace(Kind.NODE, [make_node("n1")])
    ref = PodRef(namespace="default", name="p", uid="u")
    cache.reserve(ref, "n1", (grant("n1"),), qos=Qos.MEDIUM, expires_at=1030.0)
    assert [g.vram_used for g in cache.snapshot().nodes["n1"].gpus] == [4 * GI, 0]
    cache.reserve(ref, "n1", (grant("n1", 1),), qos=Qos.MEDIUM, expires_at=1030.0)  # a newer guess replaces it
    assert [g.vram_used for g in cache.snapshot().nodes["n1"].gpus] == [0, 4 * GI]
    assert [g.vram_used for g in cache.snapshot(drop_tentative_of="default/p").nodes["n1"].gpus] == [0, 0]
    cache.reserve(ref, "n1", (grant("n1"),), qos=Qos.MEDIUM, expires_at=1030.0)
    now[0] = 1031.0
    assert [g.vram_used for g in cache.snapshot().nodes["n1"].gpus] == [0, 0] and cache.entries() == {}


def test_a_written_allocation_displaces_tentative_reservations(cache: ClusterCache) -> None:
    cache.replace(Kind.NODE, [make_node("n1", vram=6 * GI)])
    cache.reserve(PodRef(namespace="d", name="guess", uid="g"), "n1", (grant("n1"),), qos=Qos.MEDIUM, expires_at=2000.0)
    cache.apply(Kind.POD, WatchEvent("ADDED", allocated_pod("real", "n1")))
    assert set(cache.entries()) == {"default/real"} and not cache.conflicts()


def test_reserve_refuses_over_commit_and_changes_nothing(cache: ClusterCache) -> None:
    cache.replace(Kind.NODE, [make_node("n1", vram=6 * GI)])
    cache.reserve(PodRef(namespace="d", name="a", uid="a"), "n1", (grant("n1"),), qos=Qos.MEDIUM, expires_at=None)
    with pytest.raises(LedgerRefusal):
        cache.reserve(PodRef(namespace="d", name="b", uid="b"), "n1", (grant("n1"),), qos=Qos.MEDIUM, expires_at=None)
    assert set(cache.entries()) == {"d/a"} and vram_used(cache, "n1") == [4 * GI, 0]


def test_node_deleted_and_readded(cache: ClusterCache) -> None:
    cache.replace(Kind.NODE, [make_node("n1")])
    cache.replace(Kind.POD, [allocated_pod("a", "n1")])
    cache.apply(Kind.NODE, WatchEvent("DELETED", make_node("n1")))
    assert cache.node("n1") is None
    cache.apply(Kind.NODE, WatchEvent("ADDED", make_node("n1")))
    assert vram_used(cache, "n1") == [4 * GI, 0]


# --- the informer loop ------------------------------------------------------------------------------
def informer(fake: FakeGateway, cache: ClusterCache, kind: Kind) -> Informer:
    return feeds.informer(fake, kind, cache, watch_timeout=1, backoff_max=0.05, stop=threading.Event())


def test_informer_lists_then_watches_from_the_list_version(cache: ClusterCache) -> None:
    fake = FakeGateway()
    fake.put(Kind.NODE, make_node("n1"))
    loop = informer(fake, cache, Kind.NODE)
    fake.put(Kind.NODE, make_node("n2"))  # after the informer exists, before it lists: in the list
    loop.run(iterations=1)
    assert loop.synced.is_set() and {n.name for n in cache.nodes()} == {"n1", "n2"}
    fake.put(Kind.NODE, make_node("n3"))
    fake.close()
    loop.run(iterations=1)
    assert {n.name for n in cache.nodes()} == {"n1", "n2", "n3"}
    assert loop.resource_version == str(fake.rv)


def test_informer_relists_after_410_gone_and_drops_what_vanished(cache: ClusterCache) -> None:
    fake = FakeGateway()
    fake.put(Kind.NODE, make_node("n1"))
    fake.put(Kind.POD, allocated_pod("a", "n1"))
    nodes, pods = informer(fake, cache, Kind.NODE), informer(fake, cache, Kind.POD)
    fake.close()
    nodes.run(iterations=1)
    pods.run(iterations=1)
    assert cache.entries()
    fake.delete(Kind.POD, "default/a")
    fake.compact()  # the deletion event is lost to history
    pods.run(iterations=1)  # watch → 410
    assert pods.resource_version is None
    pods.run(iterations=1)  # relist
    assert cache.entries() == {} and vram_used(cache, "n1") == [0, 0]


def bind_in_cache(fake: FakeGateway, cache: ClusterCache, name: str) -> None:
    """What the binder does for pod ``name`` on n1: gate, reservation, allocation, Binding, commit."""
    pod = fake.pod("default", name)
    ref = PodRef(namespace="default", name=name, uid=pod["metadata"]["uid"])
    cache.gate.acquire("n1", ref.uid, ref.key, 0)
    cache.reserve(ref, "n1", (grant("n1"),), qos=Qos.MEDIUM, expires_at=None)
    alloc = allocation_contract.decode(
        allocated_pod(name, "n1")["metadata"]["annotations"][SystemAnnotation.ALLOCATION]
    )
    fake.patch_pod_annotations(
        "default", name, ref.uid, {SystemAnnotation.ALLOCATION: allocation_contract.encode(alloc)}
    )
    fake.bind("default", name, ref.uid, "n1")
    cache.commit(ref.key)


def test_relist_releases_what_was_bound_for_pods_that_vanished_unseen(cache: ClusterCache) -> None:
    """A 410 swallowed both the bound pod's allocation and its deletion: the relist must free its GPUs and gate."""
    fake = FakeGateway()
    fake.put(Kind.NODE, make_node("n1"))
    fake.put(Kind.POD, make_pod("p", gpu_request()))
    fake.put(Kind.POD, make_pod("guess", gpu_request()))
    nodes, pods = informer(fake, cache, Kind.NODE), informer(fake, cache, Kind.POD)
    fake.close()
    nodes.run(iterations=1)
    pods.run(iterations=1)
    bind_in_cache(fake, cache, "p")
    guess = PodRef(namespace="default", name="guess", uid="uid-default-guess")  # filter's tentative hold
    cache.reserve(guess, "n1", (grant("n1", 1),), qos=Qos.MEDIUM, expires_at=2000.0)
    assert set(cache.entries()) == {"default/p", "default/guess"} and cache.gate.holders("n1")
    fake.delete(Kind.POD, "default/p")
    fake.delete(Kind.POD, "default/guess")
    fake.compact()  # the allocation, the Binding and the deletions are lost to history
    pods.run(iterations=1)  # watch → 410
    pods.run(iterations=1)  # relist: neither pod exists
    assert cache.entries() == {} and vram_used(cache, "n1") == [0, 0]
    assert cache.gate.holders("n1") == ()


@pytest.mark.parametrize(
    "listed",
    [
        pytest.param(make_pod("p", gpu_request()), id="allocation-removed"),
        pytest.param(allocated_pod("p", "n1", phase="Succeeded"), id="finished"),
    ],
)
def test_relist_releases_a_bound_pod_the_list_shows_holding_no_gpus(cache: ClusterCache, listed: Any) -> None:
    cache.replace(Kind.NODE, [make_node("n1")])
    ref = PodRef(namespace="default", name="p", uid="uid-default-p")
    cache.reserve(ref, "n1", (grant("n1"),), qos=Qos.MEDIUM, expires_at=None)
    cache.commit(ref.key)  # a bind whose pod's events the 410 swallowed
    cache.replace(Kind.POD, [listed])
    assert cache.entries() == {} and vram_used(cache, "n1") == [0, 0]


def test_relist_keeps_binds_in_flight_and_binds_newer_than_the_list(cache: ClusterCache) -> None:
    """A bind still running owns its reservation (it undoes it itself when its pod is gone); a pod bound
    after the LIST was taken is simply not in it yet."""
    fake = FakeGateway()
    fake.put(Kind.NODE, make_node("n1", vram=80 * GI))
    fake.put(Kind.POD, make_pod("running", gpu_request()))
    nodes, pods = informer(fake, cache, Kind.NODE), informer(fake, cache, Kind.POD)
    fake.close()
    nodes.run(iterations=1)
    pods.run(iterations=1)
    running = PodRef(namespace="default", name="running", uid="uid-default-running")
    cache.reserve(running, "n1", (grant("n1", 1),), qos=Qos.MEDIUM, expires_at=None)  # bind between steps
    fake.delete(Kind.POD, "default/running")  # meanwhile; its next API call will fail and undo it
    real_list = fake.list

    def list_then_bind(kind: Kind) -> Any:
        listing = real_list(kind)  # the API server's snapshot, taken before "late" exists
        if kind is Kind.POD:
            fake.put(Kind.POD, make_pod("late", gpu_request()))
            bind_in_cache(fake, cache, "late")
        return listing

    fake.list = list_then_bind  # type: ignore[method-assign]
    fake.compact()
    pods.run(iterations=1)  # 410
    pods.run(iterations=1)  # relist, then the watch from the list's version
    assert set(cache.entries()) == {"default/running", "default/late"}
    assert cache.entries()["default/running"].state == "reserved"
    assert cache.entries()["default/late"].state == "committed" and vram_used(cache, "n1") == [4 * GI, 4 * GI]
    assert [h.pod_key for h in cache.gate.holders("n1")] == ["default/late"]


def test_informer_backs_off_and_resumes_after_errors(cache: ClusterCache) -> None:
    fake = FakeGateway()
    fake.put(Kind.NODE, make_node("n1"))
    errors: list[str] = []
    loop = feeds.informer(
        fake,
        Kind.NODE,
        cache,
        watch_timeout=1,
        backoff_max=0.05,
        stop=threading.Event(),
        on_error=lambda kind, reason: errors.append(reason),
    )
    fake.fail["list-Node"] = GatewayError("unavailable", 503)
    fake.close()
    loop.run(iterations=1)
    assert errors == ["HTTP 503"] and not loop.synced.is_set()
    loop.run(iterations=1)
    assert loop.synced.is_set() and cache.node("n1") is not None


def test_backoff_doubles_to_a_cap_and_resets() -> None:
    backoff = Backoff(maximum=2.0, initial=0.5)
    assert [backoff.next() for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]
    backoff.reset()
    assert backoff.next() == 0.5


def test_a_gpu_in_mig_mode_is_never_offered_for_sharing(cache: ClusterCache) -> None:
    # Sharing it would hand containers the parent UUID, which gives them no usable CUDA device.
    node = make_node("n1", gpus=2)
    inv = inventory_contract.decode(node["metadata"]["annotations"][inventory_contract.KEY])
    mig = replace(inv, gpus=(replace(inv.gpus[0], mig=True), inv.gpus[1]))
    node["metadata"]["annotations"][inventory_contract.KEY] = inventory_contract.encode(mig)
    cache.apply(Kind.NODE, WatchEvent("ADDED", node))
    view = cache.node("n1")
    assert view is not None
    assert [(g.uuid, g.healthy) for g in view.gpus] == [("GPU-n1-0", False), ("GPU-n1-1", True)]


def test_an_unbound_pods_own_allocation_is_room_for_that_pod_only(cache: ClusterCache) -> None:
    """A crashed extender replica wrote p's allocation and never posted its Binding: the GPU it names
    stays counted for every other pod, but p itself, scheduled again, finds its own room there."""
    cache.replace(Kind.NODE, [make_node("n", gpus=1, vram=8 * GI)])
    stale = allocated_pod("p", "n", grant("n", 0, 8 * GI))
    del stale["spec"]["nodeName"]
    stale["status"]["phase"] = "Pending"
    cache.replace(Kind.POD, [stale])
    p = PodRef(namespace="default", name="p", uid="uid-default-p")
    other = PodRef(namespace="default", name="q", uid="uid-default-q")
    free = {who.name: cache.snapshot(scheduling=who).nodes["n"].gpus[0].vram_free for who in (p, other)}
    assert free == {"p": 8 * GI, "q": 0}
    assert cache.node("n") is not None and cache.node("n").gpus[0].vram_free == 0  # type: ignore[union-attr]


def test_an_allocation_that_did_not_fit_is_counted_once_its_room_is_freed(cache: ClusterCache) -> None:
    """Another replica's allocation arrives while this replica's bind holds the same room: it cannot be
    counted then. Once the hold goes (the bind backed off), it is — else placements keep offering a room
    the API server shows taken, and the bind that takes it backs off for ever."""
    cache.replace(Kind.NODE, [make_node("n", gpus=1, vram=8 * GI)])
    cache.replace(Kind.POD, [])
    hold = PodRef(namespace="default", name="mine", uid="uid-default-mine")
    cache.reserve(hold, "n", [grant("n", 0, 8 * GI)], qos=Qos.MEDIUM, expires_at=None)  # a bind's hold
    cache.apply(Kind.POD, WatchEvent("ADDED", allocated_pod("theirs", "n", grant("n", 0, 8 * GI))))
    assert "uid-default-theirs" in cache.conflicts()
    cache.release(hold.key, hold.uid)  # the bind backed off
    assert not cache.conflicts()
    assert vram_used(cache, "n") == [8 * GI] and set(cache.entries()) == {"default/theirs"}
