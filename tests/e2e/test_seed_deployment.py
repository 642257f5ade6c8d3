"""The README's example: deploy/examples/ applied as shipped, two replicas each running on its own GPU share.

A user applies the examples and checks, per pod: it was mutated by our webhook (scheduler name,
the vGPU resource, the resolved request), the real kube-scheduler bound it through our extender
(allocation recorded), the real kubelet started it, and its container was created with its own
GPU UUID and the granted limits in the env.
"""

from __future__ import annotations

from kubernetes.client import CoreV1Api

from vgpu.contract import resolved
from vgpu.names import LABEL_ENABLED, RESOURCE_VGPU, SCHEDULER_NAME, SystemAnnotation

from . import deploy
from .cluster import REAL_NODE, Cluster
from .kube import apply, eventually
from .pods import allocation_of, assert_env_matches_allocation, created_env


def test_seed_deployment_runs_two_replicas_each_with_its_own_gpu_share(cluster: Cluster, core: CoreV1Api) -> None:
    docs = deploy.examples()
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert deployments, "deploy/examples/ ships no Deployment"
    namespace = deployments[0]["metadata"].get("namespace", "default")
    apply(cluster.admin, docs, namespace=namespace)
    expected = sum(int(d["spec"].get("replicas", 1)) for d in deployments)
    assert expected == 2

    def running() -> list[object] | None:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_ENABLED}=true").items
        live = [p for p in pods if p.status.phase == "Running"]
        return live if len(live) == expected else None

    pods = eventually(f"{expected} example pods Running", running, timeout=120)

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
            env = created_env(cluster.node, pod, container)
            assert_env_matches_allocation(env, alloc, sm_percent=7)  # tflops-limit 20 of 312, rounded up
        for grant in alloc.gpus:
            assert grant.tflops_request == request.tflops_request and grant.vram_request == request.vram_request
            assert grant.tflops_limit == request.tflops_limit and grant.vram_limit == request.vram_limit
            uuids.add(grant.uuid)
    assert uuids <= {g.uuid for g in cluster.gpus}
