"""Pods written for NVIDIA's device plugin, created in a namespace labelled for migration: what they
are translated to, what cannot be translated and why, and the whole admission that follows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tf_webhook import review
from tf_webhook.decision import decide
from tf_webhook.migration import Migration, ReplicaShare, translate
from vgpu.contract import resolved
from vgpu.errors import DomainError
from vgpu.names import (
    LABEL_ENABLED,
    NVIDIA_GPU,
    NVIDIA_GPU_SHARED,
    RESOURCE_VGPU,
    SCHEDULER_NAME,
    Annotation,
    MigrationMode,
    SystemAnnotation,
)

from .builders import FakeCluster, apply_patch, decode_patch, default_pool, review_of

A = Annotation
GI = 1024**3
WHOLE = Migration(MigrationMode.WHOLE)
QUARTER = ReplicaShare(tflops=78_000, vram=10 * GI)  # a quarter of an A100-40GB per replica
SLICED = Migration(MigrationMode.TIME_SLICED, QUARTER)
LABEL = 'namespace label tensor-fusion.ai/migrate-nvidia-gpu: "true": translated'

Limits = dict[str, str]


def nvidia_review(
    *containers: tuple[str, Limits],
    init: tuple[tuple[str, Limits], ...] = (),
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    operation: str = "CREATE",
) -> dict[str, Any]:
    """A pod create with these containers' resources (limits, and the requests the API server defaults
    from them), as a Deployment written for NVIDIA's device plugin makes it."""
    doc = review_of(
        annotations or {},
        labels={"app": "train"} if labels is None else labels,
        containers=tuple(name for name, _ in containers),
        operation=operation,
    )
    spec = doc["request"]["object"]["spec"]
    for container, (_, limits) in zip(spec["containers"], containers, strict=True):
        container["resources"] = {"limits": {"cpu": "1", **limits}, "requests": {"cpu": "1", **limits}}
    if init:
        spec["initContainers"] = [{"name": n, "image": "busybox", "resources": {"limits": dict(r)}} for n, r in init]
    return doc


def pod_of(doc: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = doc["request"]["object"]
    return pod


def annotations_of(doc: dict[str, Any], migration: Migration = WHOLE) -> dict[str, str]:
    """The tensor-fusion annotations the pod is translated to."""
    translation = translate(pod_of(doc), migration)
    assert translation is not None
    return {k: v for k, v in translation.pod["metadata"]["annotations"].items() if k.startswith("tensor-fusion.ai/")}


def refusal(doc: dict[str, Any], migration: Migration = WHOLE) -> str:
    with pytest.raises(DomainError) as refused:
        translate(pod_of(doc), migration)
    return str(refused.value)


def admit(doc: dict[str, Any], migration: Migration | None = WHOLE) -> dict[str, Any]:
    """The AdmissionReview response of the webhook entry for ``migration`` (None: ``/mutate``)."""
    req = review.parse(json.dumps(doc).encode())
    cluster = FakeCluster(pools=[default_pool(resources={"requests": {"tflops": "5", "vram": "1Gi"}})])
    return review.respond(req.uid, decide(req, cluster, migration=migration).verdict)["response"]


def test_one_gpu_becomes_one_whole_gpu_with_the_warning_naming_what_was_translated() -> None:
    doc = nvidia_review(("main", {NVIDIA_GPU: "1"}))
    translation = translate(pod_of(doc), WHOLE)
    assert translation is not None
    assert translation.warnings == (
        f'{LABEL} container "main" nvidia.com/gpu: 1 to the label tensor-fusion.ai/enabled: "true", '
        'tensor-fusion.ai/gpu-count: "1", tensor-fusion.ai/dedicated-gpu: "true", '
        'tensor-fusion.ai/inject-container: "main" (1 whole GPU)',
    )
    pod = apply_patch(pod_of(doc), list(translation.ops))
    assert pod["metadata"]["labels"] == {"app": "train", LABEL_ENABLED: "true"}
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}
    assert {k: pod[k] for k in ("metadata", "spec")} == {
        "metadata": {**translation.pod["metadata"], "annotations": {}},  # the decision patches the annotations
        "spec": translation.pod["spec"],
    }


def test_n_gpus_in_several_containers_add_up_each_container_its_own() -> None:
    """As NVIDIA's plugin gives them: the trainer 2 GPUs, the evaluator 1 other (container-gpu-count)."""
    doc = nvidia_review(("trainer", {NVIDIA_GPU: "2"}), ("logger", {}), ("evaluator", {NVIDIA_GPU: "1"}))
    assert annotations_of(doc) == {
        A.GPU_COUNT: "3",
        A.DEDICATED_GPU: "true",
        A.INJECT_CONTAINER: "trainer,evaluator",
        A.CONTAINER_GPU_COUNT: '{"trainer":2,"evaluator":1}',
    }
    (warning,) = translate(pod_of(doc), WHOLE).warnings  # type: ignore[union-attr]
    assert warning.startswith(f'{LABEL} container "trainer" nvidia.com/gpu: 2, container "evaluator" nvidia.com/gpu: 1')
    assert warning.endswith("(3 whole GPUs, each container its own, as it asked)")
    response = admit(doc)  # and the decision admits it: each container's vgpu devices are its own count
    assert response["allowed"] is True, response
    pod = apply_patch(pod_of(doc), decode_patch(response))
    assert [(c.get("resources") or {}).get("limits", {}).get(RESOURCE_VGPU) for c in pod["spec"]["containers"]] == [
        "2",
        None,
        "1",
    ]


