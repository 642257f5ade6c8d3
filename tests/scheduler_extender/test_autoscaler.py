"""The autoscaler controller (scheduler_extender/autoscaler/) over the fake gateway, a real cache and a real
usage collector fed a device plugin's document: what it writes, when it must not, and what the status says."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from scheduler_extender.arbiter import Arbiter
from scheduler_extender.autoscaler.controller import KEEP, AutoscalerController, autoscaler_off, dated, with_autoscaling
from scheduler_extender.cache import ClusterCache
from scheduler_extender.claim_board import ClaimBoard, lease_name
from scheduler_extender.events import EventRecorder
from scheduler_extender.gateway import Kind
from scheduler_extender.handoff import HandoffGate
from scheduler_extender.objects import PodRef
from scheduler_extender.status import Condition, Status
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tf_shell.usage_feed import Target, UsageFeed
from vgpu.contract import allocation as allocation_contract
from vgpu.contract import claims as claims_contract
from vgpu.contract import usage
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.contract.claims import Claim
from vgpu.names import LABEL_ALLOCATED_NODE, LABEL_ENABLED, Annotation, Qos, SystemAnnotation
from vgpu.quantity import parse_milli

NODE = "n1"
AUTO: dict[str, Any] = {
    "autoSetLimits": {
        "enable": True,
        "evaluationPeriod": "1s",
        "maxRatioToRequests": "3.0",
        "targetResource": "tflops",
    },
    "autoSetReplicas": {"enable": True, "evaluationPeriod": "1s", "scaleUpStep": "2", "scaleDownCoolDownTime": "90m"},
}


def auto_pod(
    name: str,
    *,
    auto: dict[str, Any] | None = None,
    owner: str | None = "rs-1",
    limit: int = 20_000,
    vram: tuple[int, int] = (GI, GI),
) -> dict[str, Any]:
    """``vram``: the grant's VRAM (request, limit); the pod was admitted with it."""
    request = gpu_request(10_000, vram[0], tflops_limit=20_000, vram_limit=vram[1], workload="w",
                          auto_scaling=AUTO if auto is None else auto)  # fmt: skip
    pod = make_pod(name, request)
    uid = pod["metadata"]["uid"]
    grant = GpuGrant(uuid=f"GPU-{NODE}-0", index=0, tflops_request=10_000, tflops_limit=limit, vram_request=vram[0],
                     vram_limit=vram[1], gpu_tflops=312_000)  # fmt: skip
    alloc = PodAllocation(pod_uid=uid, node=NODE, pool="default-pool", qos=Qos.MEDIUM, containers=("main",),
                          gpus=(grant,), bound_at="2026-01-01T00:00:00Z")  # fmt: skip
    pod["metadata"]["annotations"][SystemAnnotation.ALLOCATION] = allocation_contract.encode(alloc)
    pod["metadata"]["labels"][LABEL_ALLOCATED_NODE] = NODE
    pod["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    pod["metadata"]["resourceVersion"] = "7"
    if owner:
        pod["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": "rs-uid", "controller": True}
        ]
    pod["spec"]["nodeName"] = NODE
    pod["status"]["phase"] = "Running"
    return pod


