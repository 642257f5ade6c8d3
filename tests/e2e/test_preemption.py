"""QoS preemption on the kubelet node, to Running, in both cases of issue 13.

(a) The node's totals are short. Its four A100s (312 TFLOPS each) hold three 100-TFLOPS pods each —
low, low, high in some order: 48 free on the node. A critical pod of 100 TFLOPS fails kube-scheduler's
in-tree fit; its dry run finds one low victim (the totals fit with all others reprieved), the extender's
preempt verb keeps it (freeing it leaves 112 on its GPU), kube-scheduler evicts it and the critical pod
runs on that GPU. A low pod then preempts nobody.

(b) The GPUs are fragmented. The four A100s (312 TFLOPS each) each hold a high pod of 200 TFLOPS and a low pod of 60: 52
free on every GPU, 208 on the node. A critical pod of 100 TFLOPS fits the node's totals, so it passes
kube-scheduler's in-tree filters, and fits no single GPU, so the extender fails it; kube-scheduler's own
dry run reprieves every victim (the totals fit with all of them) and never preempts. The extender's
preemptor does: it evicts exactly one low pod through the Eviction API, holds the GPU it frees, and the
critical pod runs there. High pods and the other lows are untouched; no GPU is promised beyond its size.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

import pytest
from kubernetes.client import ApiException, CoreV1Api

from vgpu.contract import allocation
from vgpu.names import Annotation, Qos
from vgpu.timefmt import parse_rfc3339

from .cluster import REAL_NODE, Cluster
from .kube import events_for, eventually, wait_running
from .pods import IMAGE, allocation_of, gpu_pod

A100_MILLI = 312_000
OTHERS_MAX = 20_000  # what other scenarios' pods may still hold on a GPU of the node, for the arithmetic above


def pod_of(name: str, tflops: str, qos: str) -> dict[str, Any]:
    pod = gpu_pod(name, {Annotation.TFLOPS_REQUEST: tflops, Annotation.VRAM_REQUEST: "1Gi", Annotation.QOS: qos})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    return pod


def holding(core: CoreV1Api) -> list[Any]:
    """The node's live pods that hold an allocation."""
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={REAL_NODE}").items
    return [
        p
        for p in pods
        if p.status.phase not in ("Succeeded", "Failed") and (p.metadata.annotations or {}).get(allocation.KEY)
    ]


def per_gpu(core: CoreV1Api) -> dict[str, int]:
    """TFLOPS (milli) promised on each GPU of the node by its live pods' allocations."""
    used: dict[str, int] = defaultdict(int)
    for p in holding(core):
        for g in allocation_of(p).gpus:
            used[g.uuid] += g.tflops_request
    return dict(used)


def node_nearly_empty(core: CoreV1Api, most: int) -> None:
    """The scenario's arithmetic needs the node's GPUs free but for ``most`` milli-TFLOPS each: earlier
    scenarios must leave it as they found it."""
    before = per_gpu(core)
    others = sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in holding(core))
    assert max(before.values(), default=0) <= most, f"other pods hold too much of {REAL_NODE}: {before} ({others})"


def preemptions(cluster: Cluster, result: str) -> float:
    return cluster.extender_metric(f'tf_extender_preemptions_total{{result="{result}"}}')


