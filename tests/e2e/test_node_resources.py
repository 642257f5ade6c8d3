"""GPU shares as node resources (issue 13): what kube-scheduler, the quota system and `describe node` see.

The device plugin advertises each node's TFLOPS and VRAM totals as extended resources and the webhook
puts each pod's shares on its GPU container, so:
- the kubelet node's allocatable carries the totals, and the requests of the pods bound there — what
  ``kubectl describe node`` adds up under "Allocated resources" — equal their allocations' shares;
- a ResourceQuota on ``requests.tensor-fusion.ai/milli-tflops`` admits pods up to it and refuses the
  next with the API server's own message, and a deleted pod gives its share back;
- QoS preemption fires with the real kube-scheduler: its dry run now sees a node short of TFLOPS
  (test_preemption.py plays both preemption cases out on the kubelet node).
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from vgpu.contract import inventory
from vgpu.names import RESOURCE_MILLI_TFLOPS, RESOURCE_VRAM, Annotation
from vgpu.node_resources import node_capacity
from vgpu.quantity import parse

from .cluster import REAL_NODE, Cluster
from .kube import eventually, wait_running
from .pods import allocation_of, gpu_pod, parked_gpu_pod


def share(tflops: str, vram: str, **more: str) -> dict[str, str]:
    return {Annotation.TFLOPS_REQUEST: tflops, Annotation.VRAM_REQUEST: vram, **more}


def requested(pod: Any, resource: str) -> int:
    """The pod's request of ``resource`` (the API server writes quantities canonically: 3Gi, 1248k)."""
    return sum(int(parse((c.resources.requests or {}).get(resource, "0"))) for c in pod.spec.containers if c.resources)


def advertised(core: CoreV1Api, node: str) -> dict[str, int]:
    allocatable = core.read_node(node).status.allocatable or {}
    return {k: int(parse(v)) for k, v in allocatable.items() if k in (RESOURCE_MILLI_TFLOPS, RESOURCE_VRAM)}


@pytest.mark.timeout(180)
def test_the_kubelet_node_advertises_its_totals_and_its_pods_requests_add_up(cluster: Cluster, core: CoreV1Api) -> None:
    node = core.read_node(REAL_NODE)
    totals = node_capacity(inventory.decode(node.metadata.annotations[inventory.KEY]))
    assert int(totals[RESOURCE_MILLI_TFLOPS]) == 4 * 312_000
    eventually(  # the plugin patches capacity and allocatable; the kubelet keeps both
        "the kubelet node's allocatable carrying the GPU totals",
        lambda: advertised(core, REAL_NODE) == {k: int(v) for k, v in totals.items()},
        timeout=60,
    )
    ns = cluster.namespace("e2e-node-resources")
    pod = gpu_pod("counted", share("12.5", "3Gi"))
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    core.create_namespaced_pod(ns, pod)
    wait_running(core, ns, "counted", timeout=90)
    on_node = [
        p for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={REAL_NODE}").items
        if p.status.phase not in ("Succeeded", "Failed")
    ]  # fmt: skip
    allocated = [allocation_of(p) for p in on_node if requested(p, RESOURCE_MILLI_TFLOPS)]
    assert sum(requested(p, RESOURCE_MILLI_TFLOPS) for p in on_node) == sum(
        g.tflops_request for a in allocated for g in a.gpus
    )
    assert sum(requested(p, RESOURCE_VRAM) for p in on_node) == sum(g.vram_request for a in allocated for g in a.gpus)
    mine = core.read_namespaced_pod("counted", ns)
    assert (requested(mine, RESOURCE_MILLI_TFLOPS), requested(mine, RESOURCE_VRAM)) == (12_500, 3 * 1024**3)
    core.delete_namespaced_pod("counted", ns, grace_period_seconds=0)


@pytest.mark.timeout(180)
def test_a_namespace_quota_admits_up_to_its_tflops_and_refuses_the_next_until_one_goes(
    cluster: Cluster, core: CoreV1Api
) -> None:
    ns = cluster.namespace("e2e-quota")
    hard = {"requests." + RESOURCE_MILLI_TFLOPS: "25000", "requests." + RESOURCE_VRAM: "100Gi"}  # 25 TFLOPS
    core.create_namespaced_resource_quota(ns, {"metadata": {"name": "gpu-shares"}, "spec": {"hard": hard}})
    eventually(
        "the quota counted by its controller",
        lambda: core.read_namespaced_resource_quota("gpu-shares", ns).status.hard or None,
        timeout=60,
    )
    with pytest.raises(ApiException) as too_big:  # a quota that cannot hold even one such pod: the same denial
        core.create_namespaced_pod(ns, parked_gpu_pod("q-big", share("30", "4Gi")))
    assert too_big.value.status == 403 and "exceeded quota: gpu-shares" in too_big.value.body, too_big.value.body
    # Asking in percent buys no more: 10 % of whichever A100 the pod gets is charged 31.2 TFLOPS, over the 25.
    tenth = {Annotation.COMPUTE_PERCENT_REQUEST: "10", Annotation.GPU_MODEL: "A100", Annotation.VRAM_REQUEST: "4Gi"}
    with pytest.raises(ApiException) as percent:
        core.create_namespaced_pod(ns, parked_gpu_pod("q-percent", tenth))
    assert percent.value.status == 403 and "exceeded quota: gpu-shares" in percent.value.body, percent.value.body
    for name in ("q-1", "q-2"):
        core.create_namespaced_pod(ns, parked_gpu_pod(name, share("10", "4Gi")))
    with pytest.raises(ApiException) as denied:
        core.create_namespaced_pod(ns, parked_gpu_pod("q-3", share("10", "4Gi")))
    assert denied.value.status == 403
    message = denied.value.body
    assert "exceeded quota: gpu-shares" in message and f"requests.{RESOURCE_MILLI_TFLOPS}" in message, message
    core.delete_namespaced_pod("q-1", ns, grace_period_seconds=0)

    def admitted() -> bool:
        try:
            core.create_namespaced_pod(ns, parked_gpu_pod("q-3", share("10", "4Gi")))
        except ApiException as exc:
            if "exceeded quota" in exc.body:
                return False
            raise
        return True

    eventually("q-3 admitted once q-1 is gone", admitted, timeout=60)
    used = core.read_namespaced_resource_quota("gpu-shares", ns).status.used
    assert parse(used[f"requests.{RESOURCE_MILLI_TFLOPS}"]) == 20_000, used