REPLICAS_OF_A_QUARTER = {A.GPU_COUNT: "1", A.TFLOPS_REQUEST: "156", A.VRAM_REQUEST: "20Gi"}


@pytest.mark.parametrize(
    ("resource", "migration", "annotations", "meaning"),
    [
        (NVIDIA_GPU, WHOLE, {A.GPU_COUNT: "2", A.DEDICATED_GPU: "true"}, "2 whole GPUs"),
        (
            "nvidia.com/mig-1g.5gb",
            WHOLE,
            {A.GPU_COUNT: "2", A.GPU_MODEL: "1g.5gb", A.DEDICATED_GPU: "true"},
            "2 whole MIG instances of profile 1g.5gb",
        ),
        (NVIDIA_GPU, SLICED, REPLICAS_OF_A_QUARTER, "2 time-sliced replicas"),
        (NVIDIA_GPU_SHARED, SLICED, REPLICAS_OF_A_QUARTER, "2 time-sliced replicas"),
        (NVIDIA_GPU_SHARED, Migration(MigrationMode.WHOLE, QUARTER), REPLICAS_OF_A_QUARTER, "2 time-sliced replicas"),
    ],
)
def test_each_kind_of_ask_becomes_its_share(
    resource: str, migration: Migration, annotations: dict[str, str], meaning: str
) -> None:
    """Whole GPUs and MIG instances are dedicated; a time-sliced replica is its configured share of one GPU."""
    doc = nvidia_review(("main", {resource: "2"}))
    assert annotations_of(doc, migration) == {**annotations, A.INJECT_CONTAINER: "main"}
    (warning,) = translate(pod_of(doc), migration).warnings  # type: ignore[union-attr]
    assert warning.endswith(f"({meaning})")


def test_a_replica_share_may_name_vram_only() -> None:
    doc = nvidia_review(("main", {NVIDIA_GPU: "1"}))
    got = annotations_of(doc, Migration(MigrationMode.TIME_SLICED, ReplicaShare(vram=8 * GI)))
    assert (A.TFLOPS_REQUEST in got, got[A.VRAM_REQUEST]) == (False, "8Gi")


def test_the_pods_own_annotations_win_and_a_pod_sizing_its_share_gets_none() -> None:
    own = {A.GPU_MODEL.value: "A100", A.VRAM_REQUEST.value: "8Gi", A.GPU_COUNT.value: "2"}
    doc = nvidia_review(("main", {NVIDIA_GPU: "1"}), annotations=own)
    assert annotations_of(doc) == {**own, A.INJECT_CONTAINER: "main"}  # no dedicated-gpu beside its vram
    assert annotations_of(doc, Migration(MigrationMode.TIME_SLICED)) == {**own, A.INJECT_CONTAINER: "main"}
    (warning,) = translate(pod_of(doc), WHOLE).warnings  # type: ignore[union-attr]
    assert warning == (
        f'{LABEL} container "main" nvidia.com/gpu: 1 to the label tensor-fusion.ai/enabled: "true", '
        'tensor-fusion.ai/inject-container: "main" (the GPU share the pod\'s own annotations size)'
    )


@pytest.mark.parametrize(
    "doc",
    [
        nvidia_review(("main", {})),  # no GPU
        nvidia_review(("main", {NVIDIA_GPU: "0"})),  # nothing asked
        nvidia_review(("main", {"nvidia.com/hostdev": "1"})),  # not a GPU of NVIDIA's GPU plugin
        nvidia_review(("main", {NVIDIA_GPU: "1"}), labels={LABEL_ENABLED: "false"}),  # the pod's own decision
        nvidia_review(("main", {NVIDIA_GPU: "1"}), labels={LABEL_ENABLED: "true"}),
    ],
)
def test_pods_asking_for_no_nvidia_gpu_or_labelled_by_their_author_are_not_translated(doc: dict[str, Any]) -> None:
    assert translate(pod_of(doc), WHOLE) is None


def test_init_containers_are_refused_their_gpus_with_the_way_out() -> None:
    doc = nvidia_review(("main", {NVIDIA_GPU: "1"}), init=(("warmup", {NVIDIA_GPU: "1"}),))
    assert refusal(doc) == (
        "init container \"warmup\" nvidia.com/gpu '1': tensor-fusion gives GPUs to app containers only; move this "
        'work into a container, or label the pod tensor-fusion.ai/enabled: "false" to leave it to NVIDIA\'s device plugin'
    )


