"""A batch/v1 Job whose pod template opts in: its template carries our resources from its creation, as Kueue
counts them, and the pods the Job controller makes from it meet the pod webhook already shaped."""

from __future__ import annotations

import copy
import json
from typing import Any

from fastapi.testclient import TestClient

from tf_webhook import review
from tf_webhook.app import MUTATE_PATH, create_app
from tf_webhook.decision import Decision, decide
from tf_webhook.job_template import decide_job
from tf_webhook.settings import WebhookSettings
from vgpu.contract import resolved
from vgpu.names import (
    QOS_PRIORITY_VALUE,
    RESOURCE_MILLI_TFLOPS,
    RESOURCE_VGPU,
    RESOURCE_VRAM,
    SCHEDULER_NAME,
    Annotation,
    Qos,
    SystemAnnotation,
)

from .builders import FakeCluster, apply_patch, body, decode_patch, review_of

A = Annotation
GI = 1024**3
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SHARE = {A.TFLOPS_REQUEST.value: "30", A.VRAM_REQUEST.value: "6Gi", A.GPU_COUNT.value: "2"}


def job_review(annotations: dict[str, str], *, spec: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    """A Job CREATE as the API server sends it, its pod template the seed pod's metadata and spec."""
    doc = review_of(annotations, spec=spec, **kw)
    request = doc["request"]
    pod = request["object"]
    pod_spec = {k: v for k, v in pod["spec"].items() if k != "priority"} | {"restartPolicy": "Never"}  # a pod's only
    template = {"metadata": {k: pod["metadata"][k] for k in ("labels", "annotations")}, "spec": pod_spec}
    request["object"] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "default", "labels": {"kueue.x-k8s.io/queue-name": "gpu"}},
        "spec": {"parallelism": 3, "completions": 3, "suspend": True, "template": template},
    }
    for key in ("kind", "requestKind"):
        request[key] = {"group": "batch", "version": "v1", "kind": "Job"}
    for key in ("resource", "requestResource"):
        request[key] = {"group": "batch", "version": "v1", "resource": "jobs"}
    request["userInfo"]["username"] = "alice"
    return doc


def decide_for(doc: dict[str, Any], cluster: FakeCluster | None = None) -> tuple[dict[str, Any], Decision]:
    req = review.parse(body(doc))
    bound = cluster or FakeCluster()
    decision = decide_job(req, lambda pod: decide(pod, bound, (TOLERATION,)))
    return review.respond(req.uid, decision.verdict)["response"], decision


def patched_job(doc: dict[str, Any], cluster: FakeCluster | None = None) -> dict[str, Any]:
    response, decision = decide_for(doc, cluster)
    assert response["allowed"] is True, response
    assert decision.upsert is None
    job: dict[str, Any] = apply_patch(doc["request"]["object"], decode_patch(response))
    return job


def denial(doc: dict[str, Any]) -> str:
    response, decision = decide_for(doc)
    assert response["allowed"] is False and "patch" not in response and decision.upsert is None
    message: str = response["status"]["message"]
    return message


def test_the_template_carries_the_shares_kueue_counts_and_no_pod_only_field() -> None:
    job = patched_job(job_review(SHARE))
    template = job["spec"]["template"]
    ours = {RESOURCE_VGPU: "2", RESOURCE_MILLI_TFLOPS: "60000", RESOURCE_VRAM: str(12 * GI)}  # per pod: 2 GPUs
    assert template["spec"]["containers"][0]["resources"] == {"requests": ours, "limits": ours}
    assert template["spec"]["schedulerName"] == SCHEDULER_NAME
    assert template["spec"]["priorityClassName"] == Qos.MEDIUM.priority_class  # Kueue's priority is the pods'
    assert "priority" not in template["spec"]  # each pod's, from its class
    assert TOLERATION in template["spec"]["tolerations"]
    assert template["metadata"]["annotations"] == SHARE  # the tenant's keys, no resolved request
    assert job["spec"]["parallelism"] == 3 and job["metadata"] == job_review(SHARE)["request"]["object"]["metadata"]


def test_the_pods_made_from_the_template_only_gain_their_resolved_request() -> None:
    job = patched_job(job_review(SHARE))
    template = job["spec"]["template"]
    doc = review_of(SHARE)  # the pod the Job controller creates from the patched template
    pod = doc["request"]["object"]
    pod["metadata"]["labels"], pod["metadata"]["annotations"] = template["metadata"]["labels"], dict(SHARE)
    pod["spec"] = copy.deepcopy(template["spec"]) | {"priority": QOS_PRIORITY_VALUE[Qos.MEDIUM]}  # Priority plugin
    verdict = decide(review.parse(body(doc)), FakeCluster(), (TOLERATION,)).verdict
    ops = decode_patch(review.respond("u", verdict)["response"])
    assert [op["path"] for op in ops] == ["/metadata/annotations"], ops
    after = apply_patch(pod, ops)
    assert after["spec"] == pod["spec"]  # resources, scheduler, class, tolerations: as the template said
    got = resolved.decode(after["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    assert (got.tflops_request, got.vram_request, got.gpu_count) == (30_000, 6 * GI, 2)


def test_a_bad_template_is_refused_at_job_creation_naming_the_key() -> None:
    message = denial(job_review({A.TFLOPS_REQUEST.value: "lots", A.VRAM_REQUEST.value: "1Gi"}))
    assert message.startswith("spec.template: tensor-fusion.ai/tflops-request 'lots'"), message
    message = denial(job_review(SHARE, spec={"nodeName": "gpu-1"}))
    assert message.startswith("spec.template: spec.nodeName 'gpu-1': a tensor-fusion pod is placed"), message


def test_a_malformed_job_is_refused_with_what_is_wrong() -> None:
    doc = job_review(SHARE)
    doc["request"]["object"]["spec"]["template"] = "pod"
    assert denial(doc) == "malformed job: spec.template must be an object"
    doc["request"]["object"]["spec"]["template"] = {"metadata": {"labels": {"tensor-fusion.ai/enabled": "true"}}}
    assert denial(doc) == "spec.template: malformed pod: metadata and spec must be objects"


def test_a_template_that_does_not_opt_in_is_left_alone() -> None:
    response, _ = decide_for(job_review(SHARE, labels={"app": "x"}))
    assert response["allowed"] is True and "patch" not in response


def test_a_forged_allocation_is_removed_from_the_template() -> None:
    forged = {**SHARE, SystemAnnotation.ALLOCATION.value: "{}"}
    response, _ = decide_for(job_review(forged))
    template = apply_patch(job_review(forged)["request"]["object"], decode_patch(response))["spec"]["template"]
    assert template["metadata"]["annotations"] == SHARE
    assert f"removed {SystemAnnotation.ALLOCATION}: only tensor-fusion components may set it" in response["warnings"]


def test_through_http_a_job_is_patched_and_no_workload_written_for_it() -> None:
    cluster = FakeCluster()
    annotations = {**SHARE, A.WORKLOAD.value: "train", A.GENERATE_WORKLOAD.value: "true"}
    with TestClient(create_app(WebhookSettings(), cluster)) as client:
        reply = client.post(MUTATE_PATH, content=body(job_review(annotations)))
    response = json.loads(reply.text)["response"]
    assert reply.status_code == 200 and response["allowed"] is True
    paths = {op["path"] for op in decode_patch(response)}
    assert "/spec/template/spec/containers/0/resources" in paths, paths
    assert cluster.writes == []  # the pods write it when they are created
