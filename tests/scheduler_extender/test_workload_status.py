"""TensorFusionWorkload status: the pure totals and diff, and the writer against the fake API server."""

from __future__ import annotations

from collections.abc import Callable

from scheduler_extender.gateway import GatewayError, Kind
from scheduler_extender.objects import PodRecord, PodRef
from scheduler_extender.workload_status import (
    EMPTY,
    WorkloadStatusWriter,
    WorkloadTotals,
    pending_writes,
    status_of,
    status_patch,
    workload_totals,
)
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_bind import bind_body
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.names import Qos

GI = 1024**3


def record(
    name: str,
    *,
    workload: str | None = "train",
    namespace: str = "team-a",
    gpus: tuple[tuple[int, int], ...] = ((10_000, 4 * GI),),
    phase: str = "Running",
    allocated: bool = True,
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
        node="n1",
        pool="default-pool",
        qos=Qos.MEDIUM,
        containers=("main",),
        gpus=grants,
        bound_at="2026-01-01T00:00:00Z",
    )
    return PodRecord(
        ref=PodRef(namespace=namespace, name=name, uid=uid),
        node_name="n1",
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
        ("team-a", "train"): WorkloadTotals(replicas=2, tflops_milli=15_000, vram_bytes=6 * GI),
        ("team-b", "train"): WorkloadTotals(replicas=1, tflops_milli=10_000, vram_bytes=4 * GI),
    }


def test_status_round_trips_through_the_patch_body() -> None:
    totals = WorkloadTotals(replicas=3, tflops_milli=12_500, vram_bytes=6 * GI)
    body = status_patch(totals, "2026-11-24T10:00:00Z")
    assert body == {
        "status": {
            "replicas": 3,
            "allocatedTflops": "12500m",
            "allocatedVram": "6Gi",
            "lastUpdateTime": "2026-11-24T10:00:00Z",
        }
    }
    assert status_of(body) == totals


def test_status_of_a_workload_without_or_with_a_broken_status_is_unknown() -> None:
    assert status_of({"spec": {}}) is None
    assert status_of({"status": {}}) is None
    assert status_of({"status": {"replicas": 1, "allocatedVram": "lots"}}) is None


def test_only_changes_are_written_and_emptied_workloads_are_zeroed() -> None:
    same = WorkloadTotals(1, 10_000, 4 * GI)
    grown = WorkloadTotals(2, 20_000, 8 * GI)
    current = {("ns", "same"): same, ("ns", "grown"): grown, ("ns", "new"): same}
    written = {
        ("ns", "same"): same,
        ("ns", "grown"): same,
        ("ns", "gone"): grown,  # its pods went away while nobody watched
        ("ns", "idle"): None,  # exists, never had a status: nothing to correct
        ("ns", "zero"): EMPTY,  # already says zero
    }
    assert pending_writes(current, written) == {("ns", "grown"): grown, ("ns", "new"): same, ("ns", "gone"): EMPTY}


def workload(namespace: str, name: str, status: dict[str, object] | None = None) -> dict[str, object]:
    obj: dict[str, object] = {"metadata": {"namespace": namespace, "name": name}, "spec": {}}
    if status is not None:
        obj["status"] = status
    return obj


def writer(fake: FakeGateway, records: list[PodRecord], ready: bool = True) -> WorkloadStatusWriter:
    return WorkloadStatusWriter(fake, lambda: records, interval=60, clock=lambda: 1_800_000_000.0, ready=lambda: ready)


def test_writer_patches_changes_once_and_zeroes_stale_status_after_a_restart() -> None:
    fake = FakeGateway()
    fake.workloads[("team-a", "train")] = workload("team-a", "train")
    # Written before a restart; its pods were deleted while the extender was down.
    fake.workloads[("team-a", "old")] = workload(
        "team-a", "old", {"replicas": 2, "allocatedTflops": "20", "allocatedVram": "8Gi"}
    )
    records = [record("a"), record("b")]
    w = writer(fake, records)
    assert w.sync() == 2
    assert fake.workloads[("team-a", "train")]["status"] == {
        "replicas": 2,
        "allocatedTflops": "20",
        "allocatedVram": "8Gi",
        "lastUpdateTime": "2027-01-15T08:00:00Z",
    }
    assert fake.workloads[("team-a", "old")]["status"]["replicas"] == 0
    assert fake.workloads[("team-a", "old")]["status"]["allocatedVram"] == "0"
    assert w.sync() == 0  # nothing changed: nothing written
    records.pop()
    assert w.sync() == 1
    assert fake.workloads[("team-a", "train")]["status"]["replicas"] == 1
    assert len(fake.status_patches) == 3


def test_writer_waits_for_the_cache_and_relists_after_a_failed_patch() -> None:
    fake = FakeGateway()
    fake.workloads[("team-a", "train")] = workload(
        "team-a", "train", {"replicas": 1, "allocatedTflops": "10", "allocatedVram": "4Gi"}
    )
    assert writer(fake, [], ready=False).sync() == 0  # an empty cache before its first list would zero it
    assert fake.status_patches == []
    records = [record("a"), record("b")]
    w = writer(fake, records)
    fake.fail["workload-status"] = GatewayError("etcd leader changed", 500)
    assert w.sync() == 0
    fake.fail["list-workloads"] = GatewayError("connection refused")
    assert w.sync() == 0
    assert w.sync() == 1
    assert fake.workloads[("team-a", "train")]["status"]["replicas"] == 2


def test_a_workload_that_does_not_exist_is_not_retried() -> None:
    fake = FakeGateway()
    w = writer(fake, [record("a")])
    assert w.sync() == 0
    assert w.sync() == 0
    assert fake.status_patches == []


def test_the_running_extender_writes_the_status_of_bound_pods_workloads(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2, tflops=100_000))
    fake.workloads[("default", "train")] = workload("default", "train")
    for name in ("p1", "p2"):
        fake.put(Kind.POD, make_pod(name, gpu_request(tflops=30_000, workload="train")))
    app = run(workload_status_interval=0.05)
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    fake.write_receipt("default", "p1")  # the device plugin's hand-off frees the node for the next bind
    assert app.post("/bind", bind_body("p2", "n1")) == {"Error": ""}
    wait_for(lambda: fake.workloads[("default", "train")].get("status", {}).get("replicas") == 2, what="status")
    status = fake.workloads[("default", "train")]["status"]
    assert (status["allocatedTflops"], status["allocatedVram"]) == ("60", "8Gi")
    fake.delete(Kind.POD, "default/p2")
    wait_for(lambda: fake.workloads[("default", "train")]["status"]["replicas"] == 1, what="status after deletion")
    assert fake.workloads[("default", "train")]["status"]["allocatedTflops"] == "30"


def test_an_unexpected_failure_does_not_stop_the_worker() -> None:
    fake = FakeGateway()
    fake.workloads[("team-a", "train")] = workload("team-a", "train")
    calls = []

    def records() -> list[PodRecord]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("cache went away")
        return [record("a")]

    errors = []
    w = WorkloadStatusWriter(fake, records, interval=0.01, clock=lambda: 0.0, on_error=lambda: errors.append(1))
    w.start()
    try:
        wait_for(lambda: fake.status_patches, what="a pass after the failure")
    finally:
        w.stop()
    assert errors == [1]
    assert fake.workloads[("team-a", "train")]["status"]["replicas"] == 1
