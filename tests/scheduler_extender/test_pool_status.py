"""GPUPool status: nodes, GPUs, capacity and allocation per pool from the cache, Ready, and the writer."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scheduler_extender.gateway import Kind
from scheduler_extender.objects import node_state
from scheduler_extender.pool_status import PoolTotals, pool_ready, pool_statuses, pool_totals
from scheduler_extender.status import StatusKind, StatusWriter
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_bind import bind_body
from tests.scheduler_extender.test_workload_status import record
from vgpu.names import LABEL_NODE_POOL, PLURAL_GPU_POOL, EnforcementBackend
from vgpu.scheduling.model import NodeState

MPS = EnforcementBackend.MPS
JOIN = f"{LABEL_NODE_POOL}=p"


def nodes() -> list[NodeState]:
    a100 = make_node("a", gpus=2, unhealthy=(1,))  # one healthy A100 (312 TFLOPS, 80Gi), one not
    l4 = make_node("b", gpus=2, model="NVIDIA L4", tflops=121_000, vram=24 * GI, pool="small", backend=MPS)
    labelled = {"metadata": {"name": "c", "labels": {LABEL_NODE_POOL: "small"}}}  # its plugin has not reported yet
    cpu = {"metadata": {"name": "cpu", "labels": {}}}  # no inventory, no label: in no pool
    corrupt = make_node("d", inventory="{not json")  # a GPU node all the same, in the default pool
    return [node_state(n, "default-pool") for n in (a100, l4, labelled, cpu, corrupt)]


def test_pools_count_their_gpu_nodes_and_the_capacity_of_healthy_gpus() -> None:
    hami = (("shared", 1), ("soft", 1))  # the healthy A100, under HAMi-core
    assert pool_totals(nodes()) == {
        "default-pool": PoolTotals(
            nodes=2,
            gpus=2,
            healthy_gpus=1,
            tflops_milli=312_000,
            vram_bytes=80 * GI,
            modes=hami,
            sizes=(("NVIDIA A100-SXM4-80GB", 312_000),),
        ),
        "small": PoolTotals(
            nodes=2,
            gpus=2,
            healthy_gpus=2,
            tflops_milli=242_000,
            vram_bytes=48 * GI,
            modes=(("hard", 2),),
            sizes=(("NVIDIA L4", 121_000),),
        ),
    }


@pytest.mark.parametrize(
    ("totals", "ready", "reason", "message"),
    [
        (PoolTotals(), False, "NoNodes", f"no GPU node is in the pool: a node joins it with the label {JOIN}"),
        (PoolTotals(nodes=1), False, "NoHealthyGPUs", "1 node in the pool, reporting no GPU"),
        (PoolTotals(nodes=2, gpus=3), False, "NoHealthyGPUs", "none of the 3 GPUs on 2 nodes is healthy"),
        (PoolTotals(nodes=1, gpus=4, healthy_gpus=3), True, "HealthyGPUs", "3 of 4 GPUs healthy, on 1 node"),
    ],
)
def test_ready_needs_a_node_with_a_healthy_gpu(totals: PoolTotals, ready: bool, reason: str, message: str) -> None:
    condition = pool_ready("p", totals)
    assert (condition.type, condition.status, condition.reason, condition.message) == ("Ready", ready, reason, message)


def test_a_pool_status_sums_what_pods_hold_on_its_nodes() -> None:
    held = [record("x", node="a"), record("y", node="b"), record("gone", node="n1")]  # the cache knows no n1
    status_of = pool_statuses(nodes(), held)
    status = status_of((None, "default-pool"), {})
    assert status.fields == {
        "nodes": 2,
        "gpus": 2,
        "healthyGPUs": 1,
        "capacityTflops": "312",
        "capacityVram": "80Gi",
        "isolationModes": {"shared": 1, "soft": 1},
        "gpuTflops": {"NVIDIA A100-SXM4-80GB": "312"},  # the healthy GPUs' products: what a percent is charged by
        "allocatedTflops": "10",
        "allocatedVram": "4Gi",
    }
    assert [c.reason for c in status.conditions] == ["HealthyGPUs"]
    empty = status_of((None, "nobody"), {})  # a GPUPool no node is in
    assert empty.fields["nodes"] == 0 and empty.fields["allocatedTflops"] == "0"
    assert [(c.status, c.reason) for c in empty.conditions] == [(False, "NoNodes")]


def test_the_writer_gives_a_pool_without_nodes_its_status_once() -> None:
    fake = FakeGateway()
    fake.pools["empty"] = {"metadata": {"name": "empty", "generation": 3}, "spec": {}}
    kind = StatusKind(PLURAL_GPU_POOL, False, lambda: pool_statuses(nodes(), []))
    writer = StatusWriter(fake, [kind], interval=60, clock=lambda: 1_800_000_000.0)
    assert writer.sync() == 1 and writer.sync() == 0
    status = fake.pools["empty"]["status"]
    assert (status["nodes"], status["gpus"], status["capacityTflops"]) == (0, 0, "0")
    (condition,) = status["conditions"]
    assert (condition["status"], condition["reason"], condition["observedGeneration"]) == ("False", "NoNodes", 3)
    assert fake.status_patches[0][:2] == (PLURAL_GPU_POOL, "empty")


def test_the_running_extender_writes_pool_status_as_nodes_and_binds_change(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    fake.pools["default-pool"] = {"metadata": {"name": "default-pool"}, "spec": {"default": True}}
    fake.put(Kind.POD, make_pod("p1", gpu_request(tflops=30_000)))
    app = run(workload_status_interval=0.05)

    def pool() -> dict[str, object]:
        status: dict[str, object] = fake.pools["default-pool"].get("status", {})
        return status

    wait_for(lambda: pool().get("conditions"), what="a first pool status")
    assert pool()["nodes"] == 0 and pool()["conditions"][0]["reason"] == "NoNodes"  # type: ignore[index]
    fake.put(Kind.NODE, make_node("n1", gpus=2, tflops=100_000))
    wait_for(lambda: pool()["nodes"] == 1, what="the node in the pool")
    assert (pool()["gpus"], pool()["healthyGPUs"], pool()["capacityTflops"]) == (2, 2, "200")
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    wait_for(lambda: pool()["allocatedTflops"] == "30", what="the bound pod's share in the pool")
    assert pool()["conditions"][0]["status"] == "True"  # type: ignore[index]
