"""The kubelet node: our device plugin registered with the real kubelet and published its GPUs,
follows a GPU's health both ways, and survives the kubelet or itself restarting under running GPU
pods (an upgrade, a crash).

On restart the kubelet wipes every socket in its device-plugin directory and makes a new kubelet.sock; our
device plugin must notice, serve and register again; so must the plugin itself when it is killed
(a crash) and started again. What an operator checks: the node's vGPU capacity comes back, pods
that were running keep running with the containers and allocation they had (no new
CreateContainer for them), and new GPU pods are admitted again with the env of their grant.
A GPU whose health check fails leaves the node's allocatable (the kubelet counts only healthy
devices) and is marked Unhealthy in the inventory the extender places from, until it heals.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client import CoreV1Api

from vgpu.contract import allocation, inventory
from vgpu.names import DEFAULT_POOL, LABEL_NODE_GPU_COUNT, LABEL_NODE_POOL, RESOURCE_VGPU, Annotation

from .cluster import REAL_NODE, Cluster, vgpu_allocatable
from .fake_nodes import SLICES_PER_GPU
from .kube import emptied, eventually, wait_running
from .pods import allocation_of, assert_grant_matches_allocation, created, gpu_pod

NAMESPACE = "e2e-kubelet-restart"
SHARE = {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "1Gi"}
SM_PERCENT = 4  # SHARE's 10 TFLOPS (its limit too) of an A100's 312, rounded up


@pytest.fixture(scope="module", autouse=True)
def _node_left_as_found(cluster: Cluster) -> Iterator[None]:
    yield
    emptied(cluster.core, NAMESPACE)


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
    assert_grant_matches_allocation(created(cluster.node, after, "main"), allocation_of(after), sm_percent=SM_PERCENT)


def gpu_state(core: CoreV1Api) -> tuple[int, int, dict[str, str]]:
    """(vGPU capacity, vGPU allocatable, health per GPU UUID in the inventory) of the kubelet node."""
    node = core.read_node(REAL_NODE)
    inv = inventory.decode(node.metadata.annotations[inventory.KEY])
    vgpu = (int(node.status.capacity.get(RESOURCE_VGPU, "0")), int(node.status.allocatable.get(RESOURCE_VGPU, "0")))
    return (*vgpu, {g.uuid: g.health.value for g in inv.gpus})


def wait_gpu_state(core: CoreV1Api, expected: tuple[int, int, dict[str, str]], what: str) -> None:
    last = None

    def reached() -> bool:
        nonlocal last
        last = gpu_state(core)
        return last == expected

    try:
        eventually(what, reached, timeout=60)
    except AssertionError as e:
        raise AssertionError(f"{e}; (capacity, allocatable, health) seen last: {last}") from None


def test_failing_gpu_leaves_allocatable_and_is_marked_unhealthy_until_it_heals(
    cluster: Cluster, core: CoreV1Api
) -> None:
    total = len(cluster.gpus) * SLICES_PER_GPU
    sick = cluster.gpus[-1].uuid
    healthy = {g.uuid: inventory.Health.HEALTHY.value for g in cluster.gpus}
    assert gpu_state(core) == (total, total, healthy)

    cluster.set_gpu_faults({sick: "fell off the bus"})
    try:
        # The kubelet keeps the unhealthy GPU's slices in capacity and takes them out of allocatable.
        unhealthy = {**healthy, sick: inventory.Health.UNHEALTHY.value}
        wait_gpu_state(core, (total, total - SLICES_PER_GPU, unhealthy), f"{sick} out of allocatable, Unhealthy")
    finally:
        cluster.set_gpu_faults({})
    wait_gpu_state(core, (total, total, healthy), f"{sick} back in allocatable, Healthy")

    def node_events() -> list[tuple[str, str]] | None:
        found = core.list_namespaced_event("default", field_selector=f"involvedObject.name={REAL_NODE}").items
        ours = sorted(((e.metadata.creation_timestamp, e.reason, e.type, e.message) for e in found
                       if e.reason in ("GpuUnhealthy", "GpuHealthy") and sick in e.message), key=lambda x: x[0])  # fmt: skip
        return [(reason, kind) for _, reason, kind, _ in ours] if len(ours) >= 2 else None

    # What `kubectl describe node` shows: when the GPU left service and why, and when it came back.
    assert eventually("GPU health events on the node", node_events, timeout=30)[-2:] == [
        ("GpuUnhealthy", "Warning"),
        ("GpuHealthy", "Normal"),
    ]


def test_killed_plugin_comes_back_and_running_pods_keep_their_allocation(cluster: Cluster, core: CoreV1Api) -> None:
    assert cluster.node is not None
    ns = cluster.namespace(NAMESPACE)
    core.create_namespaced_pod(ns, gpu_pod("before-plugin-crash", SHARE))
    before = wait_running(core, ns, "before-plugin-crash")
    granted = before.metadata.annotations[allocation.KEY]
    creates_before = len(cluster.node.creates())
    capacity = vgpu_allocatable(core)
    assert capacity == len(cluster.gpus) * SLICES_PER_GPU

    cluster.ours["tf-device-plugin"].kill()
    # The kubelet saw its ListAndWatch stream break: every slice is unhealthy, none allocatable.
    eventually("no vGPU allocatable while the plugin is down", lambda: vgpu_allocatable(core) == 0, timeout=60)
    cluster.start_device_plugin()

    eventually("vGPU capacity back on the node", lambda: vgpu_allocatable(core) == capacity, timeout=90)
    now = core.read_namespaced_pod("before-plugin-crash", ns)
    assert now.metadata.uid == before.metadata.uid and now.status.phase == "Running"
    assert now.status.container_statuses[0].restart_count == 0
    assert now.metadata.annotations[allocation.KEY] == granted
    assert all(r["podUid"] != before.metadata.uid for r in cluster.node.creates()[creates_before:])

    core.create_namespaced_pod(ns, gpu_pod("after-plugin-crash", SHARE))
    after = wait_running(core, ns, "after-plugin-crash")
    assert_grant_matches_allocation(created(cluster.node, after, "main"), allocation_of(after), sm_percent=SM_PERCENT)
