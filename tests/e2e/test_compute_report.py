"""A pod that uses more of its GPU than its TFLOPS limit gives HAMi-core is reported (docs/security.md, "Compute
past its limit, by the driver's count"), on the kubelet node with the real API server.

A tenant with pod-create rights runs two GPU pods with a 10 TFLOPS limit each: 4 % of an 80Gi A100's SMs as
HAMi-core is given them. The fake GPU file stands in for the driver: one pod's process is scripted at 60 % of the
SMs (a process the limiter does not hold: a static binary, no preloaded library), the other's at 12 %, within
the 10-point margin. Over the plugin's 3 s window (sampled every second) the first is reported once, on the pod
(the tenant reads it) and on the node, and counted; nothing is killed; the second is not reported.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes.client import CoreV1Api
from prometheus_client.parser import text_string_to_metric_families

from device_plugin.cluster.node_events import REASON_COMPUTE_OVERUSE
from vgpu.contract import usage
from vgpu.metric_names import COMPUTE_OVERUSE
from vgpu.names import Annotation

from .cluster import PLUGIN_COMPUTE_WINDOW, PLUGIN_USAGE_INTERVAL, REAL_NODE, Cluster
from .fake_nodes import fake_nvml_yaml
from .kube import eventually, messages, wait_running
from .pods import allocation_of, gpu_pod

NAMESPACE = "e2e-compute-report"
SHARE = {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "1Gi"}  # the limits: the requests
WITHIN_S = PLUGIN_COMPUTE_WINDOW + 3 * PLUGIN_USAGE_INTERVAL + 5  # a full window, a pass or two, a loaded machine


def reported(cluster: Cluster) -> float:
    """The node's ``tf_device_plugin_compute_overuse_total``."""
    return next(
        s.value
        for family in text_string_to_metric_families(cluster.plugin_get("/metrics"))
        for s in family.samples
        if s.name == COMPUTE_OVERUSE.name
    )


def said(core: CoreV1Api, namespace: str, kind: str, name: str) -> list[str]:
    return messages(core, namespace, kind, name, REASON_COMPUTE_OVERUSE)


def sampled(cluster: Cluster, pod: Any) -> bool:
    return any(c.pod_uid == pod.metadata.uid for c in usage.decode(cluster.plugin_get(usage.PATH)).containers)


def test_a_pod_past_its_compute_cap_is_reported_once_and_its_neighbour_within_the_margin_is_not(
    cluster: Cluster, core: CoreV1Api
) -> None:
    ns = cluster.namespace(NAMESPACE)
    tenant = cluster.grant_tenant(ns, "edit")
    for name in ("hot", "cool"):
        tenant.create_namespaced_pod(ns, gpu_pod(name, SHARE))
    hot, cool = (wait_running(core, ns, name) for name in ("hot", "cool"))
    gpu = allocation_of(hot).gpus[0].uuid
    script = [
        {"pod": hot.metadata.uid, "container": "main", "gpu": gpu, "smPercent": 60},
        {"pod": cool.metadata.uid, "container": "main", "gpu": allocation_of(cool).gpus[0].uuid, "smPercent": 12},
    ]
    before = reported(cluster)
    try:
        cluster.write_fake_nvml(fake_nvml_yaml(cluster.gpus, {}, usage=script))
        eventually("both pods sampled", lambda: sampled(cluster, hot) and sampled(cluster, cool), WITHIN_S, 0.1)
        seen = time.monotonic()
        (message,) = eventually("the Event on the pod", lambda: said(core, ns, "Pod", "hot") or None, WITHIN_S, 0.2)
        print(f"reported {time.monotonic() - seen:.2f}s after its use was first served")
        assert message == (
            f"container main of pod {ns}/hot used 60% of GPU {gpu} on average over {PLUGIN_COMPUTE_WINDOW}s by the "
            "driver's count, over the 4% its TFLOPS limit gives HAMi-core by more than 10 points: a process the "
            "limiter does not hold (one that left it, or containers each held alone); reported only "
            "(--compute-overuse)"
        )
        on_node = eventually("the Event on the node", lambda: said(core, "default", "Node", REAL_NODE) or None, 10)
        assert message in on_node
        assert [e.message for e in tenant.list_namespaced_event(ns).items if e.reason == REASON_COMPUTE_OVERUSE] == [
            message
        ]
        time.sleep(3 * PLUGIN_USAGE_INTERVAL)  # three more samples, still over: not said again
        assert said(core, ns, "Pod", "hot") == [message] and said(core, ns, "Pod", "cool") == []
        assert reported(cluster) - before == 1
        assert sampled(cluster, hot)  # reported only: its process runs on
    finally:
        cluster.set_gpu_faults({})
        for name in ("hot", "cool"):
            core.delete_namespaced_pod(name, ns)
