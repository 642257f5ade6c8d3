"""Two extender replicas (two apps, two caches) binding over one fake API server.

A rolling restart or a leader change leaves the old kube-scheduler's binds running beside the new
one's, so both replicas may bind the same pod, or different pods onto one node. The loser must back
off without undoing the winner: every pod bound once, with exactly one allocation ever written on it
(by its Binding), and both ledgers counting that allocation; and the node's claims Lease orders two
placements on one node, so no GPU is promised twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler_extender.app import create_app
from scheduler_extender.binder import CLOCK_SLACK
from scheduler_extender.gateway import Kind
from scheduler_extender.settings import Settings
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_bind import allocation, bind_body
from tests.scheduler_extender.test_metrics import metric
from tf_shell.kube.api import RawObject, WatchEvent
from vgpu.contract import allocation as allocation_contract
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.contract.claims import Claim
from vgpu.names import Qos, SystemAnnotation
from vgpu.timefmt import rfc3339

ALLOCATION = SystemAnnotation.ALLOCATION.value


@pytest.fixture
def fake() -> FakeGateway:
    return FakeGateway(auto_receipt=True)  # the device plugin's receipts free each node's gate at once


def versions(fake: FakeGateway, name: str) -> list[RawObject]:
    """Pod ``name`` as every watch event showed it, in order."""
    return [
        event.object
        for _, kind, event in fake.log
        if kind is Kind.POD and event.object["metadata"]["name"] == name and event.type != "DELETED"
    ]


def history(fake: FakeGateway, name: str) -> list[str | None]:
    """The allocation annotation of pod ``name`` in every watch event, in order."""
    return [pod["metadata"].get("annotations", {}).get(ALLOCATION) for pod in versions(fake, name)]


def assert_one_allocation_never_removed(fake: FakeGateway, name: str) -> None:
    values = history(fake, name)
    written = {v for v in values if v is not None}
    assert len(written) == 1, f"{name}: {len(written)} different allocations written"
    first = values.index(next(iter(written)))
    assert None not in values[first:], f"{name}: its allocation was removed after it was written"


def assert_kept_once_bound(fake: FakeGateway, name: str) -> None:
    """From the change that bound the pod on, its allocation is the one it was bound with, unchanged."""
    events = versions(fake, name)
    bound = next(i for i, pod in enumerate(events) if pod["spec"].get("nodeName"))
    texts = {pod["metadata"].get("annotations", {}).get(ALLOCATION) for pod in events[bound:]}
    assert len(texts) == 1 and None not in texts, f"{name}: its allocation changed after it was bound"


def assert_ledgers_agree(fake: FakeGateway, apps: tuple[Running, ...], names: list[str]) -> None:
    for app in apps:
        app.settle()
        assert app.ext.cache.conflicts() == {}
        for name in names:
            entry, alloc = app.ext.cache.entry(f"default/{name}"), allocation(fake, name)
            assert alloc is not None and entry is not None
            assert (entry.state, entry.node, entry.grants) == ("committed", alloc.node, alloc.gpus)


def other_replicas_allocation(name: str, node: str, written_at: float) -> str:
    return allocation_contract.encode(
        PodAllocation(
            pod_uid=f"uid-default-{name}",
            node=node,
            pool="default-pool",
            qos=Qos.MEDIUM,
            containers=("main",),
            gpus=(
                GpuGrant(
                    uuid=f"GPU-{node}-1",
                    index=1,
                    tflops_request=10_000,
                    tflops_limit=10_000,
                    vram_request=4 * GI,
                    vram_limit=4 * GI,
                    gpu_tflops=312_000,
                ),
            ),
            bound_at=rfc3339(written_at),
        )
    )


@pytest.mark.parametrize("same_node", [True, False], ids=["same-node", "different-nodes"])
def test_both_replicas_binding_every_pod_at_once_bind_each_once_with_one_allocation(
    run: Callable[..., Running], fake: FakeGateway, same_node: bool
) -> None:
    nodes = [f"n{i}" for i in range(6)]
    for node in nodes:
        fake.put(Kind.NODE, make_node(node, gpus=4))
    names = [f"p{i}" for i in range(30)]
    for name in names:
        fake.put(Kind.POD, make_pod(name, gpu_request(tflops=10_000, vram=4 * GI)))
    apps = (run(), run())

    def bind(job: tuple[int, int]) -> str:
        replica, i = job
        node = nodes[(i + (0 if same_node or replica == 0 else 1)) % len(nodes)]
        reply: dict[str, str] = apps[replica].post("/bind", bind_body(names[i], node))
        return reply["Error"]

    with ThreadPoolExecutor(16) as pool:
        errors = list(pool.map(bind, [(r, i) for i in range(len(names)) for r in (0, 1)]))
        # Both replicas may back off one pod each placed on a node the other just placed one on; the
        # scheduler retries such a pod, as here (through either replica).
        for attempt in range(4):
            unbound = [i for i, n in enumerate(names) if not fake.pod("default", n)["spec"].get("nodeName")]
            errors += list(pool.map(bind, [(attempt % 2, i) for i in unbound]))

    assert sorted(n for _, n, _ in fake.bindings) == sorted(names)  # every pod bound exactly once
    for name in names:
        alloc = allocation(fake, name)
        assert alloc is not None and alloc.node == fake.pod("default", name)["spec"]["nodeName"]
        if same_node:  # no two binds on one node at once: nothing is ever written twice
            assert_one_allocation_never_removed(fake, name)
        else:
            assert_kept_once_bound(fake, name)
    allowed = ("another extender is binding", "is already bound", "other extenders", "pod watch", "kept changing")
    assert all(any(a in e for a in allowed) for e in errors if e), [e for e in errors if e]
    assert_ledgers_agree(fake, apps, names)


def test_a_pod_carrying_another_replicas_fresh_allocation_is_left_alone(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2))
    app = run()
    theirs = other_replicas_allocation("p1", "n1", app.ext.binder.clock())
    fake.put(Kind.POD, make_pod("p1", gpu_request(), annotations={ALLOCATION: theirs}))
    app.settle()
    reply = app.post("/bind", bind_body("p1", "n1"))
    assert "another extender is binding pod default/p1" in reply["Error"]
    assert fake.pod("default", "p1")["metadata"]["annotations"][ALLOCATION] == theirs
    assert fake.bindings == []
    app.settle()
    entry = app.ext.cache.entry("default/p1")  # still counted: the other replica's GPUs are taken
    assert entry is not None and entry.state == "committed" and entry.grants[0].uuid == "GPU-n1-1"


def test_an_abandoned_allocation_older_than_any_bind_is_rolled_back_and_the_pod_bound_afresh(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2))
    app = run()
    old = app.ext.binder.clock() - app.ext.settings.bind_timeout - CLOCK_SLACK - 1
    fake.put(
        Kind.POD, make_pod("p1", gpu_request(), annotations={ALLOCATION: other_replicas_allocation("p1", "n1", old)})
    )
    app.settle()
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    alloc = allocation(fake, "p1")
    assert alloc is not None and alloc.bound_at != rfc3339(old) and fake.bindings == [("default", "p1", "n1")]


def test_the_loser_of_the_allocation_write_backs_off_without_undoing_the_winner(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2))
    fake.put(Kind.POD, make_pod("p1", gpu_request()))
    loser, winner = run(), run()
    # The loser reads the pod; before it writes, the winner binds it completely.
    fake.after_get = lambda: winner.post("/bind", bind_body("p1", "n1"))
    reply = loser.post("/bind", bind_body("p1", "n1"))
    assert "another extender is binding pod default/p1" in reply["Error"]
    assert fake.bindings == [("default", "p1", "n1")]
    assert_one_allocation_never_removed(fake, "p1")
    assert_ledgers_agree(fake, (loser, winner), ["p1"])


def test_the_loser_of_the_binding_leaves_the_winners_allocation_and_gate(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2))
    fake.put(Kind.POD, make_pod("p1", gpu_request()))
    fake.auto_receipt = False  # the winner's pod stays in hand-off: it holds n1's gate in both replicas
    loser, winner = run(), run()
    theirs = other_replicas_allocation("p1", "n1", winner.ext.binder.clock())

    def winner_binds() -> None:  # between the loser's write and its Binding: the winner's allocation and Binding
        pod = fake.pod("default", "p1")
        pod["metadata"]["annotations"][ALLOCATION] = theirs
        pod["spec"]["nodeName"] = "n1"
        fake.put(Kind.POD, pod)
        loser.settle()

    real_bind = fake.bind

    def bind_after_the_winner(namespace: str, name: str, uid: str, node: str, **kw: Any) -> None:
        winner_binds()
        real_bind(namespace, name, uid, node, **kw)  # 409: already assigned

    fake.bind = bind_after_the_winner  # type: ignore[method-assign]
    reply = loser.post("/bind", bind_body("p1", "n1"))
    assert "pod default/p1 is already bound to n1 by another extender's bind" in reply["Error"]
    assert fake.pod("default", "p1")["metadata"]["annotations"][ALLOCATION] == theirs
    assert fake.calls == ["bind default/p1 n1"]  # the loser wrote nothing on the pod
    loser.settle()
    assert [h.pod_key for h in loser.ext.gate.holders("n1")] == ["default/p1"]
    entry = loser.ext.cache.entry("default/p1")
    assert entry is not None and entry.state == "committed" and entry.grants[0].uuid == "GPU-n1-1"


def test_a_write_refused_only_for_a_status_update_is_written_again(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2))
    fake.put(Kind.POD, make_pod("p1", gpu_request()))
    app = run()

    def status_update() -> None:
        pod = fake.pod("default", "p1")
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
        fake.put(Kind.POD, pod)

    fake.after_get = status_update
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    assert fake.calls == ["bind default/p1 n1", "bind default/p1 n1"]  # 409 on the version read, then bound
    assert_one_allocation_never_removed(fake, "p1")


RACERS = [f"p{i}" for i in range(8)]  # 100-TFLOPS pods racing for one GPU with room for three


def one_gpu_for_three(fake: FakeGateway) -> None:
    """Node n1 with one GPU (312 TFLOPS), and the eight RACERS, unbound."""
    fake.put(Kind.NODE, make_node("n1", gpus=1))
    for name in RACERS:
        fake.put(Kind.POD, make_pod(name, gpu_request(tflops=100_000, vram=4 * GI)))


def race(fake: FakeGateway, apps: tuple[Running, Running], first: tuple[int, ...] = ()) -> tuple[list[str], list[str]]:
    """Bind RACERS[i] to n1 through replica i % 2: those ``first`` one by one, then all the others at once, then
    the unbound ones again (three rounds, as kube-scheduler retries). Returns the pods bound and every Error."""

    def bind(i: int) -> str:
        reply: dict[str, str] = apps[i % 2].post("/bind", bind_body(RACERS[i], "n1"))
        return reply["Error"]

    errors = [bind(i) for i in first]
    with ThreadPoolExecutor(8) as pool:
        errors += pool.map(bind, [i for i in range(len(RACERS)) if i not in first])
        for _ in range(3):
            unbound = [i for i, n in enumerate(RACERS) if not fake.pod("default", n)["spec"].get("nodeName")]
            errors += pool.map(bind, unbound)
    return [n for n in RACERS if fake.pod("default", n)["spec"].get("nodeName")], errors


def promised_tflops(fake: FakeGateway, pods: list[str]) -> int:
    return sum(g.tflops_request for n in pods if (a := allocation(fake, n)) for g in a.gpus)


def test_two_replicas_placing_different_pods_on_one_full_gpu_never_overcommit_it(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    """One GPU with room for three 100-TFLOPS pods; eight such pods, each sent to one replica, in bursts."""
    one_gpu_for_three(fake)
    apps = (run(), run())
    bound, errors = race(fake, apps)
    assert len(bound) == 3 and promised_tflops(fake, bound) == 300_000, (bound, errors)
    assert all(allocation(fake, n) is None for n in RACERS if n not in bound)
    for app in apps:
        app.settle()
        held = [n for n in RACERS if (e := app.ext.cache.entry(f"default/{n}")) and e.state == "committed"]
        assert sorted(held) == sorted(bound)


def test_a_placement_that_meets_another_replicas_claim_decides_again_beside_it(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    """The other replica binds a 200-TFLOPS pod on the node between this bind's placement and its claim (its
    watch has not shown it yet): this bind's compare-and-swap fails, it reads the node's claims, places again
    beside the other's claim, and binds on the other GPU."""
    fake.put(Kind.NODE, make_node("n1", gpus=2))
    for name in ("mine", "theirs"):
        fake.put(Kind.POD, make_pod(name, gpu_request(tflops=200_000, vram=4 * GI)))
    app, other = run(), run()
    app.settle()
    fake.before_claim = lambda: other.post("/bind", bind_body("theirs", "n1"))
    assert app.post("/bind", bind_body("mine", "n1")) == {"Error": ""}
    mine, theirs = allocation(fake, "mine"), allocation(fake, "theirs")
    assert mine is not None and theirs is not None
    assert {mine.gpus[0].uuid, theirs.gpus[0].uuid} == {"GPU-n1-0", "GPU-n1-1"}
    claims = [c for c in fake.lease_calls if "gpu-claims" in c]
    # mine read (none) and about to create; theirs read (none) and created; mine's create refused, read, updated
    assert claims == [
        "get tf-gpu-claims.n1",
        "create tf-gpu-claims.n1",
        "get tf-gpu-claims.n1",
        "create tf-gpu-claims.n1",
        "get tf-gpu-claims.n1",
        "update tf-gpu-claims.n1",
    ]
    assert_ledgers_agree(fake, (app, other), ["mine", "theirs"])
    claimed = {r: metric(app, "tf_extender_claims_total", result=r) for r in ("written", "contended")}
    assert claimed == {"written": 1, "contended": 1}