def document(pods: list[dict[str, Any]], tflops: int, vram: dict[str, int] | None = None) -> bytes:
    """``vram``: a pod's VRAM use by name (default half a GiB)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    containers = tuple(
        usage.ContainerUsage(
            namespace="default",
            pod=p["metadata"]["name"],
            pod_uid=p["metadata"]["uid"],
            container="main",
            gpu=f"GPU-{NODE}-0",
            tflops_used=tflops,
            vram_used=(vram or {}).get(p["metadata"]["name"], GI // 2),
            tflops_measured=True,
            tflops_request=10_000,
            tflops_limit=20_000,
            vram_request=GI,
            vram_limit=GI,
        )
        for p in pods
    )
    return usage.encode(usage.NodeUsage(node=NODE, sampled_at=now, interval_s=1.0, containers=containers)).encode()


class World:
    """The fake API server, the cache fed from it, and a controller reading one plugin's scripted document."""

    def __init__(self, fake: FakeGateway, pods: list[dict[str, Any]], tflops: int, *, leading: bool = True) -> None:
        self.fake, self.pods, self.tflops, self.leading = fake, pods, tflops, leading
        self.vram: dict[str, int] = {}  # a scripted pod's VRAM use by name (default half a GiB)
        template = {"metadata": {"labels": {LABEL_ENABLED: "true"}, "annotations": {Annotation.WORKLOAD: "w"}}}
        dep_ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "dep", "uid": "dep-uid", "controller": True}
        fake.controllers.setdefault(
            ("ReplicaSet", "default", "rs-1"),
            {
                "metadata": {"name": "rs-1", "uid": "rs-uid", "ownerReferences": [dep_ref]},
                "spec": {"template": template},
            },
        )
        fake.controllers.setdefault(
            ("Deployment", "default", "dep"),
            {"metadata": {"name": "dep", "uid": "dep-uid"}, "spec": {"template": template}},
        )
        for p in pods:
            fake.put(Kind.POD, p)
        self.cache = ClusterCache(default_pool="default-pool", gate=HandoffGate(ttl=60))
        self.cache.replace(Kind.NODE, [make_node(NODE, gpus=1)])
        self.cache.replace(Kind.POD, pods)
        self.events = EventRecorder(fake, interval=0)
        self.registry = CollectorRegistry()
        feed = UsageFeed(
            lambda: [Target(NODE, "http://n1/usage")], lambda _: document(self.pods, self.tflops, self.vram), 1,
            self.registry,
            dated, prefix="tf_autoscaler",
        )  # fmt: skip
        arbiter = Arbiter(
            ClaimBoard(fake, "tf-system", "test", clock=time.time), self.cache, fake, self.cache.seen_version,
            stale_after=11.0, clock=time.time,
        )  # fmt: skip
        self.controller = AutoscalerController(
            fake, self.cache, self.events, feed, arbiter, namespace="tf-system", max_replicas=4, checkpoint_interval=0.01,
            clock=time.time, leading=lambda: self.leading, ready=lambda: True, registry=self.registry,
        )  # fmt: skip

    def tick(self, *, sync: bool = True) -> None:
        """One pass; ``sync``: the cache first takes the API server's pods, as its informer would have."""
        if sync:
            self.cache.replace(Kind.POD, list(self.fake.objects[Kind.POD].values()))
        self.controller.tick()
        self.events.drain()

    def limit(self, name: str) -> int:
        pod = self.fake.pod("default", name)
        return (
            allocation_contract.decode(pod["metadata"]["annotations"][SystemAnnotation.ALLOCATION]).gpus[0].tflops_limit
        )

    def writes(self, what: str, result: str) -> float:
        return self.registry.get_sample_value("tf_autoscaler_writes_total", {"what": what, "result": result}) or 0.0


@pytest.fixture
def fake() -> FakeGateway:
    return FakeGateway()


def test_a_pod_pressing_on_its_limit_gets_it_raised_in_place_with_an_event(fake: FakeGateway) -> None:
    world = World(fake, [auto_pod("a")], tflops=19_900)
    world.tick()
    assert world.limit("a") == 30_000  # pressed on: twice 20, capped at maxRatioToRequests 3 × 10
    assert world.writes("limits", "ok") == 1
    (event,) = [e for e in fake.events if e.pod_name == "a"]
    assert (event.reason, event.type) == ("AtMaxRatio", "Normal")
    assert "GPU GPU-n1-0: tflops limit raised to 30 TFLOPS, capped at maxRatioToRequests 3" in event.message


def test_nothing_is_written_by_a_replica_not_holding_the_lease(fake: FakeGateway) -> None:
    world = World(fake, [auto_pod("a")], tflops=19_900, leading=False)
    world.tick()
    assert world.limit("a") == 20_000 and not fake.hpas and not fake.config_maps and not fake.events
    assert world.controller.report(("default", "w")) is KEEP  # nothing of its own to say: what is written stays


def test_an_allocation_that_moved_since_the_decision_is_left_for_the_next_pass(fake: FakeGateway) -> None:
    world = World(fake, [auto_pod("a")], tflops=19_900)
    fake.put(Kind.POD, auto_pod("a", limit=25_000))  # the API server has news the cache has not seen
    world.tick(sync=False)
    assert world.limit("a") == 25_000 and world.writes("limits", "stale") == 1 and world.writes("limits", "ok") == 0