def test_two_kinds_of_gpu_in_one_pod_are_refused() -> None:
    doc = nvidia_review(("a", {NVIDIA_GPU: "1"}), ("b", {"nvidia.com/mig-1g.5gb": "1"}))
    assert refusal(doc) == (
        'container "a" nvidia.com/gpu: 1, container "b" nvidia.com/mig-1g.5gb: 1: a tensor-fusion pod holds GPUs of '
        "one kind (whole, time-sliced replicas or one MIG profile); ask for one of them"
    )


def test_a_replica_without_a_configured_share_is_refused_naming_the_chart_value() -> None:
    doc = nvidia_review(("main", {NVIDIA_GPU_SHARED: "1"}))
    assert refusal(doc) == (
        'container "main" nvidia.com/gpu.shared: 1: a time-sliced replica\'s share is not configured: set the '
        "chart's webhook.migration.replicaShare (tflops and/or vram per replica), or size the pod's share with "
        "tensor-fusion.ai/tflops-request / tensor-fusion.ai/vram-request"
    )


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"limits": {NVIDIA_GPU: "1500m"}}, "container \"main\" nvidia.com/gpu '1500m': must be a whole number from 0 to 128"),
        ({"limits": {NVIDIA_GPU: "2"}, "requests": {NVIDIA_GPU: "1"}},
         "container \"main\" nvidia.com/gpu '2': limit and request (1) differ; Kubernetes needs them equal"),
    ],
)  # fmt: skip
def test_a_count_that_is_no_whole_number_or_differs_between_request_and_limit_is_refused(
    resources: dict[str, Any], message: str
) -> None:
    doc = nvidia_review(("main", {}))
    pod_of(doc)["spec"]["containers"][0]["resources"] = resources
    assert refusal(doc) == message


def test_the_translated_pod_is_admitted_like_any_tensor_fusion_pod() -> None:
    doc = nvidia_review(("main", {NVIDIA_GPU: "2"}))
    response = admit(doc)
    assert response["allowed"] is True and response["warnings"][0].startswith(LABEL)
    pod = apply_patch(pod_of(doc), decode_patch(response))
    assert pod["metadata"]["labels"][LABEL_ENABLED] == "true"
    assert pod["spec"]["schedulerName"] == SCHEDULER_NAME
    ours = {RESOURCE_VGPU: "2"}  # whole GPUs: no share known before bind, so none on the node totals
    assert pod["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1", **ours},
        "requests": {"cpu": "1", **ours},
    }
    got = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    assert (got.dedicated_gpu, got.gpu_count, got.containers, got.tflops_request, got.vram_request) == (
        True,
        2,
        ("main",),
        0,
        0,
    )


def test_only_creates_are_translated_so_running_pods_are_never_touched() -> None:
    for operation in ("UPDATE", "DELETE", "CONNECT"):
        response = admit(nvidia_review(("main", {NVIDIA_GPU: "1"}), operation=operation))
        assert response == {"uid": response["uid"], "allowed": True}


def test_a_pod_asking_for_no_gpu_in_a_migrated_namespace_is_untouched() -> None:
    response = admit(nvidia_review(("main", {})))
    assert response == {"uid": response["uid"], "allowed": True}


def test_mutate_never_translates_and_denies_our_label_beside_nvidias_gpu() -> None:
    unlabelled = admit(nvidia_review(("main", {NVIDIA_GPU: "1"})), migration=None)
    assert unlabelled == {"uid": unlabelled["uid"], "allowed": True}
    both = nvidia_review(
        ("main", {NVIDIA_GPU: "1"}), labels={LABEL_ENABLED: "true"}, annotations={A.VRAM_REQUEST: "1Gi"}
    )
    for migration in (None, WHOLE):  # the migration entry never sees a labelled pod, but would say the same
        response = admit(both, migration=migration)
        assert (response["allowed"], response["status"]["code"]) == (False, 400)
        assert response["status"]["message"] == (
            'container "main" nvidia.com/gpu: 1: a pod labelled tensor-fusion.ai/enabled: "true" takes its GPUs from '
            "tensor-fusion, as its tensor-fusion.ai/ annotations size them; remove NVIDIA's resource, or, in a "
            "namespace labelled tensor-fusion.ai/migrate-nvidia-gpu, remove the label and the resource is translated"
        )


def test_a_refused_translation_is_a_denial_with_the_reason() -> None:
    response = admit(nvidia_review(("main", {NVIDIA_GPU: "1"}), init=(("warmup", {NVIDIA_GPU: "1"}),)))
    assert (response["allowed"], response["status"]["code"]) == (False, 400)
    assert response["status"]["message"].startswith("init container \"warmup\" nvidia.com/gpu '1': tensor-fusion")