def test_a_bind_backs_off_when_a_limit_raise_claimed_meanwhile_leaves_no_room(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    """A VRAM limit is held on the GPU, so a raise is room taken: the other replica's autoscaler claims a raise of
    the hog's VRAM limit while this replica places a neighbour counting the old one. This bind's claim fails its
    compare-and-swap, and placed again beside the raise's claim (limits included) the neighbour no longer fits;
    nothing is written on it."""
    fake.put(Kind.NODE, make_node("n1", gpus=1))  # one 80Gi GPU
    hog_grant = GpuGrant(uuid="GPU-n1-0", index=0, tflops_request=10_000, tflops_limit=10_000, vram_request=GI,
                         vram_limit=GI, gpu_tflops=312_000)  # fmt: skip
    hog = make_pod("hog", gpu_request(vram=GI))
    alloc = PodAllocation(pod_uid="uid-default-hog", node="n1", pool="default-pool", qos=Qos.MEDIUM,
                          containers=("main",), gpus=(hog_grant,), bound_at=rfc3339(0))  # fmt: skip
    hog["metadata"]["annotations"][ALLOCATION] = allocation_contract.encode(alloc)
    hog["spec"]["nodeName"] = "n1"
    version = int(fake.put(Kind.POD, hog)["metadata"]["resourceVersion"])
    fake.put(Kind.POD, make_pod("neighbour", gpu_request(vram=40 * GI)))
    app = run()
    app.settle()
    raised = (replace(hog_grant, vram_limit=70 * GI),)
    claim = Claim(pod_uid="uid-default-hog", pod="default/hog", version=version, gpus=raised, slots=1, at=time.time())
    fake.before_claim = lambda: fake.add_claim("default", claim, "n1")  # the other replica's autoscaler
    error = app.post("/bind", bind_body("neighbour", "n1"))["Error"]
    assert "no longer fits on n1" in error
    assert allocation(fake, "neighbour") is None and fake.bindings == [] and fake.calls == []
    app.settle()
    assert app.ext.cache.entry("default/neighbour") is None and app.ext.gate.holders("n1") == ()


class LaggingGateway:
    """The fake API server as a replica whose pod watch runs ``lag`` seconds behind per event (a slow network, a
    busy process): everything else as the fake answers it."""

    def __init__(self, fake: FakeGateway, lag: float) -> None:
        self._fake, self._lag = fake, lag

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fake, name)

    def watch(self, kind: Kind, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        for event in self._fake.watch(kind, resource_version, timeout_seconds):
            if kind is Kind.POD:
                time.sleep(self._lag)
            yield event


def test_a_replica_whose_pod_watch_lags_never_promises_a_gpu_twice(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    """As the full-GPU race above, with the second replica's pod watch 0.2 s behind on every event: its cache
    misses the other's Bindings for a while, and the claims (and the horizon its watch must reach after the other
    dropped a claim it had seen land) are all that keep it from placing on room already promised."""
    one_gpu_for_three(fake)
    fast = run()
    client = TestClient(create_app(Settings(handoff_wait=1.0), LaggingGateway(fake, 0.2)))  # type: ignore[arg-type]
    with client:
        slow = Running(client, fake)
        wait_for(lambda: slow.ext.ready, timeout=20, what="the lagging replica's informers")
        apps = (fast, slow)
        # The lagging replica binds p1 first: the other drops its claim once it has seen it land.
        bound, errors = race(fake, apps, first=(1,))
        assert errors[0] == "" and "p1" in bound
        assert len(bound) == 3 and promised_tflops(fake, bound) == 300_000, (bound, errors)
        assert all("no longer fits" in e or "pod watch" in e or "other extenders" in e for e in errors if e), errors
        for app in apps:
            wait_for(lambda app=app: app.ext.cache.conflicts() == {}, timeout=20, what="no conflicting allocation")  # type: ignore[misc]
        slow.settle()
        held = [n for n in RACERS if (e := slow.ext.cache.entry(f"default/{n}")) and e.state == "committed"]
        assert sorted(held) == sorted(bound)