def test_replicas_go_through_an_hpa_on_the_deployment_applied_once_and_removed_when_the_layer_is_off(
    fake: FakeGateway,
) -> None:
    world = World(fake, [auto_pod("a")], tflops=5_000)
    world.tick()
    hpa = fake.hpas[("default", "tf-w")]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "dep"}
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "dep-uid"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    (metric,) = hpa["spec"]["metrics"]
    # The target: the default 80 % of what a replica's limit may reach (3 × 10 TFLOPS).
    assert metric["pods"] == {
        "metric": {"name": "gpu_tflops"},
        "target": {"type": "AverageValue", "averageValue": "24"},
    }
    assert hpa["spec"]["behavior"]["scaleUp"]["policies"] == [{"type": "Pods", "value": 2, "periodSeconds": 1}]
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 3600  # 90m, clamped to HPA's most
    world.tick()
    assert [c for c in fake.calls if c.startswith("upsert hpa")] == ["upsert hpa default/tf-w"]  # unchanged: not again
    fields, conditions = world.controller.report(("default", "w")) or ({}, ())
    replicas = next(c for c in conditions if c.type == "ReplicasAutoSet")
    assert (replicas.status, replicas.reason) == (False, "NoScaleTarget")  # says the clamp
    assert "scaleDownCoolDownTime 5400s is above HPA's 3600s" in replicas.message
    assert fields["replicas"]["horizontalPodAutoscaler"] == "tf-w"
    # New pods of the workload no longer enable the layer: the HPA goes.
    off = {"autoSetLimits": AUTO["autoSetLimits"]}
    world.pods = [auto_pod("b", auto=off)]
    fake.put(Kind.POD, world.pods[0])
    world.cache.replace(Kind.POD, world.pods)
    world.tick()
    assert not fake.hpas and "delete hpa default/tf-w" in fake.calls


@pytest.mark.parametrize(
    ("deployment", "why"),
    [
        ({"metadata": {"uid": "dep-uid"}, "spec": {"template": {}}}, "Deployment dep's pod template does not opt in"),
        (
            {"metadata": {"uid": "another"}, "spec": {"template": {"metadata": {"labels": {LABEL_ENABLED: "true"},
                                                                                "annotations": {Annotation.WORKLOAD: "w"}}}}},
            "Deployment dep is not the one the pods name as their controller (UID differs)",
        ),
    ],
)  # fmt: skip
def test_a_deployment_is_scaled_only_when_its_own_template_opts_in(
    fake: FakeGateway, deployment: dict[str, Any], why: str
) -> None:
    # A tenant allowed only to create pods names someone's Deployment as its pods' controller.
    fake.controllers[("Deployment", "default", "dep")] = {"metadata": {"name": "dep", **deployment["metadata"]},
                                                          "spec": deployment["spec"]}  # fmt: skip
    world = World(fake, [auto_pod("a")], tflops=5_000)
    world.tick()
    assert not fake.hpas
    _, conditions = world.controller.report(("default", "w")) or ({}, ())
    replicas = next(c for c in conditions if c.type == "ReplicasAutoSet")
    assert (replicas.status, replicas.reason) == (False, "NoScaleTarget") and why in replicas.message


def test_bare_pods_have_no_scale_and_the_status_says_so(fake: FakeGateway) -> None:
    world = World(fake, [auto_pod("a", owner=None)], tflops=5_000)
    world.tick()
    assert not fake.hpas
    _, conditions = world.controller.report(("default", "w")) or ({}, ())
    replicas = next(c for c in conditions if c.type == "ReplicasAutoSet")
    assert (replicas.status, replicas.reason) == (False, "NoScaleTarget") and "bare pods" in replicas.message


def test_histograms_are_checkpointed_and_a_new_leader_starts_from_them(fake: FakeGateway) -> None:
    requests = {"autoSetRequests": {"enable": True, "aggregationPeriod": "2s", "evaluationPeriod": "1s"}}
    world = World(fake, [auto_pod("a", auto=requests)], tflops=5_000)
    for _ in range(6):  # 4 s of samples against a 2 s aggregation period, evaluated every second
        world.tick()
        time.sleep(0.8)
    (saved,) = fake.config_maps.values()
    assert saved["metadata"]["annotations"] == {"tensor-fusion.ai/workload": "default/w"}
    assert saved["metadata"]["namespace"] == "tf-system"
    fields, _ = world.controller.report(("default", "w")) or ({}, ())
    assert fields["requests"]["reason"] == "RequestsLowered" and fields["requests"]["tflopsRequest"]

    successor = World(fake, world.pods, tflops=5_000)
    successor.tick()
    fields, conditions = successor.controller.report(("default", "w")) or ({}, ())
    assert fields["requests"]["reason"] != "WaitingForHistory", conditions
    blank = World(FakeGateway(), world.pods, tflops=5_000)
    blank.tick()
    assert (blank.controller.report(("default", "w")) or ({}, ()))[0]["requests"]["reason"] == "WaitingForHistory"


