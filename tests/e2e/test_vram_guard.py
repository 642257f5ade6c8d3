"""A container past its VRAM limit by the driver's count loses its largest process (docs/security.md, "VRAM past
its limit, by the driver's count"), on the kubelet node with the real API server.

A tenant with pod-create rights runs three GPU pods of 1Gi each on the node. The fake GPU file stands in for
the driver: one pod's container is scripted at 3Gi in one process and 256Mi in another — a process that left
the limiter inside its container (its own environment, no preloaded library) — and its neighbour at 1.25Gi,
within the 512Mi tolerance. Sampling every second, the device plugin kills the 3Gi process within three
samples, says so on the pod and on the node, counts it once, and touches nothing else: the neighbour keeps its
process, and the pod, now under its limit, loses nothing more. The third pod names two inject containers, each
handed the pod's whole grant at Allocate and each scripted at 1Gi, within it alone: together 2Gi, past the
limit the ledger booked once, so the pod loses one of them (its larger).

And while the API server is stalled (SIGSTOP, past the plugin's 15 s read timeout): the guard still kills (it
needs only its pod cache), and the Event it could not post then reaches the pod once the API server is back,
exactly once although its first try may have landed unanswered.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes.client import CoreV1Api
from prometheus_client.parser import text_string_to_metric_families

from device_plugin.cluster.node_events import REASON_VRAM_OVERUSE
from device_plugin.gpus.fake_probe import FAKE_PID_BASE
from vgpu.contract import usage
from vgpu.metric_names import ERRORS, VRAM_OVERUSE
from vgpu.names import Annotation

from .cluster import PLUGIN_USAGE_INTERVAL, REAL_NODE, Cluster
from .fake_nodes import MIB, fake_nvml_yaml
from .kube import eventually, messages, wait_running
from .pods import allocation_of, gpu_pod
from .test_bind_bounds import api_server, stopped

NAMESPACE = "e2e-vram-guard"
SHARE = {Annotation.TFLOPS_REQUEST: "5", Annotation.VRAM_REQUEST: "1Gi", Annotation.VRAM_LIMIT: "1Gi"}
# Two samples in a row past the limit, one more for the sample that sees the kill, and slack for a loaded machine.
WITHIN_S = 3 * PLUGIN_USAGE_INTERVAL + 3
STALL_S = 18  # past the plugin's read timeout (CALL_TIMEOUT: 15 s), so that its first post of the Event fails


def counts(cluster: Cluster, name: str, label: str) -> dict[str, float]:
    """The node's counter ``name`` by ``label`` (its /metrics)."""
    return {
        s.labels[label]: s.value
        for family in text_string_to_metric_families(cluster.plugin_get("/metrics"))
        for s in family.samples
        if s.name == name
    }


def overuse_counts(cluster: Cluster) -> dict[str, float]:
    """The node's ``tf_device_plugin_vram_overuse_total`` by outcome."""
    return counts(cluster, VRAM_OVERUSE.name, "outcome")


def event_errors(cluster: Cluster) -> tuple[float, float]:
    """The Events the node's plugin gave up posting: (on pods, on the node)."""
    errors = counts(cluster, ERRORS.name, "where")
    return errors.get("pod_event", 0.0), errors.get("node_event", 0.0)


def used_by(cluster: Cluster, pod: Any) -> int | None:
    """The pod's memory on /usage, its containers together; None while it is not there."""
    found = [c for c in usage.decode(cluster.plugin_get(usage.PATH)).containers if c.pod_uid == pod.metadata.uid]
    return sum(c.vram_used for c in found) if found else None


def gpu_of(pod: Any) -> str:
    return allocation_of(pod).gpus[0].uuid


def said(core: CoreV1Api, namespace: str, kind: str, name: str) -> list[str]:
    return messages(core, namespace, kind, name, REASON_VRAM_OVERUSE)


