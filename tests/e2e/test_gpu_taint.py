"""A GPU node tainted as GPU clusters taint them still receives TensorFusion pods, no toleration written.

Operators taint GPU nodes ``nvidia.com/gpu=present:NoSchedule`` so that ordinary pods stay off; the
webhook adds the chart's GPU tolerations (the NVIDIA taint by default) to every GPU pod. The taint is
put on the kubelet node for the scenario and always removed, since the cluster is shared.
"""

from __future__ import annotations

from kubernetes.client import CoreV1Api

from vgpu.names import Annotation

from .cluster import REAL_NODE, Cluster
from .kube import wait_running
from .pods import gpu_pod

NAMESPACE = "e2e-gpu-taint"
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def test_a_tainted_gpu_node_runs_gpu_pods_that_wrote_no_toleration(cluster: Cluster, core: CoreV1Api) -> None:
    ns = cluster.namespace(NAMESPACE)
    before = core.read_node(REAL_NODE).spec.taints or []
    kept = [core.api_client.sanitize_for_serialization(t) for t in before]
    core.patch_node(REAL_NODE, {"spec": {"taints": [*kept, TAINT]}})
    try:
        pod = gpu_pod("tolerated", {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "1Gi"})
        assert "tolerations" not in pod["spec"]
        core.create_namespaced_pod(ns, pod)
        running = wait_running(core, ns, "tolerated")
        assert running.spec.node_name == REAL_NODE
        added = [t for t in running.spec.tolerations or [] if t.key == "nvidia.com/gpu"]
        assert [(t.operator, t.effect) for t in added] == [("Exists", "NoSchedule")]
    finally:
        core.patch_node(REAL_NODE, {"spec": {"taints": kept or None}})
        core.delete_namespaced_pod("tolerated", ns, grace_period_seconds=0)
