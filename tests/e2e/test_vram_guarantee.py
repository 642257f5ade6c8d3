"""A VRAM request is guaranteed once limits exceed it (issue "A tenant cannot lift its own limits", part 4).

Measured before: a tenant workload with ``autoSetLimits.maxRatioToRequests: 100`` under load had its limits raised
to 312 TFLOPS and 19.35 GiB in 9 s; a pod placed later on the same GPU was counted against the hog's *request*
only, so the hog's VRAM limit and its neighbours' requests passed the GPU's memory by 7.35 GiB. Compute is shared
by time; memory is not: a neighbour that allocates second simply fails. The rule now (docs/autoscaling.md, "A VRAM
request is guaranteed"): on one GPU, the sum over its pods of max(VRAM request, VRAM limit) never exceeds its
memory — placement counts each pod's limit, the autoscaler raises a VRAM limit only into what the GPU's other pods
leave free (``CappedByOtherPods``), and a later pod that does not fit beside the raised limit is not placed there.

On the kubelet node (four 80Gi A100s):

1. a neighbour asks 20Gi with a 30Gi limit and lands on some GPU G;
2. fillers take the room of every other GPU of the node, so what follows can only go to G;
3. a hog Deployment (10 TFLOPS and 1Gi, limits equal) under a WorkloadProfile enabling autoSetLimits for both
   resources (maxRatioToRequests 100, evaluated every second) lands on G; its pod's use is scripted in the fake
   GPU file at the whole GPU's SMs (100 %) and all the memory its limit lets it hold, pressing on it;
4. its limits double each period: TFLOPS up to the GPU's 312 (over-subscribed, as before), VRAM only up to what
   G's other pods leave free — 80Gi less the neighbour's 30Gi *limit* (its 20Gi request would leave 60) — with a
   ``CappedByOtherPods`` event and the workload's ``LimitsAutoSet`` condition saying so;
5. a late pod asking 10Gi stays Pending with the VRAM reason: nothing lowers the hog, the pod simply does not fit;
6. once the hog is gone, the late pod is placed on G.

Throughout, a watcher lists the node's allocations (every namespace) every 0.2 s and checks every GPU of the
node: the sum of max(VRAM request, VRAM limit) over its pods never exceeds its memory.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes.client import AppsV1Api, CoreV1Api, CustomObjectsApi

from scheduler_extender.autoscaler import checkpoints
from scheduler_extender.objects import allocated_node_label
from vgpu.contract.allocation import PodAllocation
from vgpu.names import CRD_GROUP, CRD_VERSION, LABEL_ALLOCATED_NODE, PLURAL_WORKLOAD, Annotation, SystemAnnotation

from . import deploy
from .autoscaling import Load, deployment
from .cluster import REAL_NODE, Cluster
from .fake_nodes import MIB
from .kube import apply, emptied, events_for, eventually, wait_running
from .pods import allocation_of, gpu_pod

NAMESPACE = "e2e-vram-guarantee"
HOG = "hog"
GI = 1024**3
TERMINAL = ("Succeeded", "Failed")
PROFILE = {
    "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}",
    "kind": "WorkloadProfile",
    "metadata": {"name": "burst", "namespace": NAMESPACE},
    "spec": {
        "autoScalingConfig": {
            "autoSetLimits": {
                "enable": True,
                "targetResource": "all",
                "evaluationPeriod": "1s",
                "maxRatioToRequests": "100",
            },
        }
    },
}
ON_THE_NODE = {"kubernetes.io/hostname": REAL_NODE}


def held(alloc: PodAllocation) -> dict[str, int]:
    """The VRAM a pod holds on each of its GPUs: the larger of its request and its limit."""
    return {g.uuid: max(g.vram_request, g.vram_limit) for g in alloc.gpus}


def allocations(core: CoreV1Api) -> list[tuple[Any, PodAllocation]]:
    """Every live pod of every namespace holding an allocation on the kubelet node, with it."""
    selector = f"{LABEL_ALLOCATED_NODE}={allocated_node_label(REAL_NODE)}"
    pods = core.list_pod_for_all_namespaces(label_selector=selector).items
    out = []
    for pod in pods:
        if pod.status.phase in TERMINAL or not (pod.metadata.annotations or {}).get(SystemAnnotation.ALLOCATION):
            continue
        alloc = allocation_of(pod)
        if alloc.node == REAL_NODE:
            out.append((pod, alloc))
    return out


def held_per_gpu(core: CoreV1Api, *, without: str | None = None) -> dict[str, int]:
    """Per GPU of the node, the VRAM its pods hold (``without``: leaving that pod UID out)."""
    totals: dict[str, int] = {}
    for pod, alloc in allocations(core):
        if pod.metadata.uid != without:
            for uuid, amount in held(alloc).items():
                totals[uuid] = totals.get(uuid, 0) + amount
    return totals


class Watcher:
    """Checks the rule every 0.2 s on every GPU of the node, from consistent lists of its allocations."""

    def __init__(self, core: CoreV1Api, capacity: dict[str, int]) -> None:
        self.core, self.capacity = core, capacity
        self.peak: dict[str, int] = {}
        self.violations: list[str] = []
        self.lists = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def holds(self) -> None:
        """Fail at once, naming the GPU and its pods, once the rule was seen broken."""
        assert not self.violations, f"a GPU's pods hold more VRAM than it has: {self.violations[:3]}"

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # an API hiccup: the next list checks again
                self._check()
            self._stop.wait(0.2)

    def _check(self) -> None:
        found = allocations(self.core)
        totals: dict[str, int] = {}
        for _, alloc in found:
            for uuid, amount in held(alloc).items():
                totals[uuid] = totals.get(uuid, 0) + amount
        self.lists += 1
        for uuid, total in totals.items():
            self.peak[uuid] = max(self.peak.get(uuid, 0), total)
            if total > self.capacity[uuid]:
                shares = [
                    f"{pod.metadata.namespace}/{pod.metadata.name} {g.vram_request / GI:g}/{g.vram_limit / GI:g}Gi"
                    for pod, alloc in found
                    for g in alloc.gpus
                    if g.uuid == uuid
                ]
                self.violations.append(f"{uuid}: {total / GI:g}Gi held of {self.capacity[uuid] / GI:g}Gi: {shares}")


def hog_deployment() -> dict[str, Any]:
    annotations = {
        Annotation.TFLOPS_REQUEST: "10",
        Annotation.TFLOPS_LIMIT: "10",
        Annotation.VRAM_REQUEST: "1Gi",
        Annotation.VRAM_LIMIT: "1Gi",
        Annotation.WORKLOAD_PROFILE: "burst",
        Annotation.WORKLOAD: HOG,
        Annotation.GENERATE_WORKLOAD: "true",
    }
    return deployment(HOG, NAMESPACE, annotations, ON_THE_NODE)


def pinned_pod(name: str, annotations: Mapping[Annotation | str, str]) -> dict[str, Any]:
    pod = gpu_pod(name, annotations)
    pod["spec"]["nodeSelector"] = ON_THE_NODE
    return pod


def fill_all_but(core: CoreV1Api, keep: str, capacity: dict[str, int]) -> None:
    """Fillers asking exactly the VRAM left on the node's other GPUs, the roomiest first, until none has 1Gi free.
    A filler fits only a GPU with that much free, and ``keep`` has less (checked), so it never lands there."""
    for i in range(2 * len(capacity)):
        taken = held_per_gpu(core)
        free = {uuid: cap - taken.get(uuid, 0) for uuid, cap in capacity.items()}
        rest = {uuid: room for uuid, room in free.items() if uuid != keep and room >= GI}
        if not rest:
            return
        room = max(rest.values())
        assert room > free[keep], f"the node is too busy for this scenario: free VRAM per GPU {free}"
        name = f"filler-{i}"
        core.create_namespaced_pod(
            NAMESPACE, pinned_pod(name, {Annotation.TFLOPS_REQUEST: "1", Annotation.VRAM_REQUEST: str(room)})
        )
        placed = allocation_of(wait_running(core, NAMESPACE, name)).gpus[0].uuid
        assert placed != keep and free[placed] == room, (name, placed, free)
    raise AssertionError("the node's GPUs were not filled")


def hog_pod(core: CoreV1Api) -> Any | None:
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"app={HOG}").items
    live = [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    return live[0] if len(live) == 1 else None


def scheduled_message(pod: Any) -> str:
    conditions = {c.type: c for c in (pod.status.conditions or [])}
    scheduled = conditions.get("PodScheduled")
    return "" if scheduled is None else f"{scheduled.status} {scheduled.reason}: {scheduled.message}"


@pytest.fixture
def namespace(cluster: Cluster, core: CoreV1Api) -> Iterator[str]:
    """The namespace and the profile; tf-metrics started, which also gives the device plugin's metrics Service its
    EndpointSlice: the extender's autoscaler finds the plugin's ``/usage`` through it."""
    cluster.start_metrics_api()
    cluster.namespace(NAMESPACE)
    apply(cluster.admin, [PROFILE], NAMESPACE)
    try:
        yield NAMESPACE
    finally:
        with contextlib.suppress(Exception):
            AppsV1Api(cluster.admin).delete_namespaced_deployment(HOG, NAMESPACE, propagation_policy="Foreground")
        emptied(core, NAMESPACE)
        # The autoscaler's checkpoint of the hog's histograms outlives it: scenarios after this one count them.
        system = deploy.system_namespace()
        for kept in core.list_namespaced_config_map(system, label_selector=checkpoints.SELECTOR).items:
            if (kept.metadata.annotations or {}).get(checkpoints.WORKLOAD_ANNOTATION) == f"{NAMESPACE}/{HOG}":
                core.delete_namespaced_config_map(kept.metadata.name, system)
        cluster.stop_metrics_api()


@pytest.mark.timeout(600)
def test_a_raised_vram_limit_is_held_so_a_later_neighbour_is_not_placed_beside_it(
    cluster: Cluster, core: CoreV1Api, namespace: str
) -> None:
    apps = AppsV1Api(cluster.admin)
    capacity = {g.uuid: g.model.memory_mib * MIB for g in cluster.gpus}
    with Watcher(core, capacity) as watcher:
        # 1. The neighbour: 20Gi requested, a 30Gi limit it may allocate up to at any moment.
        core.create_namespaced_pod(
            namespace,
            pinned_pod(
                "neighbour",
                {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "20Gi", Annotation.VRAM_LIMIT: "30Gi"},
            ),
        )
        gpu = allocation_of(wait_running(core, namespace, "neighbour")).gpus[0].uuid
        # 2. Every other GPU of the node filled: what follows can only go to the neighbour's GPU.
        fill_all_but(core, gpu, capacity)

        # The hog at the whole GPU's SMs and at its VRAM limit, whatever it is raised to.
        with Load(cluster, 100, app=HOG, namespace=NAMESPACE, vram_mib=None):
            # 3. The hog lands beside the neighbour and presses on its limits.
            apps.create_namespaced_deployment(namespace, hog_deployment())
            hog = eventually("the hog running", lambda: hog_pod(core), 90)
            (grant,) = allocation_of(hog).gpus
            assert grant.uuid == gpu and (grant.vram_request, grant.vram_limit) == (GI, GI)

            # 4. Its VRAM limit rises into what the GPU's other pods leave free, and no further.
            def capped() -> tuple[Any, int] | None:
                watcher.holds()
                pod = hog_pod(core)
                if pod is None:
                    return None
                others = held_per_gpu(core, without=pod.metadata.uid).get(gpu, 0)
                return (pod, others) if allocation_of(pod).gpus[0].vram_limit == capacity[gpu] - others else None

            hog, others = eventually("the hog's VRAM limit at what the other pods leave free", capped, 90, 0.5)
            assert others >= 30 * GI  # the neighbour counts by its 30Gi limit (its 20Gi request would leave 60)
            raised = [e for e in events_for(core, namespace, hog.metadata.name) if e.startswith("CappedByOtherPods")]
            assert raised and f"GPU {gpu}: vram limit raised to" in raised[0], raised
            assert "what the GPU's other pods leave free" in raised[0]

            # Compute stays over-subscribable: its TFLOPS limit reaches the whole GPU beside the neighbour's.
            eventually(
                "the hog's TFLOPS limit at the GPU's 312",
                lambda: (p := hog_pod(core)) is not None and allocation_of(p).gpus[0].tflops_limit == 312_000,
                60,
                0.5,
            )

            def said() -> dict[str, Any] | None:
                obj = CustomObjectsApi(cluster.admin).get_namespaced_custom_object(
                    CRD_GROUP, CRD_VERSION, namespace, PLURAL_WORKLOAD, HOG
                )
                found = [c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == "LimitsAutoSet"]
                return found[0] if found and found[0]["reason"] == "CappedByOtherPods" else None

            condition = eventually("the workload's LimitsAutoSet condition says CappedByOtherPods", said, 30, 0.5)
            assert "what the GPU's other pods leave free" in condition["message"]

            # 5. A late pod asking 10Gi: the hog's raised limit is counted, so it waits; nothing lowers the hog.
            core.create_namespaced_pod(
                namespace, pinned_pod("late", {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "10Gi"})
            )

            def unschedulable() -> Any | None:
                watcher.holds()
                pod = core.read_namespaced_pod("late", namespace)
                assert pod.spec.node_name is None, f"placed beside the hog's raised limit: {pod.spec.node_name}"
                return pod if "VRAM" in scheduled_message(pod) else None

            pending = eventually("the late pod unschedulable for VRAM", unschedulable, 60, 0.5)
            assert pending.spec.node_name is None, scheduled_message(pending)
            stop = threading.Event()
            stop.wait(8)  # several more scheduling attempts
            late = core.read_namespaced_pod("late", namespace)
            assert late.spec.node_name is None, f"placed beside the hog's raised limit: {scheduled_message(late)}"
            still = hog_pod(core)
            assert still is not None and allocation_of(still).gpus[0].vram_limit == capacity[gpu] - others

            # 6. The hog goes: its room is free again, and the late pod is placed there.
            apps.delete_namespaced_deployment(HOG, namespace, propagation_policy="Foreground")
            placed = wait_running(core, namespace, "late", 120)
            assert allocation_of(placed).gpus[0].uuid == gpu

    assert watcher.lists > 20, "the watcher hardly ran"
    watcher.holds()
    # The hog's raise filled the GPU exactly, never past it.
    assert watcher.peak[gpu] == capacity[gpu], (watcher.peak, capacity)
