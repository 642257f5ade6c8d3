"""Many pods at once onto the one kubelet node (4× A100), with and without the extender crashing.

What an operator checks afterwards: no GPU is promised more TFLOPS or VRAM than it has, every
running pod's container sees exactly the GPU share recorded on it, and pods still Pending are
Pending because the node is really full, not because capacity leaked.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from scheduler_extender.events import REASON_GRANTED
from vgpu.contract import allocation
from vgpu.names import Annotation
from vgpu.quantity import parse_bytes, parse_milli

from .cluster import REAL_NODE, Cluster
from .kube import eventually
from .pods import allocation_of, assert_grant_matches_allocation, created, gpu_pod

TFLOPS, VRAM = "30", "4Gi"  # 10 pods per A100 by TFLOPS (312), 20 by VRAM


def settle(core: CoreV1Api, namespace: str, count: int, timeout: float) -> list[Any]:
    """Wait until every pod is Running or unbound Pending, and stays so for 16 s.

    16 s is longer than kube-scheduler's longest retry backoff (podMaxBackoffSeconds, 10 s), so a
    pod still Pending then is one the scheduler really cannot place.
    """
    last: dict[str, list[str]] = {}
    stable = 0

    def probe() -> list[Any] | None:
        nonlocal last, stable
        pods = core.list_namespaced_pod(namespace).items
        state: dict[str, list[str]] = {}
        for p in pods:
            where = "bound" if p.spec.node_name else "unbound"
            why = f" ({p.status.reason}: {p.status.message})" if p.status.phase == "Failed" else ""
            state.setdefault(f"{p.status.phase}/{where}", []).append(p.metadata.name + why)
        settled = len(pods) == count and set(state) <= {"Running/bound", "Pending/unbound"}
        stable = stable + 1 if settled and state == last else 0
        last = state
        return pods if stable >= 4 else None

    try:
        return eventually(f"{count} pods in {namespace} settled", probe, timeout=timeout, every=4)
    except AssertionError as e:
        raise AssertionError(f"{e}; pods by phase: {last}") from None


def node_ledger(core: CoreV1Api) -> dict[str, tuple[int, int]]:
    """Per GPU UUID on the kubelet node: (TFLOPS milli, VRAM bytes) requested by live pods."""
    used: dict[str, tuple[int, int]] = {}
    for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={REAL_NODE}").items:
        text = (pod.metadata.annotations or {}).get(allocation.KEY)
        if not text or pod.status.phase in ("Succeeded", "Failed"):
            continue
        for grant in allocation.decode(text).gpus:
            t, v = used.get(grant.uuid, (0, 0))
            used[grant.uuid] = (t + grant.tflops_request, v + grant.vram_request)
    return used


def check_invariants(cluster: Cluster, core: CoreV1Api, pods: list[Any]) -> None:
    capacity = {g.uuid: (g.model.tflops_milli, g.model.memory_mib << 20) for g in cluster.gpus}
    used = node_ledger(core)
    for uuid, (tflops, vram) in used.items():
        assert tflops <= capacity[uuid][0] and vram <= capacity[uuid][1], f"{uuid} over-committed: {used[uuid]}"
    running = [p for p in pods if p.status.phase == "Running"]
    assert running, "no pod of the burst runs"
    for pod in running:
        alloc = allocation_of(pod)
        assert alloc.pod_uid == pod.metadata.uid and alloc.node == REAL_NODE
        sm_percent = 10  # TFLOPS (30, also the limit) of an A100's 312, rounded up
        assert_grant_matches_allocation(created(cluster.node, pod, "main"), alloc, sm_percent)
    if len(running) < len(pods):  # someone waits: then no GPU may have room for one more pod
        room = [u for u, (cap_t, cap_v) in capacity.items() if cap_t - used.get(u, (0, 0))[0] >= parse_milli(TFLOPS)
                and cap_v - used.get(u, (0, 0))[1] >= parse_bytes(VRAM)]  # fmt: skip
        assert not room, f"pods are Pending while GPUs {room} have room: capacity leaked"


def burst(core: CoreV1Api, namespace: str, count: int, pause: float = 0) -> None:
    share = {Annotation.TFLOPS_REQUEST: TFLOPS, Annotation.VRAM_REQUEST: VRAM}
    for i in range(count):
        core.create_namespaced_pod(namespace, gpu_pod(f"burst-{i:02d}", share))
        time.sleep(pause)


@pytest.mark.timeout(420)
def test_burst_of_50_never_overcommits_and_every_env_matches(cluster: Cluster, core: CoreV1Api, fresh: str) -> None:
    burst(core, fresh, 50)
    pods = settle(core, fresh, 50, timeout=300)
    check_invariants(cluster, core, pods)
    granted_once_each(core, fresh, [p for p in pods if p.spec.node_name])


def granted_once_each(core: CoreV1Api, namespace: str, bound: list[Any]) -> None:
    """Every bound pod of a burst gets exactly one GpuGranted Event, naming its own grant: none dropped behind the
    binds, none posted twice."""
    assert bound, "no pod was bound: nothing was tested"
    expected = {p.metadata.uid: allocation_of(p).describe() for p in bound}

    def granted() -> dict[str, list[str]] | None:
        found: dict[str, list[str]] = {}
        for e in core.list_namespaced_event(namespace, field_selector=f"reason={REASON_GRANTED}").items:
            found.setdefault(e.involved_object.uid, []).append(e.message)
        return found if set(found) >= set(expected) else None

    found = eventually(f"a {REASON_GRANTED} Event for each of the {len(bound)} bound pods", granted, timeout=30)
    assert found == {uid: [message] for uid, message in expected.items()}


@pytest.mark.timeout(420)
def test_extender_killed_mid_burst_loses_and_duplicates_nothing(cluster: Cluster, core: CoreV1Api, fresh: str) -> None:
    creating = threading.Thread(target=burst, args=(core, fresh, 30, 0.05))
    creating.start()

    def bound() -> int:
        return sum(bool(p.spec.node_name) for p in core.list_namespaced_pod(fresh).items)

    eventually("the first pods bound", lambda: bound() >= 3, every=0.05)
    cluster.ours["tf-extender"].kill()
    at_kill = bound()
    creating.join()
    assert at_kill < 30, "the burst was over before the extender died: nothing was tested"
    time.sleep(3)
    cluster.start_extender()
    pods = settle(core, fresh, 30, timeout=300)
    check_invariants(cluster, core, pods)