def start_all(core: CoreV1Api, namespace: str, pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        core.create_namespaced_pod(namespace, pod)
    for pod in pods:
        wait_running(core, namespace, pod["metadata"]["name"])


def alive(core: CoreV1Api, namespace: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(namespace).items if not p.metadata.deletion_timestamp}


@pytest.mark.timeout(300)
def test_a_critical_pod_on_a_node_short_of_tflops_preempts_one_low_pod_through_kube_scheduler_and_runs(
    cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    cluster.grant_qos(fresh, Qos.CRITICAL)
    node_nearly_empty(core, 12_000)
    lows, highs = [f"low-{i}" for i in range(8)], [f"high-{i}" for i in range(4)]
    start_all(core, fresh, [pod_of(n, "100", "low") for n in lows] + [pod_of(n, "100", "high") for n in highs])
    asked = cluster.extender_metric('tf_extender_request_seconds_count{verb="preempt"}')
    ours = preemptions(cluster, "evicted")

    core.create_namespaced_pod(fresh, pod_of("critical", "100", "critical"))
    critical = wait_running(core, fresh, "critical", timeout=120)

    victims = sorted(set(lows + highs) - alive(core, fresh))
    after = per_gpu(core)
    print(
        f"critical pod Running; kube-scheduler preempted {victims}; TFLOPS per GPU: {sorted(v / 1000 for v in after.values())}"
    )
    assert len(victims) == 1 and victims[0] in lows, victims
    assert cluster.extender_metric('tf_extender_request_seconds_count{verb="preempt"}') > asked
    assert preemptions(cluster, "evicted") == ours  # kube-scheduler's preemption, not the extender's own
    assert any("Preempted by pod" in e for e in events_for(core, fresh, victims[0]))
    assert allocation_of(critical).gpus[0].uuid in after and all(v <= A100_MILLI for v in after.values()), after
    # A low pod now: every pod it could displace is of equal or higher QoS.
    core.create_namespaced_pod(fresh, pod_of("low-late", "100", "low"))
    eventually(
        "low-late refused a place",
        lambda: [e for e in events_for(core, fresh, "low-late") if e.startswith("FailedScheduling")] or None,
    )
    assert not core.read_namespaced_pod("low-late", fresh).spec.node_name
    assert alive(core, fresh) == set(lows + highs + ["critical", "low-late"]) - set(victims)


@pytest.mark.timeout(300)
def test_a_critical_pod_on_fragmented_gpus_evicts_one_low_pod_and_runs_on_the_gpu_it_freed(
    cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    cluster.grant_qos(fresh, Qos.CRITICAL)
    node_nearly_empty(core, OTHERS_MAX)
    highs, lows = [f"high-{i}" for i in range(4)], [f"low-{i}" for i in range(4)]
    start_all(core, fresh, [pod_of(n, "200", "high") for n in highs])  # two never share a GPU (400 > 312)
    start_all(core, fresh, [pod_of(n, "60", "low") for n in lows])  # 200 + 60 fits, 200 + 120 does not
    gpu_of = {n: allocation_of(core.read_namespaced_pod(n, fresh)).gpus[0].uuid for n in highs + lows}
    assert len({gpu_of[n] for n in highs}) == 4 and len({gpu_of[n] for n in lows}) == 4, gpu_of
    evicted_before = preemptions(cluster, "evicted")

    core.create_namespaced_pod(fresh, pod_of("critical", "100", "critical"))
    critical = wait_running(core, fresh, "critical", timeout=120)

    victims = sorted(set(highs + lows) - alive(core, fresh))
    granted = allocation_of(critical).gpus[0].uuid
    after = per_gpu(core)
    print(
        f"critical pod Running on {granted}; evicted: {victims}; "
        f"TFLOPS promised per GPU: {sorted(v / 1000 for v in after.values())}"
    )
    assert len(victims) == 1 and victims[0] in lows, victims  # the fewest, of the lowest QoS
    assert gpu_of[victims[0]] == granted  # the GPU it freed
    assert all(v <= A100_MILLI for v in after.values()), after
    assert preemptions(cluster, "evicted") == evicted_before + 1
    assert any(
        e.startswith("Preempted: preempted by tensor-fusion for pod") for e in events_for(core, fresh, victims[0])
    )
    assert any(e.startswith("GpuPreemption: ") for e in events_for(core, fresh, "critical"))
    for name in highs + [n for n in lows if n not in victims]:
        assert core.read_namespaced_pod(name, fresh).status.phase == "Running", name
    # kube-scheduler's own preemption had nothing to do here: the node's totals fit all along.
    assert not any("Preempted by pod" in e for n in lows for e in events_for(core, fresh, n))

    eventually(
        "the evicted pod gone",
        lambda: victims[0] not in {p.metadata.name for p in core.list_namespaced_pod(fresh).items},
        60,
    )


@pytest.mark.parametrize("qos", ["high", "critical"])
def test_a_tenant_cannot_preempt_by_asking_for_a_higher_qos(
    cluster: Cluster, core: CoreV1Api, fresh: str, qos: str
) -> None:
    """As a tenant with pod-create rights in a namespace no operator granted a QoS: pods asking for high or
    critical, alone, with a lower PriorityClass and with a higher one, are all refused at admission with the
    reason, so none runs and no pod of another namespace (here: low pods filling the node) is evicted. So is a
    plain pod that names the class with no tensor-fusion label, annotation or resource at all."""
    own = cluster.namespace(f"e2e-tenant-asks-{qos}")
    tenant = cluster.grant_tenant(own, "edit")
    node_nearly_empty(core, OTHERS_MAX)
    lows = [f"low-{i}" for i in range(4)]
    start_all(core, fresh, [pod_of(n, "250", "low") for n in lows])  # one per GPU: no room for 100 anywhere
    evicted_before = preemptions(cluster, "evicted")
    refused = []
    for name, chosen in (
        ("alone", None),
        ("lower-class", "tensor-fusion-medium"),
        ("higher-class", "tensor-fusion-critical"),
    ):
        pod = pod_of(f"{qos}-{name}", "100", qos)
        if chosen is not None:
            pod["spec"]["priorityClassName"] = chosen
        try:
            tenant.create_namespaced_pod(own, pod)
        except ApiException as exc:
            refused.append(json.loads(exc.body)["message"])
    plain = {"metadata": {"name": f"plain-{qos}"}, "spec": {"priorityClassName": f"tensor-fusion-{qos}"}}
    plain["spec"]["containers"] = [{"name": "main", "image": IMAGE}]
    try:
        tenant.create_namespaced_pod(own, plain)
    except ApiException as exc:
        refused.append(json.loads(exc.body)["message"])
    assert len(refused) == 4, refused
    assert "may ask for qos medium at most" in refused[3]
    assert "may ask for qos medium at most" in refused[0] and "tensor-fusion.ai/max-qos" in refused[0]
    assert "contradicts tensor-fusion.ai/qos" in refused[1]
    assert ("contradicts" in refused[2]) == (qos == "high") and ("may ask for qos medium" in refused[2]) == (
        qos == "critical"
    )
    assert alive(core, fresh) == set(lows)
    assert preemptions(cluster, "evicted") == evicted_before
    assert core.list_namespaced_pod(own).items == []


@pytest.mark.timeout(300)
def test_a_protected_low_pod_is_not_preempted_until_its_protection_is_over(
    cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    """Case (b) again, with every low pod asking for 25 s of eviction-protection and a high pod (which may take
    only low ones) wanting room: no low pod goes while they are protected, then exactly one does, without the
    pod being created again, and the high pod runs on the GPU it freed."""
    cluster.grant_qos(fresh, Qos.HIGH)
    node_nearly_empty(core, OTHERS_MAX)
    highs, lows = [f"high-{i}" for i in range(4)], [f"low-{i}" for i in range(4)]
    start_all(core, fresh, [pod_of(n, "200", "high") for n in highs])
    protected = [pod_of(n, "60", "low") for n in lows]
    for pod in protected:
        pod["metadata"]["annotations"][Annotation.EVICTION_PROTECTION] = "25s"
    start_all(core, fresh, protected)
    # The first protection to end is the earliest-granted low pod's (boundAt: whole seconds).
    granted = min(parse_rfc3339(allocation_of(core.read_namespaced_pod(n, fresh)).bound_at) for n in lows)
    core.create_namespaced_pod(fresh, pod_of("urgent", "100", "high"))
    held_off = granted + 25 - 2
    while time.time() < held_off:  # while every low pod is protected, nobody goes
        assert alive(core, fresh) >= set(highs + lows)
        time.sleep(1)
    urgent = wait_running(core, fresh, "urgent", timeout=120)
    assert len(set(lows) - alive(core, fresh)) == 1 and set(highs) <= alive(core, fresh)
    assert time.time() >= granted + 25
    assert allocation_of(urgent).gpus
