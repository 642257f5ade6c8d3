"""What a workload's status says about its autoscaling, from one evaluation: pure.

``status.autoScaling`` carries each enabled layer's recommendation beside the current value, and
``status.conditions`` one condition per enabled layer (``LimitsAutoSet``, ``RequestsAutoSet``,
``ReplicasAutoSet``) whose reason is the decision's (``LimitsRaised``, ``AtMaxRatio``,
``WaitingForHistory``, ``CoolingDown``, …) and whose message says why in numbers; a ``Prediction``
condition is False (``NotImplemented``) while a layer's prediction block is enabled, since nothing
predicts. The webhook reads ``status.autoScaling.requests``: its ``tflopsRequest`` / ``vramRequest`` are
present only once the requests layer has a recommendation to give (enough history): new pods of the
workload are admitted with them, running ones move to them where their GPU has room (``resize.py``), and
``runningPodsWithoutRoom`` counts those that keep their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

from scheduler_extender.autoscaler.resize import NO_RECOMMENDATION
from scheduler_extender.status import Condition
from vgpu.autoscale.evaluate import Evaluation, LimitDecision, Workload
from vgpu.autoscale.recommend import Decision, Reason
from vgpu.names import CONDITION_LIMITS, CONDITION_PREDICTION, CONDITION_REPLICAS, CONDITION_REQUESTS
from vgpu.quantity import format_bytes, format_milli

MAX_PODS_SHOWN: Final = 20  # status.autoScaling.limits.pods: a status is no place for thousands of rows
# Which limit decision speaks for the layer when pods differ: a change first, then a cap (the other pods' hold
# on the GPU's memory before the GPU's own size: it is the one a user can act on), then the rest.
_RANK: Final = {
    Reason.LIMITS_RAISED: 0,
    Reason.LIMITS_LOWERED: 1,
    Reason.AT_MAX_RATIO: 2,
    Reason.CAPPED_BY_OTHER_PODS: 3,
    Reason.CAPPED_BY_GPU: 4,
    Reason.NO_SAMPLES: 5,
    Reason.WAITING_FOR_HISTORY: 6,
    Reason.INSIDE_IGNORED_RANGE: 7,
    Reason.UNCHANGED: 8,
}


def autoscaling_status(
    workload: Workload,
    evaluation: Evaluation,
    *,
    hpa: str | None,
    replicas_problem: str | None,
    predictions: Sequence[str],
    last_changes: dict[str, str],
    no_room: int = 0,
) -> tuple[dict[str, Any], tuple[Condition, ...]]:
    """``status.autoScaling`` and the layers' conditions; ``last_changes``: layer → when it last changed
    something (RFC 3339), kept by the controller."""
    config = workload.config
    fields: dict[str, Any] = {}
    conditions: list[Condition] = []
    if config.limits.enable:
        fields["limits"] = _limits(evaluation.limits, last_changes.get("limits"))
        conditions.append(_limits_condition(evaluation.limits))
    if config.requests.enable and evaluation.requests_tflops and evaluation.requests_vram:
        fields["requests"], condition = _requests(workload, evaluation.requests_tflops, evaluation.requests_vram)
        if no_room:
            fields["requests"]["runningPodsWithoutRoom"] = no_room
            kept = f"; {no_room} running pods keep their requests: their GPU has no room for the recommendation"
            condition = replace(condition, message=condition.message + kept)
        if "requests" in last_changes:
            fields["requests"]["lastChange"] = last_changes["requests"]
        conditions.append(condition)
    if config.replicas.enable:
        fields["replicas"] = {
            "current": workload.replicas,
            "min": workload.min_replicas,
            "max": workload.max_replicas,
            "targetTflopsPerReplica": format_milli(evaluation.replica_target_tflops),
            **({"horizontalPodAutoscaler": hpa} if hpa else {}),
        }
        if evaluation.replicas is not None:
            fields["replicas"]["recommended"] = evaluation.replicas.value
        conditions.append(_replicas_condition(evaluation.replicas, hpa, replicas_problem))
    if predictions:
        conditions.append(
            Condition(
                CONDITION_PREDICTION,
                False,
                "NotImplemented",
                f"{', '.join(predictions)}.prediction is enabled but nothing predicts usage yet; "
                "decisions use measured usage only",
            )
        )
    return fields, tuple(conditions)


def _speaker(d: LimitDecision) -> Decision:
    """The one of a pod GPU's two decisions (TFLOPS, VRAM) that says the most: the higher-ranked, TFLOPS on a tie
    (a resource not auto-set never speaks while the other is)."""
    if d.vram.reason is Reason.DISABLED:
        return d.tflops
    if d.tflops.reason is Reason.DISABLED:
        return d.vram
    return d.vram if _RANK.get(d.vram.reason, 9) < _RANK.get(d.tflops.reason, 9) else d.tflops


def _limits(decisions: Sequence[LimitDecision], last_change: str | None) -> dict[str, Any]:
    shown = sorted(decisions, key=lambda d: (_RANK.get(_speaker(d).reason, 9), d.pod, d.gpu))[:MAX_PODS_SHOWN]
    out: dict[str, Any] = {
        "pods": [
            {
                "pod": d.pod,
                "gpu": d.gpu,
                "tflopsLimit": format_milli(d.tflops.value),
                "vramLimit": format_bytes(d.vram.value),
                "reason": _speaker(d).reason.value,
            }
            for d in shown
        ],
        "raised": sum(d.tflops.value > d.tflops.current or d.vram.value > d.vram.current for d in decisions),
        "lowered": sum(d.tflops.value < d.tflops.current or d.vram.value < d.vram.current for d in decisions),
    }
    if last_change:
        out["lastChange"] = last_change
    return out


def _limits_condition(decisions: Sequence[LimitDecision]) -> Condition:
    if not decisions:
        return Condition(CONDITION_LIMITS, False, Reason.NO_SAMPLES.value, "no pod of the workload holds a GPU yet")
    speaker = min(
        (x for d in decisions for x in (d.tflops, d.vram) if x.reason is not Reason.DISABLED),
        key=lambda x: _RANK.get(x.reason, 9),
        default=decisions[0].tflops,
    )
    pod = next(d.pod for d in decisions if speaker in (d.tflops, d.vram))
    changed = sum(d.changed for d in decisions)
    return Condition(
        CONDITION_LIMITS,
        True,
        speaker.reason.value,
        f"{changed} of {len(decisions)} pod GPUs changed; pod {pod}: {speaker.message}",
    )


def _requests(workload: Workload, tflops: Decision, vram: Decision) -> tuple[dict[str, Any], Condition]:
    fields: dict[str, Any] = {
        "current": {
            "tflopsRequest": format_milli(workload.tflops_request),
            "vramRequest": format_bytes(workload.vram_request),
        },
    }
    for key, decision, fmt in (("tflopsRequest", tflops, format_milli), ("vramRequest", vram, format_bytes)):
        if decision.reason not in NO_RECOMMENDATION:
            fields[key] = fmt(decision.value)
    speaker = tflops if tflops.reason is not Reason.DISABLED else vram
    fields["reason"] = speaker.reason.value
    return fields, Condition(CONDITION_REQUESTS, True, speaker.reason.value, f"{tflops.message}; {vram.message}")


def _replicas_condition(decision: Decision | None, hpa: str | None, problem: str | None) -> Condition:
    if problem:
        return Condition(CONDITION_REPLICAS, False, "NoScaleTarget", problem)
    if decision is None:
        return Condition(CONDITION_REPLICAS, True, Reason.NO_SAMPLES.value, "not evaluated yet")
    via = f"; HorizontalPodAutoscaler {hpa} scales the workload" if hpa else ""
    return Condition(CONDITION_REPLICAS, True, decision.reason.value, decision.message + via)
