"""The autoscaler controller (scheduler_extender/autoscaler/) over the fake gateway, a real cache and a real
usage collector fed a device plugin's document: what it writes, when it must not, and what the status says."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from scheduler_extender.autoscaler.controller import AutoscalerController, autoscaler_off, with_autoscaling
from scheduler_extender.cache import ClusterCache
from scheduler_extender.events import EventRecorder
from scheduler_extender.gateway import Kind
from scheduler_extender.handoff import HandoffGate
from scheduler_extender.metrics_api.collector import Collector, Target
from scheduler_extender.status import Status
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from vgpu.contract import allocation as allocation_contract
from vgpu.contract import usage
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.names import Qos, SystemAnnotation

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
    name: str, *, auto: dict[str, Any] | None = None, owner: str | None = "rs-1", limit: int = 20_000
) -> dict[str, Any]:
    request = gpu_request(10_000, GI, tflops_limit=20_000, workload="w", auto_scaling=AUTO if auto is None else auto)
    pod = make_pod(name, request)
    uid = pod["metadata"]["uid"]
    grant = GpuGrant(uuid=f"GPU-{NODE}-0", index=0, tflops_request=10_000, tflops_limit=limit, vram_request=GI,
                     vram_limit=GI, gpu_tflops=312_000)  # fmt: skip
    alloc = PodAllocation(pod_uid=uid, node=NODE, pool="default-pool", qos=Qos.MEDIUM, containers=("main",),
                          gpus=(grant,), bound_at="2026-01-01T00:00:00Z")  # fmt: skip
    pod["metadata"]["annotations"][SystemAnnotation.ALLOCATION] = allocation_contract.encode(alloc)
    pod["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    pod["metadata"]["resourceVersion"] = "7"
    if owner:
        pod["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": "rs-uid", "controller": True}
        ]
    pod["spec"]["nodeName"] = NODE
    pod["status"]["phase"] = "Running"
    return pod


def document(pods: list[dict[str, Any]], tflops: int) -> bytes:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    containers = tuple(
        usage.ContainerUsage(
            namespace="default",
            pod=p["metadata"]["name"],
            pod_uid=p["metadata"]["uid"],
            container="main",
            gpu=f"GPU-{NODE}-0",
            tflops_used=tflops,
            vram_used=GI // 2,
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
        fake.replica_sets[("default", "rs-1")] = {
            "metadata": {
                "name": "rs-1",
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "dep", "uid": "dep-uid", "controller": True}
                ],
            }
        }
        for p in pods:
            fake.put(Kind.POD, p)
        self.cache = ClusterCache(default_pool="default-pool", gate=HandoffGate(ttl=60))
        self.cache.replace(Kind.NODE, [make_node(NODE, gpus=1)])
        self.cache.replace(Kind.POD, pods)
        self.events = EventRecorder(fake, interval=0)
        self.registry = CollectorRegistry()
        collector = Collector(
            lambda: [Target(NODE, "http://n1/usage")], lambda _: document(self.pods, self.tflops), 1, self.registry,
            prefix="tf_autoscaler",
        )  # fmt: skip
        self.controller = AutoscalerController(
            fake, self.cache, self.events, collector, namespace="tf-system", max_replicas=4, checkpoint_interval=0.01,
            clock=time.time, leading=lambda: self.leading, ready=lambda: True, registry=self.registry,
        )  # fmt: skip

    def tick(self) -> None:
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
    assert world.controller.report(("default", "w")) is None


def test_an_allocation_that_moved_since_the_decision_is_left_for_the_next_pass(fake: FakeGateway) -> None:
    world = World(fake, [auto_pod("a")], tflops=19_900)
    fake.put(Kind.POD, auto_pod("a", limit=25_000))  # the API server has news the cache has not seen
    world.tick()
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
    off = with_autoscaling(lambda *_: base, autoscaler_off(world.cache, 4))(("default", "w"), {})
    (condition,) = off.conditions
    assert (condition.type, condition.status, condition.reason) == ("AutoscalerRunning", False, "Disabled")
