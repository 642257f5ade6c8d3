"""``kubectl describe node`` on the kubelet node: our device plugin registered and published its GPUs."""

from __future__ import annotations

from kubernetes.client import CoreV1Api

from vgpu.contract import inventory
from vgpu.names import DEFAULT_POOL, LABEL_NODE_GPU_COUNT, LABEL_NODE_POOL, RESOURCE_VGPU

from .cluster import REAL_NODE, Cluster
from .fake_nodes import SLICES_PER_GPU


def test_node_advertises_vgpu_slices_and_publishes_its_gpu_inventory(cluster: Cluster, core: CoreV1Api) -> None:
    node = core.read_node(REAL_NODE)
    assert node.status.capacity[RESOURCE_VGPU] == str(len(cluster.gpus) * SLICES_PER_GPU)
    assert node.status.allocatable[RESOURCE_VGPU] == str(len(cluster.gpus) * SLICES_PER_GPU)
    inv = inventory.decode(node.metadata.annotations[inventory.KEY])
    assert inv.node == REAL_NODE and inv.pool == DEFAULT_POOL
    assert [(g.uuid, g.model) for g in inv.gpus] == [(g.uuid, g.model.key) for g in cluster.gpus]
    assert all(g.tflops == cluster.gpus[0].model.tflops_milli for g in inv.gpus)
    assert node.metadata.labels[LABEL_NODE_POOL] == DEFAULT_POOL
    assert node.metadata.labels[LABEL_NODE_GPU_COUNT] == str(len(cluster.gpus))
