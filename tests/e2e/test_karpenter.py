"""Karpenter (issue 31): a GPU-share pod that no node can hold makes the real Karpenter provision a GPU node,
and our scheduler binds the pod there with its grant — Karpenter's kwok provider (karpenter.py) on the real
binaries.

Karpenter sums a pending pod's requests and matches them against what its instance types declare; it reads
none of our annotations. Our webhook turns the annotations into the node resources
``tensor-fusion.ai/milli-tflops``, ``tensor-fusion.ai/vram`` and ``tensor-fusion.ai/vgpu`` on the pod, so an
instance type must declare them: here ``gpu-a100x2`` declares exactly what the device plugin publishes for two
A100s (vgpu.node_resources.node_capacity, and slices-per-GPU × 2 vGPUs), beside a cheaper ``c-8x`` that
declares none. The NodePool's template puts the node in the pool ``e2e-karpenter`` (our pool label) and the pod
selects that label, so no existing node matches it and Karpenter's simulation matches only nodes it launches.

The kwok provider creates the Node and nothing runs on it: the test plays its kubelet and our device plugin
(fake_nodes.publish_gpu_node, what add_fake_node writes for every kubelet-less GPU node) once Karpenter has
registered the node; Karpenter then marks it initialized (Ready, and the declared extended resources
allocatable) and kube-scheduler with our extender binds the pod to one of its GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiException, CoreV1Api, CustomObjectsApi
from kubernetes.utils import parse_quantity

from tf_shell.kube.client import api_client
from vgpu.names import LABEL_NODE_POOL, RESOURCE_MILLI_TFLOPS, RESOURCE_VGPU, RESOURCE_VRAM, SCHEDULER_NAME, Annotation
from vgpu.node_resources import node_capacity

from .cluster import Cluster
from .fake_nodes import SLICES_PER_GPU, fake_inventory, gpus, publish_gpu_node
from .karpenter import (
    GROUP,
    KWOK_GROUP,
    KWOK_VERSION,
    LABEL_NODEPOOL,
    UNREGISTERED_TAINT,
    VERSION,
    Karpenter,
    instance_type,
)
from .karpenter import built as karpenter_built
from .kube import apply, emptied, eventually
from .pods import allocation_of, gpu_pod

COLD_BUILD_TIMEOUT = 1800  # scripts/build-karpenter.sh cold: about 6 minutes on 2 cores
pytestmark = pytest.mark.timeout(300 if karpenter_built() else COLD_BUILD_TIMEOUT)

POOL, NODEPOOL, NODECLASS = "e2e-karpenter", "e2e-gpu-share", "e2e-kwok"
GPU_TYPE, CPU_TYPE = "gpu-a100x2", "c-8x"
GI = 1024**3
MACHINE = {"cpu": "32", "memory": "256Gi", "pods": "110"}


def gpu_instance_resources() -> dict[str, str]:
    """What an instance type with two A100s must declare: the device plugin's node resources for its GPUs."""
    inv = fake_inventory("template", gpus("template", 2), POOL)
    return MACHINE | node_capacity(inv) | {RESOURCE_VGPU: str(len(inv.gpus) * SLICES_PER_GPU)}


INSTANCE_TYPES = [
    instance_type(GPU_TYPE, 6.0, gpu_instance_resources()),
    instance_type(CPU_TYPE, 0.4, {"cpu": "8", "memory": "32Gi", "pods": "110"}),
]


def node_pool() -> list[dict[str, Any]]:
    """A KWOKNodeClass and a NodePool whose nodes join our pool ``POOL`` (the template's label)."""
    node_class = {"apiVersion": f"{KWOK_GROUP}/{KWOK_VERSION}", "kind": "KWOKNodeClass",
                  "metadata": {"name": NODECLASS}, "spec": {}}  # fmt: skip
    template = {
        "metadata": {"labels": {LABEL_NODE_POOL: POOL}},
        "spec": {
            "nodeClassRef": {"group": KWOK_GROUP, "kind": "KWOKNodeClass", "name": NODECLASS},
            "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}],
            "expireAfter": "Never",
        },
    }
    spec = {"template": template, "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never"}}
    pool = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodePool", "metadata": {"name": NODEPOOL}, "spec": spec}
    return [node_class, pool]


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", ()) if c["type"] == kind), {})


def node_claims(custom: CustomObjectsApi) -> list[dict[str, Any]]:
    items = custom.list_cluster_custom_object(
        GROUP, VERSION, "nodeclaims", label_selector=f"{LABEL_NODEPOOL}={NODEPOOL}"
    )
    return list(items["items"])


def pool_nodes(core: CoreV1Api) -> list[Any]:
    return list(core.list_node(label_selector=f"{LABEL_NODEPOOL}={NODEPOOL}").items)


