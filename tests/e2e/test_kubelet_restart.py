"""The kubelet restarts under running GPU pods (an upgrade, a crash).

The kubelet wipes every socket in its device-plugin directory and makes a new kubelet.sock; our
device plugin must notice, serve and register again. What an operator checks: the node's vGPU
capacity comes back, pods that were running keep running with the containers they had (no new
CreateContainer for them), and new GPU pods are admitted again.
"""

from __future__ import annotations

from kubernetes.client import CoreV1Api

from vgpu.names import RESOURCE_VGPU, Annotation

from .cluster import REAL_NODE, Cluster
from .kube import eventually, wait_running
from .pods import allocation_of, assert_env_matches_allocation, created_env, gpu_pod

NAMESPACE = "e2e-kubelet-restart"
SHARE = {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "1Gi"}


def vgpu_allocatable(core: CoreV1Api) -> int:
    return int((core.read_node(REAL_NODE).status.allocatable or {}).get(RESOURCE_VGPU, "0"))


def test_plugin_reregisters_capacity_returns_and_running_pods_are_untouched(cluster: Cluster, core: CoreV1Api) -> None:
    assert cluster.node is not None
    ns = cluster.namespace(NAMESPACE)
    for name in ("before-0", "before-1"):
        core.create_namespaced_pod(ns, gpu_pod(name, SHARE))
    before = [wait_running(core, ns, name) for name in ("before-0", "before-1")]
    creates_before = len(cluster.node.creates())
    capacity = vgpu_allocatable(core)
    assert capacity > 0
    socket_before = cluster.node.kubelet_sock_identity()

    cluster.node.restart_kubelet()

    assert cluster.node.kubelet_sock_identity() != socket_before, "the kubelet made a new kubelet.sock"
    eventually("vGPU capacity back on the node", lambda: vgpu_allocatable(core) == capacity, timeout=90)
    for pod in before:
        now = core.read_namespaced_pod(pod.metadata.name, ns)
        assert now.status.phase == "Running" and now.metadata.uid == pod.metadata.uid
        assert now.status.container_statuses[0].restart_count == 0
    untouched = [r for r in cluster.node.creates()[creates_before:] if r["podUid"] in {p.metadata.uid for p in before}]
    assert not untouched, f"running pods got new containers after the restart: {untouched}"

    core.create_namespaced_pod(ns, gpu_pod("after", SHARE))
    after = wait_running(core, ns, "after")
    assert_env_matches_allocation(created_env(cluster.node, after, "main"), allocation_of(after))
