"""Autoscaling (issue 16), all three layers on the kubelet node, through the real HPA controller.

A Deployment of one GPU pod (request 10 TFLOPS, limit 20, on an A100) names a WorkloadProfile that enables
autoSetLimits (maxRatioToRequests 3: at most 30 TFLOPS), autoSetReplicas (target: half of what a limit may
reach, one replica per 2-second period, a 4-second scale-down cool-down) and autoSetRequests (8 seconds of
aggregation), with evaluation periods of seconds. Every pod's use is scripted in the fake GPU file as it
appears: 31.2 TFLOPS each (10 % of the A100's SMs), then 3.1 (1 %). The extender's autoscaler (every
second), tf-metrics behind the aggregation layer, and kube-controller-manager's HPA controller (a pass every
second) do the rest. Asserted:

* limits: the pod's allocation's TFLOPS limit goes 20 → 30 — never above 3 × the request — with a
  ``AtMaxRatio`` event, the same container (no restart), and the device plugin's live limit file says 30;
  when the load drops it comes back to the admitted 20 (``LimitsLowered``);
* replicas: the HPA the autoscaler owns scales the Deployment 1 → 2 → 3 (one step at a time, never above
  its maxReplicas of 3), and back to 1 once the load is gone, one step at a time after the cool-down;
* requests: once 8 s of history exist, the workload's status recommends 20 TFLOPS (p90 of 31.2 × 1.15,
  capped at the limit); running replicas move to it in place (their GPUs have room: ``RequestsResized``,
  no restart), and a replica the Deployment creates after that is admitted with it (its resolved request
  says where from);
* the histograms are checkpointed to a ConfigMap, and an extender restarted from it recommends at once
  instead of waiting for history again.
"""

from __future__ import annotations

import itertools
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import AppsV1Api, AutoscalingV2Api
from prometheus_client.parser import text_string_to_metric_families

from scheduler_extender.autoscaler import checkpoints
from vgpu.contract import resolved
from vgpu.names import SystemAnnotation

from . import deploy
from .autoscaling import (
    HIGH_SM,
    LOW_SM,
    NAMESPACE,
    PROFILE,
    WORKLOAD,
    Load,
    condition,
    deployment,
    events_of,
    live_limits,
    replicas_now,
    running,
    workload_status,
)
from .cluster import AUTOSCALER_MAX_REPLICAS, VENV_BIN, Cluster
from .kube import apply, eventually
from .pods import allocation_of


@pytest.fixture(scope="module")
def scaled(cluster: Cluster) -> Iterator[Cluster]:
    """tf-metrics registered (the HPA reads gpu_tflops through it), the namespace and the profile."""
    cluster.start_metrics_api()
    cluster.namespace(NAMESPACE)
    apply(cluster.admin, [PROFILE], NAMESPACE)
    try:
        yield cluster
    finally:
        AppsV1Api(cluster.admin).delete_namespaced_deployment(WORKLOAD, NAMESPACE, propagation_policy="Foreground")
        eventually(
            "the Deployment's pods gone",
            lambda: not cluster.core.list_namespaced_pod(NAMESPACE).items,
            90,
        )
        cluster.stop_metrics_api()