def registered(core: CoreV1Api) -> Any:
    """The one node Karpenter launched, once its registration lifted the unregistered taint."""
    nodes = pool_nodes(core)
    if len(nodes) != 1:
        return None
    (node,) = nodes
    return None if any(t.key == UNREGISTERED_TAINT for t in node.spec.taints or ()) else node


@pytest.fixture(scope="module")
def karpenter(cluster: Cluster) -> Iterator[Karpenter]:
    """Karpenter for this module only; its log is shown with the cluster's when a test fails."""
    assert cluster.cp is not None
    running = Karpenter(cluster.admin, cluster.root / "karpenter", cluster.cp.kubeconfig("admin"), INSTANCE_TYPES)
    try:
        running.start()
        assert running.proc is not None
        cluster.ours["karpenter"] = running.proc
        yield running
    finally:
        running.stop()
        cluster.ours.pop("karpenter", None)


def cleaned(cluster: Cluster, namespace: str) -> None:
    """The pods, then the NodePool: Karpenter deletes its NodeClaims and their Nodes (finalizers and all)."""
    emptied(cluster.core, namespace)
    custom = CustomObjectsApi(cluster.admin)
    try:
        custom.delete_cluster_custom_object(GROUP, VERSION, "nodepools", NODEPOOL)
    except ApiException as exc:
        if exc.status != 404:
            raise
    eventually("Karpenter's NodeClaims gone", lambda: not node_claims(custom), timeout=90)
    eventually("Karpenter's Nodes gone", lambda: not pool_nodes(cluster.core), timeout=90)
    custom.delete_cluster_custom_object(KWOK_GROUP, KWOK_VERSION, "kwoknodeclasses", NODECLASS)


def test_a_pending_gpu_share_pod_gets_a_node_from_karpenter_and_its_grant_there(
    karpenter: Karpenter, cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    custom = CustomObjectsApi(cluster.admin)
    plugin = api_client(str(cluster.kubeconfigs["device-plugin"]))
    cluster.ensure_pool(POOL)
    apply(cluster.admin, node_pool())
    eventually("the NodePool Ready", lambda: condition(custom.get_cluster_custom_object(
        GROUP, VERSION, "nodepools", NODEPOOL), "Ready").get("status") == "True")  # fmt: skip
    assert node_claims(custom) == [] and pool_nodes(core) == []
    pod = gpu_pod("trainer", {Annotation.TFLOPS_REQUEST: "100", Annotation.VRAM_REQUEST: "20Gi",
                              Annotation.GPUPOOL: POOL})  # fmt: skip
    pod["spec"]["nodeSelector"] = {LABEL_NODE_POOL: POOL}  # what Karpenter matches against its NodePool's labels
    try:
        created = core.create_namespaced_pod(fresh, pod)
        (main,) = created.spec.containers  # our webhook: the shares as node resources, which Karpenter sums
        requests = {k: int(parse_quantity(v)) for k, v in main.resources.requests.items()}
        assert requests == {RESOURCE_MILLI_TFLOPS: 100_000, RESOURCE_VRAM: 20 * GI, RESOURCE_VGPU: 1}, requests

        started = time.monotonic()
        node = eventually("Karpenter's node registered", lambda: registered(core), timeout=90)
        launched = time.monotonic() - started
        name = node.metadata.name
        assert node.metadata.labels["node.kubernetes.io/instance-type"] == GPU_TYPE  # not the cheaper CPU type
        assert node.metadata.labels[LABEL_NODE_POOL] == POOL
        assert core.read_namespaced_pod("trainer", fresh).spec.node_name is None  # nothing to place it on yet

        fake = gpus(name, 2)
        inv = fake_inventory(name, fake, POOL)
        publish_gpu_node(cluster.admin, plugin, inv, MACHINE)  # the kubelet and our device plugin on the new node

        def bound() -> Any:
            p = core.read_namespaced_pod("trainer", fresh)
            return p if p.spec.node_name else None

        placed = eventually("the pod bound", bound, timeout=90)
        (claim,) = eventually(
            "the NodeClaim Initialized",
            lambda: [c for c in node_claims(custom) if condition(c, "Initialized").get("status") == "True"] or None,
            timeout=60,
        )
        print(f"\nKarpenter: node {name} ({GPU_TYPE}) registered {launched:.1f}s after the pod was created")
        assert claim["status"]["nodeName"] == name
        assert claim["metadata"]["labels"]["node.kubernetes.io/instance-type"] == GPU_TYPE
        assert placed.spec.scheduler_name == SCHEDULER_NAME and placed.spec.node_name == name
        grant = allocation_of(placed)
        assert grant.pool == POOL and len(grant.gpus) == 1, grant
        assert grant.gpus[0].uuid in {g.uuid for g in fake}
        assert (grant.gpus[0].tflops_request, grant.gpus[0].vram_request) == (100_000, 20 * GI)

        time.sleep(5)  # a second batch window: the bound pod asks for nothing more
        assert len(node_claims(custom)) == 1 and len(pool_nodes(core)) == 1
    finally:
        cleaned(cluster, fresh)
