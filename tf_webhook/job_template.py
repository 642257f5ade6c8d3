"""The admission decision for a batch/v1 Job whose pod template opts in: the template shaped now as its
pods will be when they are created.

WHY: Kueue's Job integration (docs/kueue.md) builds its Workload, hence what a ClusterQueue's quota counts,
from the Job's pod template, while the webhook gives a pod its GPU shares as node resources
(``tensor-fusion.ai/vgpu``, ``milli-tflops``, ``vram``) only when the pod is created, after Kueue admitted
the Job: without this a quota on them would count nothing. So the template is decided as the pod it
describes (``decision.decide``: the same resolution, defaults and refusals) and gets that pod's patch, less
what only a pod may carry: the resolved-request annotation (a system key, re-derived for every pod at its
creation) and ``spec.priority`` (the Priority admission plugin computes each pod's from its class). The
pods the Job controller creates from the template then meet the pod webhook already shaped, and their patch
only adds the resolved request. A bad template is refused when the Job is created, with the pod's message,
so no queue holds a Job whose pods would all be denied. A TensorFusionWorkload that ``generate-workload``
asks for is written when the pods are created, not here: a queued Job may wait for hours.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

from tf_webhook.decision import Decision
from tf_webhook.pod_patch import Op, pointer
from tf_webhook.review import ReviewRequest, allow, deny
from vgpu.names import SystemAnnotation

JOB: Final = ("batch", "Job", "CREATE")
_TEMPLATE: Final = pointer("spec", "template")
_POD_ONLY: Final = frozenset((pointer("spec", "priority"),))
_ANNOTATIONS: Final = pointer("metadata", "annotations")


def is_job_create(review: ReviewRequest) -> bool:
    return (review.group, review.kind, review.operation) == JOB


def decide_job(review: ReviewRequest, decide_pod: Callable[[ReviewRequest], Decision]) -> Decision:
    """Decide on a Job CREATE by deciding its template as a pod CREATE (``decide_pod``, the pod decision
    with the cluster and tolerations bound) and moving the pod's patch under ``spec.template``."""
    spec = review.object.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None
    if not isinstance(template, Mapping):
        return Decision(deny("malformed job: spec.template must be an object"))
    pod = {"metadata": template.get("metadata") or {}, "spec": template.get("spec")}
    as_pod = replace(review, group="", version="v1", kind="Pod", object=pod)
    verdict = decide_pod(as_pod).verdict
    if not verdict.allowed:
        return Decision(replace(verdict, message=f"spec.template: {verdict.message}"))
    ops = [moved for op in verdict.patch if (moved := _on_template(op)) is not None]
    return Decision(allow(patch=ops, warnings=verdict.warnings))


def _on_template(op: Mapping[str, Any]) -> Op | None:
    """A pod patch's operation applied to the Job's template instead, or None for what only a pod carries."""
    path = str(op["path"])
    if path in _POD_ONLY:
        return None
    moved: Op = {**op, "path": _TEMPLATE + path}
    if path == _ANNOTATIONS:
        moved["value"] = {k: v for k, v in op["value"].items() if k != SystemAnnotation.RESOLVED_REQUEST}
    return moved
