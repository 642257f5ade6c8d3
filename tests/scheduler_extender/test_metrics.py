"""/metrics through the HTTP API: per-verb latency, the capacity gauges, the GPU pods waiting per pool, errors_total
and the preemption outcomes, and that each moves."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler_extender.gateway import Kind
from scheduler_extender.preemptor import RESULTS as PREEMPTION_RESULTS
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_bind import bind_body
from tests.scheduler_extender.test_cache import allocated_pod, grant
from tests.scheduler_extender.test_verbs import args, preempt_args
from tf_shell.kube.api import GatewayError
from vgpu.names import DISTRIBUTION, SystemAnnotation

A100 = "NVIDIA A100-SXM4-80GB"


def metric(app: Running, name: str, **labels: str) -> float:
    """One sample's value as scraped now; 0 when the series is not exposed (yet)."""
    for family in text_string_to_metric_families(app.client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


@pytest.fixture
def cluster(fake: FakeGateway) -> FakeGateway:
    """test_bind's cluster (n1: 2 GPUs × 100 TFLOPS / 16Gi; pod p1 asks 30 / 6Gi) plus a node with a corrupt inventory."""
    for node in (make_node("n1", gpus=2, vram=16 * GI, tflops=100_000), make_node("broken", inventory="{oops")):
        fake.put(Kind.NODE, node)
    fake.put(Kind.POD, make_pod("p1", gpu_request(tflops=30_000, vram=6 * GI)))
    return fake


def test_request_latency_is_observed_per_verb(run: Callable[..., Running], cluster: FakeGateway) -> None:
    app = run()
    verbs = ("filter", "prioritize", "bind", "preempt")
    assert [metric(app, "tf_extender_request_seconds_count", verb=v) for v in verbs] == [0, 0, 0, 0]
    pod = cluster.pod("default", "p1")
    app.post("/filter", args(pod, "n1"))
    app.post("/filter", args(pod, "n1"))
    app.post("/prioritize", args(pod, "n1"))
    app.post("/preempt", preempt_args(pod, {"n1": []}))
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    assert [metric(app, "tf_extender_request_seconds_count", verb=v) for v in verbs] == [2, 1, 1, 1]
    assert metric(app, "tf_extender_request_seconds_bucket", verb="filter", le="+Inf") == 2
    assert all(metric(app, "tf_extender_request_seconds_sum", verb=v) > 0 for v in verbs)


def test_build_info_and_process_metrics_are_exported(run: Callable[..., Running]) -> None:
    app = run()
    assert metric(app, "tf_build_info", component="extender", version=version(DISTRIBUTION)) == 1
    assert metric(app, "process_cpu_seconds_total") > 0


def test_node_and_pool_gauges_follow_binds_receipts_and_deletions(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    app = run()
    node = {"node": "n1", "pool": "default-pool"}
    pool = {"pool": "default-pool", "model": A100}

    def capacity_and_allocated() -> list[float]:
        return [
            metric(app, "tf_extender_node_tflops", **node, kind="capacity"),
            metric(app, "tf_extender_node_tflops", **node, kind="allocated"),
            metric(app, "tf_extender_node_vram_bytes", **node, kind="capacity"),
            metric(app, "tf_extender_node_vram_bytes", **node, kind="allocated"),
            metric(app, "tf_extender_pool_tflops", **pool, kind="capacity"),
            metric(app, "tf_extender_pool_tflops", **pool, kind="allocated"),
            metric(app, "tf_extender_pool_vram_bytes", **pool, kind="capacity"),
            metric(app, "tf_extender_pool_vram_bytes", **pool, kind="allocated"),
        ]

    assert capacity_and_allocated() == [200, 0, 32 * GI, 0, 200, 0, 32 * GI, 0]
    assert metric(app, "tf_extender_nodes_inventory_error") == 1
    assert metric(app, "tf_extender_node_tflops", node="broken", pool="default-pool", kind="capacity") == 0

    app.post("/filter", args(cluster.pod("default", "p1"), "n1"))  # one node passes: a tentative reservation
    assert metric(app, "tf_extender_reservations") == 1
    assert capacity_and_allocated() == [200, 30, 32 * GI, 6 * GI, 200, 30, 32 * GI, 6 * GI]

    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    app.settle()
    assert metric(app, "tf_extender_reservations") == 0  # the bind claimed it
    assert capacity_and_allocated() == [200, 30, 32 * GI, 6 * GI, 200, 30, 32 * GI, 6 * GI]
    assert metric(app, "tf_extender_handoff_gates_held") == 1  # no receipt yet

    cluster.write_receipt("default", "p1")
    app.settle()
    assert metric(app, "tf_extender_handoff_gates_held") == 0

    cluster.delete(Kind.POD, "default/p1")
    app.settle()
    assert capacity_and_allocated() == [200, 0, 32 * GI, 0, 200, 0, 32 * GI, 0]


def test_allocation_conflicts_gauge_counts_allocations_the_ledger_refused(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    app = run()
    assert metric(app, "tf_extender_allocation_conflicts") == 0
    cluster.put(Kind.POD, allocated_pod("a", "n1", grant("n1", 0, 10 * GI)))
    cluster.put(Kind.POD, allocated_pod("b", "n1", grant("n1", 0, 10 * GI)))  # 20Gi on a 16Gi GPU
    app.settle()
    assert metric(app, "tf_extender_allocation_conflicts") == 1


def test_errors_total_counts_each_kind_of_failure(run: Callable[..., Running], cluster: FakeGateway) -> None:
    app = run()

    def errors(verb: str, kind: str) -> float:
        return metric(app, "tf_extender_errors_total", verb=verb, kind=kind)

    assert app.post("/filter", {"Pod": None, "NodeNames": ["n1"]})["Error"]
    assert errors("filter", "request") == 1

    app.post("/prioritize", {"NodeNames": 7})
    assert errors("prioritize", "invalid-body") == 1

    assert "does not exist" in app.post("/bind", bind_body("ghost", "n1"))["Error"]
    cluster.fail["bind"] = GatewayError("boom", 403)
    assert "boom" in app.post("/bind", bind_body("p1", "n1"))["Error"]
    assert (errors("bind", "request"), errors("bind", "binding")) == (1, 1)

    cluster.fail["event"] = GatewayError("events forbidden", 403)
    assert app.post("/filter", args(make_pod("huge", gpu_request(vram=100 * GI)), "n1"))["NodeNames"] == []
    wait_for(lambda: errors("event", "api") == 1, what="the failed event to be counted")

    cluster.fail["watch-Pod"] = GatewayError("watch refused", 503)  # the pod watch's next round fails
    wait_for(lambda: errors("watch-pod", "HTTP 503") == 1, what="the failed watch to be counted")


def series(app: Running, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample named ``name`` as scraped now, by its labels (sorted)."""
    return {
        tuple(sorted(sample.labels.items())): float(sample.value)
        for family in text_string_to_metric_families(app.client.get("/metrics").text)
        for sample in family.samples
        if sample.name == name
    }


def test_pending_pods_counts_gpu_pods_waiting_for_a_node_per_pool(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    app = run()

    def pending() -> dict[str, float]:
        return {dict(labels)["pool"]: value for labels, value in series(app, "tf_extender_pending_pods").items()}

    assert pending() == {"default-pool": 1}  # p1: resolved, unbound, unallocated
    finished = make_pod("done", gpu_request())
    finished["status"]["phase"] = "Succeeded"
    leaving = make_pod("leaving", gpu_request())
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    corrupt = make_pod("corrupt", annotations={SystemAnnotation.RESOLVED_REQUEST: '{"version":"v1"}'})
    for pod in (make_pod("b", gpu_request(pool="team-b")), make_pod("cpu"), finished, leaving, corrupt):
        cluster.put(Kind.POD, pod)
    app.settle()
    assert pending() == {"default-pool": 1, "team-b": 1, "": 1}  # an unreadable request has no pool

    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    app.settle()
    assert pending() == {"default-pool": 0, "team-b": 1, "": 1}  # a pool with nodes shows its 0
    for name in ("b", "corrupt"):
        cluster.delete(Kind.POD, f"default/{name}")
    app.settle()
    assert pending() == {"default-pool": 0}


def test_every_preemption_outcome_is_exported_from_the_start(run: Callable[..., Running]) -> None:
    app = run()
    assert series(app, "tf_extender_preemptions_total") == {(("result", r),): 0 for r in PREEMPTION_RESULTS}


@pytest.mark.usefixtures("cluster")  # a node and a pod: the per-node, per-pool and pending series exist
def test_every_metric_the_extender_exports_is_in_the_docs(run: Callable[..., Running]) -> None:
    exported = {
        re.sub(r"_(bucket|count|sum)$", "", sample.name)
        for family in text_string_to_metric_families(run().client.get("/metrics").text)
        for sample in family.samples
        if sample.name.startswith("tf_") and not sample.name.endswith("_created")
    }
    assert "tf_extender_pending_pods" in exported
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert [name for name in sorted(exported) if f"`{name}`" not in docs] == []
