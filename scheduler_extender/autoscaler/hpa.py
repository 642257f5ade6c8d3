"""The HorizontalPodAutoscaler the autoscaler owns for a workload with ``autoSetReplicas``: a pure manifest.

Replicas go through kube-controller-manager's HPA controller rather than our own writes to the scale
subresource: it already implements HPA's rule, tolerance, missing-metric handling and rate limits,
and users and tools already read and pause HPAs. The layer's fields map onto ``autoscaling/v2`` one
to one (a ``Pods`` metric ``gpu_tflops``, ``behavior`` policies and stabilization windows); values
past HPA's bounds are clamped and the clamp is named in the workload's status. The HPA is owned by
its scale target, and only targets whose own pod template opts in are scaled (:func:`opted_in`).
The mapping, field by field: docs/autoscaling.md, section "How it is applied".
"""

from __future__ import annotations

from collections.abc import Mapping
from math import ceil
from typing import Any, Final

from scheduler_extender.objects import OwnerRef
from vgpu.autoscale.config import ReplicasConfig, ReplicaStep
from vgpu.names import DOMAIN, LABEL_ENABLED, Annotation, GpuMetric
from vgpu.quantity import format_milli

API_VERSION: Final = "autoscaling/v2"
GROUP, VERSION, PLURAL = "autoscaling", "v2", "horizontalpodautoscalers"
MANAGED_BY: Final = "tensor-fusion-autoscaler"  # the HPAs' app.kubernetes.io/managed-by and our field manager
LABEL_WORKLOAD: Final = f"{DOMAIN}/workload"
MAX_PERIOD_S: Final = 1800
MAX_WINDOW_S: Final = 3600
SCALABLE: Final = ("Deployment", "StatefulSet", "ReplicaSet")  # apps/v1 kinds the autoscaler scales


def hpa_name(workload: str) -> str:
    """``tf-<workload>``, cut to a DNS label's 63 characters."""
    return f"tf-{workload}"[:63].rstrip("-.")


def _policy(step: ReplicaStep, period_s: int) -> dict[str, Any]:
    return {"type": "Percent" if step.percent else "Pods", "value": step.value, "periodSeconds": period_s}


def _bounded(seconds: float, high: int, low: int, what: str, clamped: list[str]) -> int:
    value = max(low, ceil(seconds))
    if value > high:
        clamped.append(f"{what} {value}s is above HPA's {high}s; the HPA uses {high}s")
        return high
    return value


def manifest(
    namespace: str,
    workload: str,
    target: OwnerRef,
    config: ReplicasConfig,
    *,
    target_tflops: int,
    min_replicas: int,
    max_replicas: int,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The HPA to apply, and what had to be clamped to fit HPA's bounds (said in the workload's status)."""
    clamped: list[str] = []
    period = _bounded(config.evaluation_period_s, MAX_PERIOD_S, 1, "evaluationPeriod", clamped)
    up = _bounded(config.scale_up_cool_down_s, MAX_WINDOW_S, 0, "scaleUpCoolDownTime", clamped)
    down = _bounded(config.scale_down_cool_down_s, MAX_WINDOW_S, 0, "scaleDownCoolDownTime", clamped)
    body = {
        "apiVersion": API_VERSION,
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": hpa_name(workload),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": MANAGED_BY, LABEL_WORKLOAD: workload},
            "ownerReferences": [
                {"apiVersion": target.api_version, "kind": target.kind, "name": target.name, "uid": target.uid}
            ],
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": target.api_version, "kind": target.kind, "name": target.name},
            "minReplicas": min_replicas,
            "maxReplicas": max(max_replicas, min_replicas),
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": GpuMetric.TFLOPS.value},
                        "target": {"type": "AverageValue", "averageValue": format_milli(max(1, target_tflops))},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": up,
                    "selectPolicy": "Max",
                    "policies": [_policy(config.scale_up_step, period)],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": down,
                    "selectPolicy": "Max",
                    "policies": [_policy(config.scale_down_step, period)],
                },
            },
        },
    }
    return body, tuple(clamped)


def opted_in(target: Mapping[str, Any], ref: OwnerRef, workload: str) -> str | None:
    """Why ``target`` (the object ``ref`` names, as read) may not be scaled for ``workload``; None when it may.

    A pod's ``ownerReferences`` are written by whoever creates the pod — a tenant allowed only to create
    pods could name any Deployment of its namespace as its controller. So the autoscaler scales only an
    object that is that very object (same UID) and whose own pod template opts in: labelled
    ``tensor-fusion.ai/enabled`` and naming the same workload. Only someone who may write the Deployment
    can make it so."""
    meta = target.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        return f"{ref.kind} {ref.name} is not the one the pods name as their controller (UID differs)"
    template = ((target.get("spec") or {}).get("template") or {}).get("metadata") or {}
    labels, annotations = template.get("labels") or {}, template.get("annotations") or {}
    if labels.get(LABEL_ENABLED) != "true" or annotations.get(Annotation.WORKLOAD) != workload:
        return (
            f"{ref.kind} {ref.name}'s pod template does not opt in: it must be labelled {LABEL_ENABLED}=true and "
            f"name workload {workload!r} ({Annotation.WORKLOAD}); pods naming it as their controller are not enough"
        )
    return None