def test_a_container_past_its_vram_limit_loses_its_largest_process_and_nothing_else_is_touched(
    cluster: Cluster, core: CoreV1Api
) -> None:
    ns = cluster.namespace(NAMESPACE)
    tenant = cluster.grant_tenant(ns, "edit")
    for name in ("greedy", "modest"):
        tenant.create_namespaced_pod(ns, gpu_pod(name, SHARE))
    tenant.create_namespaced_pod(
        ns, gpu_pod("pair", {**SHARE, Annotation.INJECT_CONTAINER: "prep,serve"}, containers=("prep", "serve"))
    )
    greedy, modest, pair = (wait_running(core, ns, name) for name in ("greedy", "modest", "pair"))

    def proc(pod: Any, container: str, mib: int) -> dict[str, Any]:
        return {"pod": pod.metadata.uid, "container": container, "gpu": gpu_of(pod), "vramMiB": mib}

    # PIDs follow the order: FAKE_PID_BASE for greedy's 3Gi, + 4 for pair's serve (the larger of its two).
    script = [
        proc(greedy, "main", 3072),
        proc(greedy, "main", 256),
        proc(modest, "main", 1280),
        proc(pair, "prep", 1000),
        proc(pair, "serve", 1024),
    ]
    before = overuse_counts(cluster)
    try:
        cluster.write_fake_nvml(fake_nvml_yaml(cluster.gpus, {}, usage=script))
        eventually("the greedy pod's use on /usage", lambda: used_by(cluster, greedy) == 3328 * MIB, WITHIN_S, 0.05)
        seen = time.monotonic()
        eventually("the greedy pod's 3Gi process gone", lambda: used_by(cluster, greedy) == 256 * MIB, WITHIN_S, 0.05)
        print(f"killed {time.monotonic() - seen:.2f}s after its use was first served")
        eventually("the pair's serve process gone", lambda: used_by(cluster, pair) == 1000 * MIB, WITHIN_S, 0.05)

        (message,) = eventually("the Event on the pod", lambda: said(core, ns, "Pod", "greedy") or None, 10, 0.2)
        assert message == (
            f"container main of pod {ns}/greedy held 3.2Gi of GPU {gpu_of(greedy)} by the driver's count, over the "
            f"pod's VRAM limit 1Gi by more than 512Mi in 2 samples in a row: its process {FAKE_PID_BASE} (3Gi) was "
            "killed"
        )
        (paired,) = eventually("the pair's Event", lambda: said(core, ns, "Pod", "pair") or None, 10, 0.2)
        assert paired == (
            f"pod {ns}/pair's containers prep (1000Mi), serve (1Gi) together held 2.0Gi of GPU {gpu_of(pair)} by "
            "the driver's count, over the pod's VRAM limit 1Gi by more than 512Mi in 2 samples in a row: process "
            f"{FAKE_PID_BASE + 4} (1Gi) of serve was killed"
        )
        on_node = eventually("the Event on the node", lambda: said(core, "default", "Node", REAL_NODE) or None, 10, 0.2)
        assert message in on_node
        # The tenant reads why its process died, as it reads an eviction: an Event in its own namespace.
        assert sorted(
            e.message for e in tenant.list_namespaced_event(ns).items if e.reason == REASON_VRAM_OVERUSE
        ) == sorted([message, paired])

        time.sleep(3 * PLUGIN_USAGE_INTERVAL)  # three more samples: nothing more happens
        assert (used_by(cluster, greedy), used_by(cluster, modest), used_by(cluster, pair)) == (
            256 * MIB,
            1280 * MIB,
            1000 * MIB,
        )
        after = overuse_counts(cluster)
        assert {k: after[k] - before.get(k, 0.0) for k in after} == {
            "killed": 2,
            "gone": 0,
            "kill_failed": 0,
            "reported": 0,
        }
        assert said(core, ns, "Pod", "modest") == [] and said(core, ns, "Pod", "greedy") == [message]
        assert said(core, ns, "Pod", "pair") == [paired]
    finally:
        cluster.set_gpu_faults({})
        for name in ("greedy", "modest", "pair"):
            core.delete_namespaced_pod(name, ns)


def test_during_an_api_server_stall_the_guard_still_kills_and_its_event_arrives_once_after(
    cluster: Cluster, core: CoreV1Api
) -> None:
    ns = cluster.namespace(f"{NAMESPACE}-stall")
    tenant = cluster.grant_tenant(ns, "edit")
    tenant.create_namespaced_pod(ns, gpu_pod("stalled", SHARE))
    pod = wait_running(core, ns, "stalled")
    script = [{"pod": pod.metadata.uid, "container": "main", "gpu": gpu_of(pod), "vramMiB": 3072}]
    before, failed_before = overuse_counts(cluster), event_errors(cluster)
    try:
        with stopped(api_server(cluster)):
            started = time.monotonic()
            cluster.write_fake_nvml(fake_nvml_yaml(cluster.gpus, {}, usage=script))
            eventually("its use on /usage", lambda: used_by(cluster, pod) == 3072 * MIB, WITHIN_S, 0.05)
            eventually("its process killed, the API server stopped", lambda: used_by(cluster, pod) is None, WITHIN_S)
            killed_after = time.monotonic() - started
            time.sleep(max(0.0, STALL_S - killed_after))
        print(f"killed {killed_after:.2f}s into a {STALL_S}s stall")
        events = eventually("the Event, once back", lambda: said(core, ns, "Pod", "stalled") or None, 30, 0.2)
        time.sleep(2 * PLUGIN_USAGE_INTERVAL)  # a second copy, were the retry to post one, would be there by now
        assert said(core, ns, "Pod", "stalled") == events and len(events) == 1, events
        assert events[0].endswith(f"its process {FAKE_PID_BASE} (3Gi) was killed")
        after = overuse_counts(cluster)
        assert after["killed"] - before.get("killed", 0.0) == 1
        assert event_errors(cluster) == failed_before  # none given up
        on_node = [m for m in said(core, "default", "Node", REAL_NODE) if f"pod {ns}/stalled " in m]
        assert on_node == events
    finally:
        cluster.set_gpu_faults({})
        core.delete_namespaced_pod("stalled", ns)
