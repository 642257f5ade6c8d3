"""More small GPU pods than the kubelet node has vGPU slots: the extra ones wait Pending, none fails.

The node advertises (GPUs × slices) device IDs of tensor-fusion.ai/vgpu, and the kubelet fails for
good any pod it cannot give its IDs (``requested number of devices unavailable``), however little
TFLOPS and VRAM the pod asks. So the extender counts the slots: it binds exactly as many 1-GPU pods
as there are free slots (those other scenarios' pods on the node hold are not), no GPU gets more
pods than its slices, and the rest stay Pending with the slot reason in their PodScheduled
condition, until deleting some makes room and they run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from vgpu.contract import allocation, inventory
from vgpu.names import RESOURCE_VGPU, Annotation

from .cluster import REAL_NODE, Cluster
from .kube import eventually
from .pods import allocation_of, gpu_pod
from .test_burst import settle

EXTRA = 16  # pods beyond the node's slots
SHARE = {Annotation.TFLOPS_REQUEST: "1", Annotation.VRAM_REQUEST: "256Mi"}  # 312 per A100 by TFLOPS, 320 by VRAM
FREED = 8  # running pods deleted to make room


@pytest.fixture
def namespace(cluster: Cluster, core: CoreV1Api) -> Iterator[str]:
    """A namespace of its own, emptied afterwards so the node's slots are free for the next scenario."""
    name = cluster.namespace("e2e-slots")
    yield name
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    eventually(f"pods of {name} gone", lambda: not core.list_namespaced_pod(name).items, timeout=180)


def small_pod(i: int) -> dict[str, Any]:
    pod = gpu_pod(f"small-{i:03d}", SHARE)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    return pod


def by_phase(pods: list[Any]) -> Counter[str]:
    return Counter(f"{p.status.phase}/{'bound' if p.spec.node_name else 'unbound'}" for p in pods)


def scheduled_message(pod: Any) -> str:
    conditions = {c.type: c for c in (pod.status.conditions or [])}
    scheduled = conditions.get("PodScheduled")
    return "" if scheduled is None else f"{scheduled.reason}: {scheduled.message}"


def on_node(core: CoreV1Api) -> list[Any]:
    """Every live pod bound to the kubelet node, of any namespace."""
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={REAL_NODE}").items
    return [p for p in pods if p.status.phase not in ("Succeeded", "Failed")]


def held_ids(pod: Any) -> int:
    """The vGPU IDs a pod of the other scenarios holds: one GPU container each, so its limits add up."""
    limits = [(c.resources.limits or {}) if c.resources else {} for c in pod.spec.containers]
    return sum(int(limit.get(RESOURCE_VGPU, "0")) for limit in limits)


def check_slots_per_gpu(core: CoreV1Api, slices: int) -> None:
    mine = [p for p in on_node(core) if (p.metadata.annotations or {}).get(allocation.KEY)]
    per_gpu = Counter(g.uuid for p in mine for g in allocation_of(p).gpus)
    assert max(per_gpu.values()) <= slices, f"a GPU holds more pods than its {slices} slices: {per_gpu}"


@pytest.mark.timeout(900)
def test_pods_beyond_the_nodes_slots_wait_pending_and_run_once_room_is_made(
    cluster: Cluster, core: CoreV1Api, namespace: str
) -> None:
    node = core.read_node(REAL_NODE)
    published = inventory.decode(node.metadata.annotations[inventory.KEY])
    slots = int(node.status.allocatable[RESOURCE_VGPU])
    assert slots == published.slices_per_gpu * len(published.gpus) > 0  # the inventory says what the kubelet counts
    free = slots - sum(held_ids(p) for p in on_node(core))  # other scenarios may leave pods (the seed Deployment)
    assert free > FREED
    count = free + EXTRA

    for i in range(count):
        core.create_namespaced_pod(namespace, small_pod(i))
    pods = settle(core, namespace, count, timeout=720)

    assert by_phase(pods) == {"Running/bound": free, "Pending/unbound": EXTRA}  # 0 Failed
    running = [p for p in pods if p.status.phase == "Running"]
    check_slots_per_gpu(core, published.slices_per_gpu)
    reason = f"insufficient {RESOURCE_VGPU} slots on node {REAL_NODE}: requested 1, free 0 of {slots}"
    pending = [p for p in pods if p.status.phase == "Pending"]
    waiting = [scheduled_message(p) for p in pending]
    assert all(m.startswith("Unschedulable: ") and reason in m for m in waiting), waiting

    for pod in running[:FREED]:
        core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    pods = settle(core, namespace, count - FREED, timeout=300)

    assert by_phase(pods) == {"Running/bound": free, "Pending/unbound": EXTRA - FREED}
    names = {p.metadata.name for p in pods if p.status.phase == "Running"}
    assert len(names & {p.metadata.name for p in pending}) == FREED  # the waiting pods took the room
    check_slots_per_gpu(core, published.slices_per_gpu)
