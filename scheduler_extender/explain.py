"""Why is this pod pending, and what would happen if I submitted that one: per-node verdicts as JSON.

kube-scheduler's FailedScheduling event only counts reasons; users and the CLI need the whole
picture: the pod's request as the extender read it, each node's verdict with its reason and score,
the one-line summary, and for a bound pod its allocation and hand-off state. This module shapes
that answer from the same core calls filter and prioritize make, and changes nothing: no
reservation, no event. A submitted (not yet admitted) pod is resolved from its annotations alone,
as the webhook would do before consulting WorkloadProfiles and pools. A submitted object whose
metadata, labels, annotations, spec or containers are not shaped as in a Pod is refused with
:class:`MalformedPod` naming each such field (the API server would refuse it too).
"""

from __future__ import annotations

import json
from typing import Any

from scheduler_extender.handoff import HandoffGate
from scheduler_extender.objects import ScheduledPod, pod_record, pod_ref, scheduled_pod
from scheduler_extender.verbs import Verbs
from scheduler_extender.wire import RawObject
from vgpu.contract import allocation as allocation_contract
from vgpu.contract import resolved as resolved_contract
from vgpu.errors import DomainError, FieldError
from vgpu.fields import shown
from vgpu.names import SystemAnnotation
from vgpu.request import PodView, is_enabled, referenced_profile, referenced_workload, resolve
from vgpu.scheduling.summary import summarize


def explain_pod(verbs: Verbs, gate: HandoffGate, pod: RawObject) -> dict[str, Any]:
    """The explanation for an existing pod (as read from the API server)."""
    scheduled = scheduled_pod(pod)
    answer = _head(scheduled)
    record = pod_record(pod)
    if record.allocation is not None:
        answer["allocation"] = json.loads(allocation_contract.encode(record.allocation))
        answer["handoff"] = (
            "received"
            if record.receipt
            else "admitted by the kubelet"
            if record.admitted
            else "waiting for the device plugin's receipt or the kubelet's admission"
        )
        answer["gate"] = [
            {"pod": h.pod_key, "since": h.since, "inFlight": h.in_flight} for h in gate.holders(record.allocation.node)
        ]
    elif record.allocation_error:
        answer["allocationError"] = record.allocation_error
    if record.node_name is not None:
        answer["boundTo"] = record.node_name
        answer["phase"] = record.phase
    if scheduled.request is not None and record.node_name is None:
        answer.update(_verdicts(verbs, scheduled))
    return answer


class MalformedPod(DomainError):
    """A submitted object that is not shaped like a Pod; each error names the field."""


def explain_submission(verbs: Verbs, pod: RawObject) -> dict[str, Any]:
    """What would happen to this pod spec: the webhook's verdict on its annotations, then each node's.

    Raises :class:`MalformedPod` when the object is not shaped like a Pod.
    """
    _check_shape(pod)
    view = PodView.from_pod(pod)
    notes: list[str] = []
    if SystemAnnotation.RESOLVED_REQUEST not in view.annotations:
        try:
            enabled = is_enabled(view.labels)
            request = resolve(view) if enabled else None
        except DomainError as exc:
            return {"pod": pod_ref(pod).key, "gpu": True, "admitted": False, "errors": [str(e) for e in exc.errors]}
        if request is None:
            return {"pod": pod_ref(pod).key, "gpu": False, "summary": "not a GPU pod: every node passes"}
        if referenced_profile(view) or referenced_workload(view):
            notes.append("resolved from the pod's annotations only; the WorkloadProfile/workload it names was not read")
        annotated = {**view.annotations, SystemAnnotation.RESOLVED_REQUEST: resolved_contract.encode(request)}
        pod = {**pod, "metadata": {**(pod.get("metadata") or {}), "annotations": annotated}}
    answer = _head(scheduled_pod(pod))
    if notes:
        answer["notes"] = notes
    if answer.get("request") is not None:
        answer.update(_verdicts(verbs, scheduled_pod(pod)))
    return answer


def _check_shape(pod: RawObject) -> None:
    """The parts of a Pod read here must have a Pod's JSON types (absent or null is fine)."""
    errors: list[FieldError] = []

    def expect(key: str, value: object, kind: type, what: str) -> bool:
        if value is None or isinstance(value, kind):
            return True
        errors.append(FieldError(key, shown(value), f"must be {what}, not {_json_type(value)}"))
        return False

    meta, spec = pod.get("metadata"), pod.get("spec")
    if expect("metadata", meta, dict, "an object") and meta is not None:
        for field in ("labels", "annotations"):
            values = meta.get(field)
            key = f"metadata.{field}"
            if expect(key, values, dict, "an object of strings") and values is not None:
                for name, value in values.items():
                    expect(f"{key}[{name!r}]", value, str, "a string")
    if expect("spec", spec, dict, "an object") and spec is not None:
        expect("spec.containers", spec.get("containers"), list, "an array")
    if errors:
        raise MalformedPod(errors)


def _json_type(value: object) -> str:
    """What a non-null JSON value is, in words."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    return "a boolean" if isinstance(value, bool) else "a number"


def _head(pod: ScheduledPod) -> dict[str, Any]:
    answer: dict[str, Any] = {"pod": pod.ref.key, "uid": pod.ref.uid, "gpu": pod.is_gpu_pod}
    if pod.request is not None:
        answer["request"] = pod.request.describe()
    elif pod.request_error is not None:
        answer["error"] = pod.request_error
        answer["summary"] = pod.request_error
    else:
        answer["summary"] = "not a GPU pod: every node passes"
    return answer


def _verdicts(verbs: Verbs, pod: ScheduledPod) -> dict[str, Any]:
    demand, result, scores = verbs.explain(pod)
    nodes: dict[str, dict[str, Any]] = {}
    for name in result.passed:
        nodes[name] = {"verdict": "fits", "score": scores.get(name, 0)}
    for name, reason in result.failed.items():
        nodes[name] = {"verdict": "unschedulable", "reason": reason.message, "code": reason.code.value}
    for name, reason in result.unresolvable.items():
        nodes[name] = {"verdict": "unresolvable", "reason": reason.message, "code": reason.code.value}
    return {
        "schedulable": bool(result.passed),
        "summary": summarize(demand, result),
        "nodes": dict(sorted(nodes.items())),
    }