def test_the_status_writer_gets_the_autoscalers_part_or_says_that_it_is_off(fake: FakeGateway) -> None:
    world = World(fake, [auto_pod("a")], tflops=19_900)
    world.tick()
    base = Status({"replicas": 1}, ())
    status = with_autoscaling(lambda *_: base, world.controller.report)(("default", "w"), {})
    assert status.fields["replicas"] == 1 and status.fields["autoScaling"]["limits"]["raised"] == 1
    assert {c.type for c in status.conditions} == {"LimitsAutoSet", "ReplicasAutoSet"}
    assert with_autoscaling(lambda *_: base, world.controller.report)(("default", "other"), {}) == base
    # A new leader, before its first pass, keeps the autoscaler's conditions its predecessor wrote.
    written = {"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "PodsHoldGPUs", "message": "old"},
        {"type": "LimitsAutoSet", "status": "True", "reason": "AtMaxRatio", "message": "raised"},
    ]}}  # fmt: skip
    fresh = World(fake, [auto_pod("a")], tflops=19_900, leading=False)
    kept = with_autoscaling(lambda *_: base, fresh.controller.report)(("default", "w"), written)
    assert kept.conditions == (Condition("LimitsAutoSet", True, "AtMaxRatio", "raised"),)
    assert "autoScaling" not in kept.fields
    off = with_autoscaling(lambda *_: base, autoscaler_off(world.cache, 4))(("default", "w"), {})
    (condition,) = off.conditions
    assert (condition.type, condition.status, condition.reason) == ("AutoscalerRunning", False, "Disabled")


REQUESTS_ONLY = {"autoSetRequests": {"enable": True, "aggregationPeriod": "2s", "evaluationPeriod": "1s"}}


def recommend(world: World, passes: int = 6) -> None:
    """Enough passes (0.8 s apart) for the requests layer's 2 s of history."""
    for _ in range(passes):
        world.tick()
        time.sleep(0.8)


def request_of(world: World, name: str) -> tuple[int, int]:
    pod = world.fake.pod("default", name)
    g = allocation_contract.decode(pod["metadata"]["annotations"][SystemAnnotation.ALLOCATION]).gpus[0]
    return g.tflops_request, g.tflops_limit


def test_a_running_pods_request_moves_to_the_recommendation_in_the_ledger_and_on_the_pod_together(
    fake: FakeGateway,
) -> None:
    world = World(fake, [auto_pod("a", auto=REQUESTS_ONLY)], tflops=5_000)
    recommend(world)
    fields, _ = world.controller.report(("default", "w")) or ({}, ())
    recommended = parse_milli(fields["requests"]["tflopsRequest"])
    assert 5_750 <= recommended <= 6_100  # p90 of 5 TFLOPS × 1.15 (a bucket at most 5 % high)
    assert request_of(world, "a") == (recommended, 20_000)  # lowered in place; the limit stays
    (counted,) = world.cache.counted_on(NODE).values()
    assert counted[0].tflops_request == recommended  # the ledger holds what the pod says
    assert world.writes("requests", "ok") == 1
    assert any(e.reason == "RequestsResized" and e.pod_name == "a" for e in fake.events)


def test_a_raise_the_gpu_cannot_hold_leaves_the_running_pod_as_it_is_and_says_so(fake: FakeGateway) -> None:
    hungry = auto_pod("a", auto=REQUESTS_ONLY)
    # Another pod holds all but 17 TFLOPS of the 312 the GPU has: room for 7 more, not for the recommendation
    # (30 TFLOPS used × 1.15, capped at the 20-TFLOPS limit: 10 more).
    other = auto_pod("other", auto={}, owner=None)
    text = other["metadata"]["annotations"][SystemAnnotation.ALLOCATION]
    text = text.replace('"tflopsLimit":"20"', '"tflopsLimit":"295"').replace(
        '"tflopsRequest":"10"', '"tflopsRequest":"295"'
    )
    other["metadata"]["annotations"][SystemAnnotation.ALLOCATION] = text
    world = World(fake, [hungry, other], tflops=30_000)
    world.pods = [hungry]  # only the autoscaled pod's use is scripted
    recommend(world)
    fields, conditions = world.controller.report(("default", "w")) or ({}, ())
    assert fields["requests"]["tflopsRequest"] and fields["requests"]["runningPodsWithoutRoom"] == 1
    assert request_of(world, "a") == (10_000, 20_000)
    assert world.writes("requests", "no-room") >= 1 and world.writes("requests", "ok") == 0
    requests = next(c for c in conditions if c.type == "RequestsAutoSet")
    assert "1 running pods keep their requests: their GPU has no room" in requests.message


