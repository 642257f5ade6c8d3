"""A team's manifests written for NVIDIA's device plugin, unchanged, in a namespace labelled for migration.

The namespace gets ``tensor-fusion.ai/migrate-nvidia-gpu: "true"``; a seed-style Deployment whose
container asks for ``nvidia.com/gpu: 1`` (deploy/examples' seed with NVIDIA's resource instead of our
annotations) runs as tensor-fusion pods: the shipped webhook configuration's migration entry
translated them (our label and annotations, no NVIDIA resource, our scheduler), the admission policy
let them through, kube-scheduler bound each through our extender to a whole A100 of the kubelet node
(a grant of the GPU's full capacity, a different GPU each), and the kubelet created each container
with its GPU and limits. The API server hands the creator the webhook's warning naming what was
translated. Untouched by us: a pod created before the namespace was labelled (admission sees creates
only), a pod labelled ``tensor-fusion.ai/enabled: "false"``, and a pod of an unlabelled namespace.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import AppsV1Api, CoreV1Api

from vgpu.contract import resolved
from vgpu.names import (
    LABEL_ENABLED,
    LABEL_MIGRATE_NVIDIA,
    NVIDIA_GPU,
    RESOURCE_VGPU,
    SCHEDULER_NAME,
    Annotation,
    MigrationMode,
    SystemAnnotation,
)

from .cluster import REAL_NODE, Cluster
from .kube import eventually, wait_running_pods
from .pods import IMAGE, allocation_of, assert_grant_matches_allocation, created

NAMESPACE = "e2e-migration"
UNLABELLED = "e2e-migration-off"
NAME = "pytorch-nvidia"
REPLICAS = 2
NVIDIA_ONE = {"limits": {NVIDIA_GPU: "1"}}


def nvidia_pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod as NVIDIA's device plugin is used: one whole GPU through the container's limits."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {
            "containers": [{"name": "python", "image": IMAGE, "resources": NVIDIA_ONE}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def seed_style_deployment() -> dict[str, Any]:
    """deploy/examples' seed Deployment with ``nvidia.com/gpu: 1`` in place of our label and annotations.
    The node selector keeps it off kubelet-less fake nodes other scenarios may have put in the default pool."""
    pod = nvidia_pod(NAME)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": NAME}},
            "template": {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]},
        },
    }


def warnings_of(headers: Any) -> list[str]:
    """The texts of the API server's ``Warning: 299 - "<text>"`` headers."""
    texts = []
    for value in headers.getlist("Warning"):
        assert value.startswith('299 - "') and value.endswith('"'), value
        texts.append(value[len('299 - "') : -1].replace('\\"', '"').replace("\\\\", "\\"))
    return texts


@pytest.fixture(scope="module")
def migrated(cluster: Cluster) -> Iterator[str]:
    """The labelled namespace, with a pod that asked for ``nvidia.com/gpu`` before the label came (Pending:
    no node advertises NVIDIA's resource here); emptied afterwards, so the node's GPUs are free again."""
    core = cluster.core
    ns = cluster.namespace(NAMESPACE)
    core.create_namespaced_pod(ns, nvidia_pod("before-the-label"))
    core.patch_namespace(ns, {"metadata": {"labels": {LABEL_MIGRATE_NVIDIA: MigrationMode.WHOLE.value}}})
    yield ns
    AppsV1Api(cluster.admin).delete_collection_namespaced_deployment(ns)
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    eventually(f"pods of {ns} gone", lambda: not core.list_namespaced_pod(ns).items, timeout=120)


def test_a_seed_style_nvidia_gpu_deployment_runs_as_tensor_fusion_pods_on_whole_gpus(
    cluster: Cluster, core: CoreV1Api, migrated: str
) -> None:
    AppsV1Api(cluster.admin).create_namespaced_deployment(migrated, seed_style_deployment())
    pods = wait_running_pods(core, migrated, f"app={NAME}", REPLICAS)
    gpus = set()
    for pod in pods:
        assert pod.metadata.labels[LABEL_ENABLED] == "true"
        annotations = pod.metadata.annotations
        assert {k: annotations[k] for k in (Annotation.GPU_COUNT, Annotation.DEDICATED_GPU)} == {
            Annotation.GPU_COUNT: "1",
            Annotation.DEDICATED_GPU: "true",
        }
        (container,) = pod.spec.containers
        assert container.resources.limits == container.resources.requests == {RESOURCE_VGPU: "1"}
        assert pod.spec.scheduler_name == SCHEDULER_NAME and pod.spec.node_name == REAL_NODE
        request = resolved.decode(annotations[SystemAnnotation.RESOLVED_REQUEST])
        assert (request.dedicated_gpu, request.containers) == (True, ("python",))
        alloc = allocation_of(pod)  # written by the extender at bind
        assert alloc.pod_uid == pod.metadata.uid and alloc.node == REAL_NODE
        (grant,) = alloc.gpus
        assert grant.tflops_request == grant.tflops_limit == grant.gpu_tflops == 312_000  # the whole A100
        (gpu,) = [g for g in cluster.gpus if g.uuid == grant.uuid]
        assert grant.vram_request == grant.vram_limit == gpu.model.memory_mib << 20
        assert_grant_matches_allocation(created(cluster.node, pod, "python"), alloc, sm_percent=100)
        gpus.add(grant.uuid)
    assert len(gpus) == REPLICAS  # whole GPUs are never shared
    before = core.read_namespaced_pod("before-the-label", migrated)
    assert LABEL_ENABLED not in (before.metadata.labels or {}) and before.spec.scheduler_name == "default-scheduler"
    assert before.spec.containers[0].resources.limits == {NVIDIA_GPU: "1"}


def test_the_creator_is_warned_of_what_was_translated(core: CoreV1Api, migrated: str) -> None:
    created, _, headers = core.create_namespaced_pod_with_http_info(migrated, nvidia_pod("warned"), dry_run="All")
    assert warnings_of(headers) == [
        f'namespace label {LABEL_MIGRATE_NVIDIA}: "true": translated container "python" nvidia.com/gpu: 1 to the label '
        f'{LABEL_ENABLED}: "true", {Annotation.GPU_COUNT}: "1", {Annotation.DEDICATED_GPU}: "true", '
        f'{Annotation.INJECT_CONTAINER}: "python" (1 whole GPU)'
    ]
    assert created.spec.containers[0].resources.limits == {RESOURCE_VGPU: "1"}


def test_a_pod_labelled_false_and_a_pod_of_an_unlabelled_namespace_keep_nvidia_gpus(
    cluster: Cluster, core: CoreV1Api, migrated: str
) -> None:
    opted_out = nvidia_pod("opted-out", labels={LABEL_ENABLED: "false"})
    created = [core.create_namespaced_pod_with_http_info(migrated, opted_out, dry_run="All")]
    plain = cluster.namespace(UNLABELLED)
    created.append(core.create_namespaced_pod_with_http_info(plain, nvidia_pod("plain"), dry_run="All"))
    for pod, _, headers in created:
        assert warnings_of(headers) == []
        assert pod.spec.containers[0].resources.limits == {NVIDIA_GPU: "1"}
        assert pod.spec.scheduler_name == "default-scheduler"
        assert not (pod.metadata.annotations or {})