def test_limits_replicas_and_requests_follow_the_load(scaled: Cluster) -> None:
    cluster, core, apps = scaled, scaled.core, AppsV1Api(scaled.admin)
    hpas = AutoscalingV2Api(cluster.admin)
    apps.create_namespaced_deployment(NAMESPACE, deployment())
    first = eventually("the first replica running", lambda: running(core) or None, 90)[0]
    name, uid = first.metadata.name, first.metadata.uid
    (grant,) = allocation_of(first).gpus
    assert (grant.tflops_request, grant.tflops_limit) == (10_000, 20_000)
    seen_replicas: list[int] = [1]
    seen_limits: list[int] = []

    def watch() -> None:
        now = replicas_now(apps)
        if now != seen_replicas[-1]:
            seen_replicas.append(now)
        for pod in running(core):
            seen_limits.extend(g.tflops_limit for g in allocation_of(pod).gpus)

    with Load(cluster, HIGH_SM):
        # Limits: pressed on, raised in place to 3 × the request, not beyond.
        def raised() -> Any:
            watch()
            pod = core.read_namespaced_pod(name, NAMESPACE)
            return pod if allocation_of(pod).gpus[0].tflops_limit == 30_000 else None

        pod = eventually("the first pod's TFLOPS limit raised to 30", raised, 30)
        assert pod.metadata.uid == uid and pod.status.container_statuses[0].restart_count == 0
        # The device plugin rewrote the container's live limit file (docs/live-limits.md) in place.
        live = eventually("the live limit file at 30 TFLOPS", lambda: live_limit(uid, grant.uuid, 30_000), 15)
        assert live["generation"] >= 2 and live["gpus"][grant.uuid]["smPercent"] == 10  # ceil(30 / 312 × 100)
        assert "AtMaxRatio" in events_of(core, name) or "LimitsRaised" in events_of(core, name)

        # Replicas: the owned HPA scales 1 → 2 → 3, one step at a time.
        hpa = eventually(
            "the autoscaler's HPA",
            lambda: hpas.read_namespaced_horizontal_pod_autoscaler(f"tf-{WORKLOAD}", NAMESPACE),
            30,
        )
        assert hpa.spec.scale_target_ref.name == WORKLOAD and hpa.spec.max_replicas == AUTOSCALER_MAX_REPLICAS
        assert hpa.spec.metrics[0].pods.metric.name == "gpu_tflops"

        def three() -> bool:
            watch()
            return len(running(core)) == AUTOSCALER_MAX_REPLICAS

        eventually("3 replicas running", three, 90, 0.5)

        # Requests: after 8 s of history the workload recommends 20 TFLOPS (capped at the limit) ...
        def recommending() -> Any:
            watch()
            status = workload_status(cluster)
            return status if (status.get("autoScaling") or {}).get("requests", {}).get("tflopsRequest") else None

        status = eventually("a requests recommendation", recommending, 60, 0.5)
        # tfctl autoscale shows the same decisions, read from the workload's status.
        assert cluster.cp is not None
        shown = subprocess.run(
            [
                str(VENV_BIN / "tfctl"),
                "autoscale",
                "-n",
                NAMESPACE,
                "--kubeconfig",
                str(cluster.cp.kubeconfig("admin")),
            ],
            capture_output=True,
            text=True,
        )
        assert shown.returncode == 0, shown.stderr
        (row,) = [line for line in shown.stdout.splitlines() if line.startswith(NAMESPACE)]
        assert WORKLOAD in row and "-> 20 CappedByLimit" in row and f"hpa/tf-{WORKLOAD}" in row, shown.stdout
        assert status["autoScaling"]["requests"]["tflopsRequest"] == "20"
        assert (condition(status, "RequestsAutoSet") or {}).get("reason") == "CappedByLimit"
        # ... running replicas move to it in place (their GPUs have room), same containers ...
        before = {p.metadata.uid for p in running(core)}

        def resized_in_place() -> Any:
            watch()
            return next(
                (
                    p
                    for p in running(core)
                    if p.metadata.uid in before and allocation_of(p).gpus[0].tflops_request == 20_000
                ),
                None,
            )

        moved = eventually("a running replica's request moved to 20 in place", resized_in_place, 30, 0.5)
        assert moved.status.container_statuses[0].restart_count == 0
        assert "RequestsResized" in events_of(core, moved.metadata.name)
        # ... and a replica created from now on is admitted with it.
        victim = running(core)[0].metadata.name
        core.delete_namespaced_pod(victim, NAMESPACE, grace_period_seconds=0)

        def replacement() -> Any:
            watch()
            fresh = [
                p
                for p in running(core)
                if p.metadata.name != victim and p.metadata.creation_timestamp.timestamp() > time.time() - 60
            ]
            for p in fresh:
                req = resolved.decode(p.metadata.annotations[SystemAnnotation.RESOLVED_REQUEST])
                if req.auto_requests:
                    return p, req
            return None

        new_pod, req = eventually("a replica admitted with the recommended request", replacement, 60, 0.5)
        assert req.tflops_request == 20_000 and "autoSetRequests" in req.auto_requests
        assert allocation_of(new_pod).gpus[0].tflops_request == 20_000
        assert max(seen_replicas) == AUTOSCALER_MAX_REPLICAS
        assert all(b - a == 1 for a, b in itertools.pairwise(seen_replicas) if b > a)

    with Load(cluster, LOW_SM):
        # Limits back to the admitted 20.
        def lowered() -> bool:
            watch()
            return bool(running(core)) and all(allocation_of(p).gpus[0].tflops_limit <= 20_000 for p in running(core))

        eventually("every limit back at its admitted value", lowered, 30, 0.5)

        # Replicas back to 1, one step at a time.
        def one() -> bool:  # from what watch() recorded: a second read could see a step the record missed
            watch()
            return seen_replicas[-1] == 1

        eventually("scaled back to 1 replica", one, 90, 0.5)
        up = seen_replicas.index(max(seen_replicas))
        downs = seen_replicas[up:]
        assert downs[-1] == 1 and all(a - b == 1 for a, b in itertools.pairwise(downs)), seen_replicas

        # The histograms were checkpointed; an extender restarted now recommends from them at once, where
        # empty histograms would wait 8 s (aggregationPeriod) of new history, deciding WaitingForHistory.
        maps = core.list_namespaced_config_map(deploy.system_namespace(), label_selector=checkpoints.SELECTOR)
        assert [
            (m.metadata.annotations or {}).get(checkpoints.WORKLOAD_ANNOTATION) for m in maps.items if m.metadata
        ] == [f"{NAMESPACE}/{WORKLOAD}"]
        cluster.ours.pop("tf-extender").stop()  # SIGTERM: it releases the extender's Lease
        cluster.start_extender()
        decisions = eventually(
            "the restarted extender's requests decisions", lambda: requests_decisions(cluster), 30, 0.3
        )
        assert "WaitingForHistory" not in decisions and "NoSamples" not in decisions, decisions

    # Never above maxRatioToRequests × request: 3 × 10 (the first replicas) or 3 × 20 (the recommended ones).
    assert max(seen_limits) <= 60_000 and 30_000 in seen_limits
    # The restarted leader kept its predecessor's conditions until its own first pass, and has written its own.
    status = workload_status(cluster)
    assert condition(status, "LimitsAutoSet") is not None and condition(status, "ReplicasAutoSet") is not None


def live_limit(uid: str, gpu: str, milli: int) -> dict[str, Any] | None:
    """The container's limits.json on the node, once it holds ``milli`` TFLOPS for ``gpu``."""
    doc = live_limits(uid)
    return doc if doc and doc["gpus"][gpu]["milliTflopsLimit"] == milli else None


def requests_decisions(cluster: Cluster) -> dict[str, float] | None:
    """The requests layer's decisions so far by reason, from the extender's /metrics; None before its first."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster.extender_public_port}/metrics", timeout=5).read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tf_autoscaler_decisions_total" and sample.labels.get("layer") == "requests":
                found[sample.labels["reason"]] = sample.value
    return found or None