class RacingGateway(FakeGateway):
    """Another extender replica claims room on the node (and binds a pod there) just before the autoscaler
    claims its resize: the autoscaler's compare-and-swap of the node's claims meets that write."""

    def __init__(self, intruder: dict[str, Any]) -> None:
        super().__init__()
        self.before_claim = lambda: self._race(intruder)

    def _race(self, intruder: dict[str, Any]) -> None:
        alloc = allocation_contract.decode(intruder["metadata"]["annotations"][SystemAnnotation.ALLOCATION])
        claim = Claim(
            pod_uid=alloc.pod_uid, pod="default/intruder", version=1, gpus=alloc.gpus, slots=1, at=time.time()
        )
        self.add_claim("tf-system", claim, alloc.node)
        self.put(Kind.POD, intruder)


def test_a_resize_that_meets_another_replicas_claim_backs_off_without_writing(fake: FakeGateway) -> None:
    intruder = auto_pod("intruder", auto={}, owner=None)
    racing = RacingGateway(intruder)
    world = World(racing, [auto_pod("a", auto=REQUESTS_ONLY)], tflops=5_000)
    world.pods = [world.pods[0]]
    recommend(world)
    assert world.writes("requests", "conflict") == 1
    # The first attempt wrote nothing on the pod (its claim met the other's, so it decided again and found
    # another extender's write in flight); a later pass, its cache counting the intruder now, resized it.
    patches = [c for c in racing.calls if c.startswith("patch default/a")]
    assert len(patches) == 1, racing.calls
    assert world.writes("requests", "ok") == 1
    claims = claims_contract.decode(
        racing.leases[("tf-system", lease_name(NODE))]["metadata"]["annotations"][claims_contract.KEY]
    )
    assert [c.pod for c in claims.claims] == ["default/a"]  # the intruder's, landed and seen, dropped


# --- a VRAM request is guaranteed: a limit is never raised past what the GPU's other pods hold ---------------
# The GPU (80Gi) is the node's only one. A hog (request and limit 1Gi) presses on its VRAM limit; maxRatioToRequests
# 100 would let it reach 100Gi, and one scaleUpStep takes it to its cap at once.
VRAM_LIMITS: dict[str, Any] = {
    "autoSetLimits": {
        "enable": True,
        "evaluationPeriod": "1s",
        "maxRatioToRequests": "100",
        "targetResource": "vram",
        "scaleUpStep": "10000%",
    }
}


def vram_limit(world: World, name: str) -> int:
    pod = world.fake.pod("default", name)
    return allocation_contract.decode(pod["metadata"]["annotations"][SystemAnnotation.ALLOCATION]).gpus[0].vram_limit


def hog_and_neighbour(fake: FakeGateway) -> World:
    """The hog, and a neighbour holding 20Gi requested and a 30Gi limit on the same GPU (the room it may take)."""
    neighbour = auto_pod("neighbour", auto={}, owner=None, vram=(20 * GI, 30 * GI))
    world = World(fake, [auto_pod("hog", auto=VRAM_LIMITS), neighbour], tflops=5_000)
    world.pods = [world.pods[0]]  # only the hog's use is scripted: it presses on its 1Gi limit
    world.vram = {"hog": GI}
    return world


