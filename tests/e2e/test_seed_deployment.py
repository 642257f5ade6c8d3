"""The README's example: deploy/examples/ applied as shipped, two replicas each running on its own GPU share.

A user applies the examples and checks, per pod: it was mutated by our webhook (scheduler name,
the vGPU resource, the resolved request), the real kube-scheduler bound it through our extender
(allocation recorded), the real kubelet started it, and its container was created with its own
GPU UUID and the granted limits in the env. Then ``kubectl get tensorfusionworkloads``: the
workload the webhook generated shows what its bound pods reserve and that it is Ready, written by the
extender (as its shipped ServiceAccount, so through the shipped RBAC), and follows the Deployment as it
scales down; ``kubectl get gpupools`` shows the default pool's node, GPUs and what the pods hold, and
a pool no node is in as not Ready.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kubernetes.client import AppsV1Api, CoreV1Api, CustomObjectsApi

from vgpu.contract import resolved
from vgpu.names import (
    CRD_GROUP,
    CRD_VERSION,
    DEFAULT_POOL,
    LABEL_ENABLED,
    LABEL_NODE_POOL,
    PLURAL_GPU_POOL,
    PLURAL_WORKLOAD,
    RESOURCE_VGPU,
    SCHEDULER_NAME,
    Annotation,
    SystemAnnotation,
)
from vgpu.quantity import parse_milli

from . import deploy
from .cluster import REAL_NODE, Cluster
from .kube import apply, eventually, kubectl_get, wait_running_pods
from .pods import allocation_of, assert_grant_matches_allocation, created


def test_seed_deployment_runs_two_replicas_each_with_its_own_gpu_share(cluster: Cluster, core: CoreV1Api) -> None:
    docs = deploy.examples()
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert deployments, "deploy/examples/ ships no Deployment"
    namespace = deployments[0]["metadata"].get("namespace", "default")
    apply(cluster.admin, docs, namespace=namespace)
    expected = sum(int(d["spec"].get("replicas", 1)) for d in deployments)
    assert expected == 2

    pods = wait_running_pods(core, namespace, f"{LABEL_ENABLED}=true", expected)

    uuids = set()
    for pod in pods:
        assert pod.spec.scheduler_name == SCHEDULER_NAME
        assert pod.spec.node_name == REAL_NODE
        request = resolved.decode(pod.metadata.annotations[SystemAnnotation.RESOLVED_REQUEST])
        alloc = allocation_of(pod)
        assert alloc.pod_uid == pod.metadata.uid and alloc.node == REAL_NODE
        assert len(alloc.gpus) == request.gpu_count
        for container in request.containers:
            spec = next(c for c in pod.spec.containers if c.name == container)
            assert spec.resources.limits[RESOURCE_VGPU] == str(request.gpu_count)
            assert_grant_matches_allocation(
                created(cluster.node, pod, container), alloc, sm_percent=7
            )  # tflops-limit 20 of 312, rounded up
        for grant in alloc.gpus:
            assert grant.tflops_request == request.tflops_request and grant.vram_request == request.vram_request
            assert grant.tflops_limit == request.tflops_limit and grant.vram_limit == request.vram_limit
            uuids.add(grant.uuid)
    assert uuids <= {g.uuid for g in cluster.gpus}


def wait_workload_status(
    cluster: Cluster, namespace: str, name: str, expected: tuple[int, str, str], timeout: float
) -> dict[str, Any]:
    """The workload's status once its (replicas, allocatedTflops, allocatedVram) are ``expected``."""
    workloads = CustomObjectsApi(cluster.admin)
    seen: list[dict[str, Any]] = [{}]

    def reached() -> dict[str, Any] | None:
        obj = workloads.get_namespaced_custom_object(CRD_GROUP, CRD_VERSION, namespace, PLURAL_WORKLOAD, name)
        seen[0] = status = obj.get("status", {})
        totals = (status.get("replicas"), status.get("allocatedTflops"), status.get("allocatedVram"))
        return status if totals == expected else None

    try:
        return eventually(f"workload {namespace}/{name} (replicas, TFLOPS, VRAM) = {expected}", reached, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; status seen last: {seen[0]}") from None


def ready_of(status: dict[str, Any]) -> tuple[str, str, str]:
    """The Ready condition's (status, reason, message)."""
    (condition,) = status["conditions"]
    assert condition["type"] == "Ready"
    return condition["status"], condition["reason"], condition["message"]


def pool_status(cluster: Cluster, name: str) -> dict[str, Any]:
    pool = CustomObjectsApi(cluster.admin).get_cluster_custom_object(CRD_GROUP, CRD_VERSION, PLURAL_GPU_POOL, name)
    status: dict[str, Any] = pool.get("status", {})
    return status


def row(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(r for r in rows if r["Name"] == name)


def test_generated_workload_status_sums_the_bound_pods_and_follows_a_scale_down(cluster: Cluster) -> None:
    docs = deploy.examples()
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    name, namespace = deployment["metadata"]["name"], deployment["metadata"].get("namespace", "default")
    template = deployment["spec"]["template"]["metadata"]["annotations"]
    assert template[Annotation.GENERATE_WORKLOAD] == "true"
    workload = template[Annotation.WORKLOAD]
    apply(cluster.admin, docs, namespace=namespace)  # as shipped, 2 replicas: a no-op after the test above

    # Each replica holds one GPU with the example's tflops-request 10 and vram-request 4Gi.
    status = wait_workload_status(cluster, namespace, workload, (2, "20", "8Gi"), timeout=90)
    assert set(status) == {"replicas", "allocatedTflops", "allocatedVram", "lastUpdateTime", "conditions"}
    # The example is in local-GPU mode, where the CRD says spec.replicas (1) is ignored: its live pods count.
    assert ready_of(status) == ("True", "PodsHoldGPUs", "2 of 2 pods hold GPUs")
    workloads = f"/apis/{CRD_GROUP}/{CRD_VERSION}/namespaces/{namespace}/{PLURAL_WORKLOAD}"
    shown = row(kubectl_get(cluster.admin, workloads), workload)
    assert (shown["Ready"], shown["Replicas"], shown["TFLOPS"], shown["VRAM"]) == ("True", 2, "20", "8Gi")

    # The real node is in the default pool; its 4 A100s hold (at least) the two pods' shares.
    def counting_the_pods() -> dict[str, Any] | None:
        status = pool_status(cluster, DEFAULT_POOL)
        return status if parse_milli(str(status.get("allocatedTflops", "0"))) >= 20_000 else None

    pool = eventually("the default pool's status counting the two pods", counting_the_pods, timeout=30)
    assert pool["nodes"] >= 1 and pool["gpus"] >= 4 and parse_milli(str(pool["capacityTflops"])) >= 4 * 312_000
    assert ready_of(pool)[:2] == ("True", "HealthyGPUs")
    apps = AppsV1Api(cluster.admin)
    for replicas, tflops, vram in ((1, "10", "4Gi"), (0, "0", "0")):
        scaled = dt.datetime.now(dt.UTC).replace(microsecond=0)
        apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}})
        status = wait_workload_status(cluster, namespace, workload, (replicas, tflops, vram), timeout=60)
        assert dt.datetime.strptime(status["lastUpdateTime"], "%Y-%m-%dT%H:%M:%S%z") >= scaled, status
        held = (
            ("PodsHoldGPUs", f"{replicas} of {replicas} pods hold GPUs")
            if replicas
            else ("NoPods", "no pod names this workload")
        )
        assert ready_of(status) == ("True", *held)


def test_a_gpupool_no_node_is_in_is_not_ready(cluster: Cluster) -> None:
    cluster.ensure_pool("e2e-empty")
    status = eventually("the empty pool's status", lambda: pool_status(cluster, "e2e-empty") or None, timeout=30)
    assert (status["nodes"], status["gpus"], status["capacityTflops"], status["allocatedTflops"]) == (0, 0, "0", "0")
    joins = f"a node joins it with the label {LABEL_NODE_POOL}=e2e-empty"
    assert ready_of(status) == ("False", "NoNodes", f"no GPU node is in the pool: {joins}")
    shown = kubectl_get(cluster.admin, f"/apis/{CRD_GROUP}/{CRD_VERSION}/{PLURAL_GPU_POOL}")
    assert (row(shown, "e2e-empty")["Ready"], row(shown, "e2e-empty")["Nodes"]) == ("False", 0)
    assert row(shown, DEFAULT_POOL)["Ready"] == "True"
