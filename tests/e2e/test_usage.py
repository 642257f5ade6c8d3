"""Per-container GPU use on the kubelet node (issue 15): a GPU pod runs, the fake GPU file scripts its
container's process (2 % of the A100's SMs and 512 MiB, stepping to 5 % after a few seconds), and the
device plugin — sampling every second — shows it within two sample periods on ``/usage`` and in its
per-container metrics, measured against the pod's grant, then shows the step. What an operator or the
custom-metrics API reads is the plugin's own answer over HTTP, nothing computed here.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes.client import CoreV1Api
from prometheus_client.parser import text_string_to_metric_families

from vgpu.contract import usage
from vgpu.names import Annotation

from .cluster import PLUGIN_USAGE_INTERVAL, REAL_NODE, Cluster
from .fake_nodes import fake_nvml_yaml
from .kube import eventually, wait_running
from .pods import allocation_of, gpu_pod

NAMESPACE = "e2e-usage"
SHARE = {
    Annotation.TFLOPS_REQUEST: "10",
    Annotation.TFLOPS_LIMIT: "20",
    Annotation.VRAM_REQUEST: "1Gi",
    Annotation.VRAM_LIMIT: "2Gi",
}
BEFORE, AFTER, STEP_S = 2, 5, 8  # SM percent before and after the step, seconds after the file is written
# Two sample periods, and a second for the HTTP round trips and a loaded 2-core machine.
WITHIN_S = 2 * PLUGIN_USAGE_INTERVAL + 1
MIB = 1024 * 1024


def container_metrics(cluster: Cluster, pod: Any, gpu: str) -> dict[str, float]:
    """The plugin's ``tf_container_*`` series of the pod's container ``main`` on ``gpu``, by name."""
    labels = {"node": REAL_NODE, "namespace": NAMESPACE, "pod": pod.metadata.name, "container": "main", "gpu": gpu}
    return {
        s.name: s.value
        for family in text_string_to_metric_families(cluster.plugin_get("/metrics"))
        for s in family.samples
        if s.name.startswith("tf_container_") and s.labels == labels
    }


def seen(cluster: Cluster, pod: Any, tflops: int) -> usage.ContainerUsage | None:
    """The pod's container on /usage, once it shows ``tflops`` (milli) used."""
    doc = usage.decode(cluster.plugin_get(usage.PATH))
    mine = [c for c in doc.containers if c.pod_uid == pod.metadata.uid]
    return mine[0] if len(mine) == 1 and mine[0].tflops_used == tflops else None


def test_a_containers_scripted_use_reaches_usage_and_metrics_and_follows_a_step(
    cluster: Cluster, core: CoreV1Api
) -> None:
    ns = cluster.namespace(NAMESPACE)
    core.create_namespaced_pod(ns, gpu_pod("user", SHARE))
    pod = wait_running(core, ns, "user")
    (grant,) = allocation_of(pod).gpus
    step = {"step": {"before": BEFORE, "after": AFTER, "atSeconds": STEP_S}}
    script = [{"pod": pod.metadata.uid, "container": "main", "gpu": grant.uuid, "smPercent": step, "vramMiB": 512}]
    try:
        written = time.monotonic()
        cluster.write_fake_nvml(fake_nvml_yaml(cluster.gpus, {}, usage=script))

        before, after = grant.gpu_tflops * BEFORE // 100, grant.gpu_tflops * AFTER // 100
        c = eventually("the container's use on /usage", lambda: seen(cluster, pod, before), WITHIN_S, 0.1)
        assert time.monotonic() - written < STEP_S, "the first figure came after the step: no before to compare"
        assert (c.namespace, c.pod, c.container, c.gpu) == (NAMESPACE, "user", "main", grant.uuid)
        assert (c.tflops_used, c.vram_used) == (6_240, 512 * MIB)  # 2 % of the A100's 312 TFLOPS
        assert (c.tflops_request, c.tflops_limit, c.vram_request, c.vram_limit) == (
            10_000,
            20_000,
            1024 * MIB,
            2048 * MIB,
        )
        assert container_metrics(cluster, pod, grant.uuid) == {
            "tf_container_tflops_used": 6.24,
            "tf_container_tflops_request": 10.0,
            "tf_container_tflops_limit": 20.0,
            "tf_container_tflops_used_ratio": 0.312,
            "tf_container_tflops_used_request_ratio": 0.624,
            "tf_container_vram_used_bytes": 512 * MIB,
            "tf_container_vram_request_bytes": 1024 * MIB,
            "tf_container_vram_limit_bytes": 2048 * MIB,
            "tf_container_vram_used_ratio": 0.25,
            "tf_container_vram_used_request_ratio": 0.5,
        }

        wait = max(0.0, STEP_S - (time.monotonic() - written)) + WITHIN_S
        c = eventually("the step on /usage", lambda: seen(cluster, pod, after), wait, 0.1)
        assert time.monotonic() - written >= STEP_S - 0.1, "the step showed before its time"
        assert c.tflops_used == 15_600  # 5 % of 312 TFLOPS
        metrics = container_metrics(cluster, pod, grant.uuid)
        assert (metrics["tf_container_tflops_used"], metrics["tf_container_tflops_used_ratio"]) == (15.6, 0.78)
    finally:
        cluster.set_gpu_faults({})
        core.delete_namespaced_pod("user", ns)
