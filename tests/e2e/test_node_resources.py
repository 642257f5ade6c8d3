"""GPU shares as node resources (issue 13): what kube-scheduler, the quota system and `describe node` see.

The device plugin advertises each node's TFLOPS and VRAM totals as extended resources and the webhook
puts each pod's shares on its GPU container, so:
- the kubelet node's allocatable carries the totals, and the requests of the pods bound there — what
  ``kubectl describe node`` adds up under "Allocated resources" — equal their allocations' shares;
- a ResourceQuota on ``requests.tensor-fusion.ai/milli-tflops`` admits pods up to it and refuses the
  next with the API server's own message, and a deleted pod gives its share back;
- QoS preemption fires with the real kube-scheduler: its dry run now sees a node short of TFLOPS,
  picks lower-priority victims, and the extender's preempt verb narrows them to the fewest, lowest-QoS
  pods that free one GPU's worth; equal or higher QoS is never preempted.
"""

from __future__ import annotations

import re
import urllib.request
from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from vgpu.contract import inventory
from vgpu.names import RESOURCE_MILLI_TFLOPS, RESOURCE_VRAM, Annotation
from vgpu.node_resources import node_capacity
from vgpu.quantity import parse

from .cluster import REAL_NODE, Cluster
from .fake_nodes import gpus
from .kube import api_client, events_for, eventually, wait_bound, wait_running
from .pods import allocation_of, gpu_pod, hand_over, parked_gpu_pod


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


def preempt_calls(cluster: Cluster) -> float:
    """How many preempt verbs the extender has answered (its request-latency histogram's count)."""
    url = f"http://127.0.0.1:{cluster.extender_public_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = re.search(r'^tf_extender_request_seconds_count\{verb="preempt"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


POOL = "e2e-preempt"


@pytest.mark.timeout(300)
def test_a_critical_pod_preempts_the_fewest_low_qos_pods_of_a_full_gpu_and_nothing_of_higher_qos(
    cluster: Cluster, core: CoreV1Api
) -> None:
    """One A100 (312 TFLOPS) holds low, low and high pods of 100 TFLOPS; a critical 100-TFLOPS pod comes.
    The node's totals are short (12 free), so kube-scheduler's dry run finds victims; one low pod is
    enough, and the extender's preempt verb keeps it at that. Then a low pod finds no one to preempt."""
    node = "e2e-preempt-0"
    cluster.add_fake_node(node, gpus(node, 1), pool=POOL)
    ns = cluster.namespace("e2e-preempt")
    try:

        def placed(name: str, qos: str) -> dict[str, Any]:
            pod = gpu_pod(name, share("100", "20Gi", **{Annotation.GPUPOOL: POOL, Annotation.QOS: qos}))
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            return pod

        plugin = CoreV1Api(api_client(cluster.kubeconfigs["device-plugin"]))

        def handed_over(name: str, timeout: float) -> Any:
            """Bound; then the receipt the device plugin writes once the kubelet admitted the pod (no kubelet
            here), which frees the node's hand-off gate for the next bind."""
            pod = wait_bound(core, ns, name, timeout=timeout)
            hand_over(plugin, pod)
            return pod

        for name, qos in (("low-a", "low"), ("low-b", "low"), ("high", "high")):
            core.create_namespaced_pod(ns, placed(name, qos))
            handed_over(name, 60)
        asked = preempt_calls(cluster)
        core.create_namespaced_pod(ns, placed("critical", "critical"))
        bound = handed_over("critical", 120)
        assert preempt_calls(cluster) > asked, "kube-scheduler preempted without asking the extender"
        left = {p.metadata.name for p in core.list_namespaced_pod(ns).items if not p.metadata.deletion_timestamp}
        victims = {"low-a", "low-b", "high"} - left
        print(f"critical pod bound to {bound.spec.node_name}; preempted: {sorted(victims)}")
        assert len(victims) == 1 and victims <= {"low-a", "low-b"}, victims
        assert "high" in left
        pods = [p for p in core.list_namespaced_pod(ns).items if p.spec.node_name == node]
        used = sum(g.tflops_request for p in pods for g in allocation_of(p).gpus)
        assert used == 300_000, f"the GPU promises {used / 1000} of 312 TFLOPS"
        # A low pod now: the only pods it could displace are of equal or higher QoS.
        core.create_namespaced_pod(ns, placed("low-late", "low"))
        lines = eventually(
            "low-late refused a place", lambda: [e for e in events_for(core, ns, "low-late") if "Failed" in e] or None
        )
        late = core.read_namespaced_pod("low-late", ns)
        assert not late.spec.node_name, lines
        assert {p.metadata.name for p in core.list_namespaced_pod(ns).items} >= left
    finally:
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        core.delete_node(node)
