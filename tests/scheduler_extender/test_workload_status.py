"""TensorFusionWorkload status: totals and Ready from the cache's pods, the cache keeping the pods that wait,
and the status writer against the fake API server."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from scheduler_extender.cache import ClusterCache
from scheduler_extender.gateway import Kind
from scheduler_extender.handoff import HandoffGate
from scheduler_extender.objects import PodRecord, PodRef, WorkloadPod
from scheduler_extender.status import Reserved, StatusKind, StatusWriter
from scheduler_extender.workload_status import desired_replicas, workload_ready, workload_statuses, workload_totals
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_bind import bind_body
from tests.scheduler_extender.test_cache import allocated_pod
from tf_shell.kube.api import GatewayError, WatchEvent
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.names import PLURAL_WORKLOAD, Qos

GI = 1024**3
EIGHT = [f"p{i}" for i in range(8)]  # a PodsPending message names the first five, and counts the others


def record(
    name: str,
    *,
    workload: str | None = "train",
    namespace: str = "team-a",
    gpus: tuple[tuple[int, int], ...] = ((10_000, 4 * GI),),
    phase: str = "Running",
    allocated: bool = True,
    node: str = "n1",
) -> PodRecord:
    uid = f"uid-{namespace}-{name}"
    grants = tuple(
        GpuGrant(
            uuid=f"GPU-{i}",
            index=i,
            tflops_request=tflops,
            tflops_limit=tflops * 2,  # limits are not reserved: they must not count
            vram_request=vram,
            vram_limit=vram * 2,
            gpu_tflops=312_000,
        )
        for i, (tflops, vram) in enumerate(gpus)
    )
    alloc = PodAllocation(
        pod_uid=uid,
        node=node,
        pool="default-pool",
        qos=Qos.MEDIUM,
        containers=("main",),
        gpus=grants,
        bound_at="2026-01-01T00:00:00Z",
    )
    return PodRecord(
        ref=PodRef(namespace=namespace, name=name, uid=uid),
        node_name=node,
        phase=phase,
        deleting=False,
        allocation=alloc if allocated else None,
        allocation_error=None,
        receipt=True,
        workload=workload,
    )


def test_totals_sum_requests_per_namespace_and_workload() -> None:
    records = [
        record("a"),
        record("b", gpus=((2_500, GI), (2_500, GI))),
        record("c", namespace="team-b"),  # same workload name, other namespace: its own workload
        record("d", workload=None),  # not part of a workload
        record("e", phase="Succeeded"),  # finished: holds nothing
        record("f", allocated=False),  # not bound yet
    ]
    assert workload_totals(records) == {
        ("team-a", "train"): Reserved(pods=2, tflops_milli=15_000, vram_bytes=6 * GI),
        ("team-b", "train"): Reserved(pods=1, tflops_milli=10_000, vram_bytes=4 * GI),
    }


@pytest.mark.parametrize(
    ("holding", "waiting", "replicas", "ready", "reason", "message"),
    [
        (3, [], None, True, "PodsHoldGPUs", "3 of 3 pods hold GPUs"),
        (1, ["b", "a"], None, False, "PodsPending", "1 of 3 pods hold GPUs; pending: a, b"),
        (0, EIGHT, None, False, "PodsPending", f"0 of 8 pods hold GPUs; pending: {', '.join(EIGHT[:5])} and 3 more"),
        (1, ["b"], 3, False, "PodsPending", "1 of 3 pods hold GPUs; pending: b"),
        (2, [], 3, False, "ReplicasMissing", "2 of 3 pods hold GPUs; no other pod names this workload"),
        (2, ["c"], 2, True, "PodsHoldGPUs", "2 of 2 pods hold GPUs; pending: c"),  # a surge pod waits
        (3, [], 2, True, "PodsHoldGPUs", "3 pods hold GPUs (2 desired)"),  # scaling down
        (0, [], None, True, "NoPods", "no pod names this workload"),
        (0, [], 0, True, "NoPods", "no pod names this workload"),
    ],
)
def test_ready_says_whether_every_desired_pod_holds_gpus(
    holding: int, waiting: Sequence[str], replicas: int | None, ready: bool, reason: str, message: str
) -> None:
    condition = workload_ready(holding, waiting, replicas)
    assert (condition.type, condition.status, condition.reason, condition.message) == ("Ready", ready, reason, message)


def test_spec_replicas_count_unless_the_workload_is_in_local_gpu_mode() -> None:
    assert desired_replicas({"replicas": 3}) == 3
    assert desired_replicas({"replicas": 3, "isLocalGPU": False}) == 3
    assert desired_replicas({"replicas": 3, "isLocalGPU": True}) is None  # the CRD: ignored when isLocalGPU
    assert desired_replicas({}) is None
    assert desired_replicas({"replicas": True}) is None


def test_a_workload_status_has_its_totals_and_ready_from_its_own_pods() -> None:
    waiting = [WorkloadPod(PodRef(namespace="team-a", name="z", uid="uz"), "train")]
    status_of = workload_statuses([record("a"), record("b", namespace="team-b")], waiting)
    status = status_of(("team-a", "train"), {"spec": {"replicas": 2}})
    assert status.fields == {"replicas": 1, "allocatedTflops": "10", "allocatedVram": "4Gi"}
    assert [(c.status, c.message) for c in status.conditions] == [(False, "1 of 2 pods hold GPUs; pending: z")]
    status = status_of(("team-a", "idle"), {"spec": {}})
    assert status.fields == {"replicas": 0, "allocatedTflops": "0", "allocatedVram": "0"}
    assert [c.reason for c in status.conditions] == ["NoPods"]
    # A field nothing acts on is named in the status as well as at admission.
    status = status_of(("team-a", "idle"), {"spec": {"standaloneWorkerMode": True}})
    assert [(c.type, c.status, c.reason) for c in status.conditions] == [
        ("Ready", True, "NoPods"),
        ("StandaloneWorkerMode", False, "NotImplemented"),
    ]


def waiting_names(cache: ClusterCache) -> list[str]:
    return sorted(f"{p.ref.name}>{p.workload}" for p in cache.workload_pods()[1])


def test_the_cache_keeps_the_live_pods_of_a_workload_that_wait_for_gpus() -> None:
    cache = ClusterCache(default_pool="default-pool", gate=HandoffGate(ttl=60), clock=lambda: 1000.0)
    cache.replace(Kind.NODE, [make_node("n1")])
    train = gpu_request(workload="train")
    cache.replace(Kind.POD, [make_pod("a", train), make_pod("b", train), make_pod("plain", gpu_request())])
    assert waiting_names(cache) == ["a>train", "b>train"]
    bound = allocated_pod("a", "n1")
    bound["metadata"]["annotations"].update(make_pod("a", train)["metadata"]["annotations"])  # its workload
    cache.apply(Kind.POD, WatchEvent("MODIFIED", bound))
    assert waiting_names(cache) == ["b>train"] and [r.ref.name for r in cache.workload_pods()[0]] == ["a"]
    finished = {**make_pod("b", train), "status": {"phase": "Failed"}}
    cache.apply(Kind.POD, WatchEvent("MODIFIED", finished))
    assert waiting_names(cache) == []
    cache.apply(Kind.POD, WatchEvent("ADDED", make_pod("c", train)))
    deleting = make_pod("c", train)
    deleting["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    cache.apply(Kind.POD, WatchEvent("MODIFIED", deleting))
    assert waiting_names(cache) == []
    cache.apply(Kind.POD, WatchEvent("ADDED", make_pod("d", train)))
    cache.apply(Kind.POD, WatchEvent("DELETED", make_pod("d", train)))
    assert waiting_names(cache) == []


def workload(namespace: str, name: str, status: dict[str, object] | None = None, **spec: Any) -> dict[str, object]:
    obj: dict[str, object] = {"metadata": {"namespace": namespace, "name": name, "generation": 1}, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


def writer(fake: FakeGateway, records: list[PodRecord], waiting: Sequence[WorkloadPod] = (), **kw: Any) -> StatusWriter:
    """The status writer of TensorFusionWorkloads over ``records`` and ``waiting`` (``kw``: ready, leading…)."""
    kind = StatusKind(PLURAL_WORKLOAD, True, lambda: workload_statuses(records, waiting))
    return StatusWriter(fake, [kind], interval=60, clock=lambda: 1_800_000_000.0, **kw)


def ready_of(fake: FakeGateway, namespace: str, name: str) -> tuple[str, str, str]:
    (condition,) = fake.workloads[(namespace, name)]["status"]["conditions"]
    return condition["status"], condition["reason"], condition["message"]


def test_writer_patches_changes_once_and_corrects_stale_status_after_a_restart() -> None:
    fake = FakeGateway()
    fake.workloads[("team-a", "train")] = workload("team-a", "train")
    # Written before a restart; its pods were deleted while the extender was down.
    fake.workloads[("team-a", "old")] = workload(
        "team-a", "old", {"replicas": 2, "allocatedTflops": "20", "allocatedVram": "8Gi"}
    )
    records = [record("a"), record("b")]
    w = writer(fake, records)
    assert w.sync() == 2
    status = fake.workloads[("team-a", "train")]["status"]
    assert status == {
        "replicas": 2,
        "allocatedTflops": "20",
        "allocatedVram": "8Gi",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "PodsHoldGPUs",
                "message": "2 of 2 pods hold GPUs",
                "lastTransitionTime": "2027-01-15T08:00:00Z",
                "observedGeneration": 1,
            }
        ],
        "lastUpdateTime": "2027-01-15T08:00:00Z",
    }
    assert fake.workloads[("team-a", "old")]["status"]["replicas"] == 0
    assert fake.workloads[("team-a", "old")]["status"]["allocatedVram"] == "0"
    assert ready_of(fake, "team-a", "old") == ("True", "NoPods", "no pod names this workload")
    assert w.sync() == 0  # nothing changed: nothing written
    records.pop()
    assert w.sync() == 1
    assert fake.workloads[("team-a", "train")]["status"]["replicas"] == 1
    assert len(fake.status_patches) == 3


def test_a_workload_short_of_its_replicas_is_not_ready_and_says_who_waits() -> None:
    fake = FakeGateway()
    fake.workloads[("team-a", "train")] = workload("team-a", "train", replicas=3)
    waiting = [WorkloadPod(PodRef(namespace="team-a", name="c", uid="uc"), "train")]
    assert writer(fake, [record("a"), record("b")], waiting=waiting).sync() == 1
    assert ready_of(fake, "team-a", "train") == ("False", "PodsPending", "2 of 3 pods hold GPUs; pending: c")


def test_writer_waits_for_the_cache_and_retries_after_a_failed_list_or_patch() -> None:
    fake = FakeGateway()
    fake.workloads[("team-a", "train")] = workload(
        "team-a", "train", {"replicas": 1, "allocatedTflops": "10", "allocatedVram": "4Gi"}
    )
    assert writer(fake, [], ready=lambda: False).sync() == 0  # an empty cache before its first list would zero it
    assert fake.status_patches == []
    w = writer(fake, [record("a"), record("b")])
    fake.fail[f"{PLURAL_WORKLOAD}/status"] = GatewayError("etcd leader changed", 500)
    assert w.sync() == 0
    fake.fail[f"list-{PLURAL_WORKLOAD}"] = GatewayError("connection refused")
    assert w.sync() == 0
    assert w.sync() == 1
    assert fake.workloads[("team-a", "train")]["status"]["replicas"] == 2


def test_a_workload_deleted_after_the_list_is_skipped_quietly() -> None:
    fake = FakeGateway()
    fake.workloads[("team-a", "train")] = workload("team-a", "train")
    errors: list[int] = []
    kind = StatusKind(PLURAL_WORKLOAD, True, lambda: workload_statuses([record("a")], ()))
    w = StatusWriter(fake, [kind], interval=60, clock=lambda: 0.0, on_error=lambda: errors.append(1))
    fake.fail[f"{PLURAL_WORKLOAD}/status"] = GatewayError("tensorfusionworkloads 'train' not found", 404)
    assert w.sync() == 0 and errors == []
    assert w.sync() == 1  # (had it come back) the next pass writes it


def test_pods_naming_a_workload_that_does_not_exist_write_nothing() -> None:
    fake = FakeGateway()
    w = writer(fake, [record("a")])
    assert w.sync() == 0
    assert fake.status_patches == []


def test_the_running_extender_writes_the_status_of_bound_pods_workloads(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2, tflops=100_000))
    fake.workloads[("default", "train")] = workload("default", "train")
    for name in ("p1", "p2", "p3"):
        fake.put(Kind.POD, make_pod(name, gpu_request(tflops=30_000, workload="train")))
    app = run(workload_status_interval=0.05)
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    fake.write_receipt("default", "p1")  # the device plugin's hand-off frees the node for the next bind
    assert app.post("/bind", bind_body("p2", "n1")) == {"Error": ""}
    wait_for(lambda: fake.workloads[("default", "train")].get("status", {}).get("replicas") == 2, what="status")
    status = fake.workloads[("default", "train")]["status"]
    assert (status["allocatedTflops"], status["allocatedVram"]) == ("60", "8Gi")
    assert ready_of(fake, "default", "train") == ("False", "PodsPending", "2 of 3 pods hold GPUs; pending: p3")
    fake.delete(Kind.POD, "default/p3")
    wait_for(lambda: ready_of(fake, "default", "train")[0] == "True", what="Ready once p3 is gone")
    fake.delete(Kind.POD, "default/p2")
    wait_for(lambda: fake.workloads[("default", "train")]["status"]["replicas"] == 1, what="status after deletion")
    assert fake.workloads[("default", "train")]["status"]["allocatedTflops"] == "30"
    assert ready_of(fake, "default", "train") == ("True", "PodsHoldGPUs", "1 of 1 pods hold GPUs")


def test_an_unexpected_failure_does_not_stop_the_worker() -> None:
    fake = FakeGateway()
    fake.workloads[("team-a", "train")] = workload("team-a", "train")
    calls = []

    def statuses() -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("cache went away")
        return workload_statuses([record("a")], ())

    errors = []
    kind = StatusKind(PLURAL_WORKLOAD, True, statuses)
    w = StatusWriter(fake, [kind], interval=0.01, clock=lambda: 0.0, on_error=lambda: errors.append(1))
    w.start()
    try:
        wait_for(lambda: fake.status_patches, what="a pass after the failure")
    finally:
        w.stop()
    assert errors == [1]
    assert fake.workloads[("team-a", "train")]["status"]["replicas"] == 1