def test_a_vram_limit_is_raised_only_to_what_the_gpus_other_pods_leave_free_and_says_so(
    fake: FakeGateway,
) -> None:
    world = hog_and_neighbour(fake)
    world.tick()
    # 80Gi less the neighbour's 30Gi limit (not its 20Gi request: it may allocate 30 at any moment).
    assert vram_limit(world, "hog") == 50 * GI and world.writes("limits", "ok") == 1
    (event,) = [e for e in fake.events if e.pod_name == "hog"]
    assert event.reason == "CappedByOtherPods"
    assert "vram limit raised to 50Gi, capped at what the GPU's other pods leave free, 50Gi (80Gi less the 30Gi" in (
        event.message
    )
    fields, conditions = world.controller.report(("default", "w")) or ({}, ())
    limits = next(c for c in conditions if c.type == "LimitsAutoSet")
    assert limits.reason == "CappedByOtherPods" and fields["limits"]["pods"][0]["reason"] == "CappedByOtherPods"
    # The ledger holds the raised limit: the GPU has no room left for anyone.
    view = world.cache.node(NODE)
    assert view is not None and view.gpus[0].vram_free == 0
    world.vram = {"hog": 50 * GI}
    time.sleep(1.05)
    world.tick()  # at the cap, pressing on it still: it stays, and says why
    assert vram_limit(world, "hog") == 50 * GI and world.writes("limits", "ok") == 1
    _, conditions = world.controller.report(("default", "w")) or ({}, ())
    limits = next(c for c in conditions if c.type == "LimitsAutoSet")
    assert limits.reason == "CappedByOtherPods" and "stays 50Gi: at what the GPU's other pods leave free" in (
        limits.message
    )


def test_a_raise_that_a_pod_placed_since_the_decision_leaves_no_room_for_is_not_written(fake: FakeGateway) -> None:
    """The decision is a proposal made at the start of the pass; the write is judged against the ledger as it is
    then, under the cache's lock, as a bind is: a bind that reserved room in between wins."""
    world = World(fake, [auto_pod("hog", auto=VRAM_LIMITS)], tflops=5_000)
    world.vram = {"hog": GI}
    late = GpuGrant(uuid=f"GPU-{NODE}-0", index=0, tflops_request=1_000, tflops_limit=1_000, vram_request=60 * GI,
                    vram_limit=60 * GI, gpu_tflops=312_000)  # fmt: skip
    real = world.cache.resize

    def bind_first(ref: PodRef, grants: Any) -> Any:
        # A bind on this replica reserves 60Gi after the hog's raise to the whole GPU (80Gi) was decided.
        world.cache.reserve(PodRef(namespace="default", name="late", uid="uid-late"), NODE, [late], qos=Qos.MEDIUM,
                            expires_at=None)  # fmt: skip
        world.cache.resize = real  # type: ignore[method-assign]
        return real(ref, grants)

    world.cache.resize = bind_first  # type: ignore[method-assign]
    world.tick()
    assert vram_limit(world, "hog") == GI  # nothing written
    assert world.writes("limits", "no-room") == 1 and world.writes("limits", "ok") == 0
    assert not [c for c in fake.calls if c.startswith("patch default/hog")] and not fake.events
    entry = world.cache.entry("default/hog")
    assert entry is not None and entry.grants[0].vram_limit == GI  # the ledger holds the old limit again
    time.sleep(1.05)
    world.tick()  # the next decision counts the late pod: 80 - 60
    assert vram_limit(world, "hog") == 20 * GI and world.writes("limits", "ok") == 1


def test_a_raise_that_meets_another_replicas_placement_on_the_gpu_is_not_made(fake: FakeGateway) -> None:
    """Another extender replica claims a 10Gi pod's room on the GPU from its own cache just before the raise is
    claimed. The raise's compare-and-swap of the node's claims fails, it decides again beside that claim, and
    backs off without writing the pod; the next pass decides counting the intruder."""
    intruder = auto_pod("intruder", auto={}, owner=None, vram=(10 * GI, 10 * GI))
    racing = RacingGateway(intruder)
    world = hog_and_neighbour(racing)
    world.tick(sync=False)
    assert world.writes("limits", "conflict") == 1 and world.writes("limits", "ok") == 0
    assert vram_limit(world, "hog") == GI  # the old allocation, never replaced
    assert not [c for c in racing.calls if c.startswith("patch default/hog")]
    assert [c.split()[0] for c in racing.lease_calls] == ["get", "create", "get"]  # read, CAS lost, read
    assert not [e for e in racing.events if e.pod_name == "hog"]
    time.sleep(1.05)
    world.tick()
    assert vram_limit(world, "hog") == 40 * GI  # 80 - 30 - 10
    assert world.writes("limits", "ok") == 1
