"""What a tenant meets at admission: bad annotations are refused with the whole reason; a forged
allocation is stripped on create (with a warning) and denied on update; the vGPU resource on a pod
that skips the webhook (no opt-in label) is refused by the ValidatingAdmissionPolicy, init
containers included.

The tenant is an ordinary user with the ``edit`` role in one namespace, as in a shared cluster.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import pytest
from kubernetes.client import ApiException, CoreV1Api

from vgpu.contract import allocation
from vgpu.names import RESOURCE_MILLI_TFLOPS, RESOURCE_VGPU, Annotation, Qos

from .cluster import REAL_NODE, Cluster
from .kube import emptied, wait_bound
from .pods import IMAGE, allocation_of, gpu_pod

NAMESPACE = "e2e-tenant"
SHARE = {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "1Gi"}


@pytest.fixture(scope="module")
def tenant(cluster: Cluster) -> Iterator[CoreV1Api]:
    yield cluster.grant_tenant(cluster.namespace(NAMESPACE), "edit")
    emptied(cluster.core, NAMESPACE)


def forged(pod_uid: str) -> str:
    return allocation.encode(
        allocation.PodAllocation(
            pod_uid=pod_uid,
            node=REAL_NODE,
            pool="default-pool",
            qos=Qos.CRITICAL,
            containers=("main",),
            gpus=(
                allocation.GpuGrant(
                    uuid="GPU-e2e0-000000000000",
                    index=0,
                    tflops_request=312_000,
                    tflops_limit=312_000,
                    vram_request=80 << 30,
                    vram_limit=80 << 30,
                    gpu_tflops=312_000,
                ),
            ),
            bound_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
    )


def test_bad_annotation_is_denied_naming_the_key_value_and_accepted_forms(tenant: CoreV1Api) -> None:
    pod = gpu_pod("bad-tflops", {Annotation.TFLOPS_REQUEST: "lots", Annotation.VRAM_REQUEST: "1Gi"})
    with pytest.raises(ApiException) as denied:
        tenant.create_namespaced_pod(NAMESPACE, pod)
    assert denied.value.status == 400
    assert json.loads(denied.value.body)["message"] == (
        'admission webhook "pods.tensor-fusion.ai" denied the request: '
        "tensor-fusion.ai/tflops-request 'lots': not a Kubernetes quantity such as 10, 2.5, 500m, 4Gi, 4096Mi, 4G or 1e3"
    )


def test_request_above_limit_is_denied_naming_the_key(tenant: CoreV1Api) -> None:
    pod = gpu_pod("above-limit", {Annotation.VRAM_REQUEST: "8Gi", Annotation.VRAM_LIMIT: "4Gi"})
    with pytest.raises(ApiException) as denied:
        tenant.create_namespaced_pod(NAMESPACE, pod)
    assert denied.value.status == 400
    assert json.loads(denied.value.body)["message"] == (
        'admission webhook "pods.tensor-fusion.ai" denied the request: '
        "tensor-fusion.ai/vram-request '8Gi': must not exceed the vram limit 4Gi "
        "(request from the pod's annotations, limit from the pod's annotations)"
    )


@pytest.mark.parametrize(
    ("field", "resource"),
    [("containers", RESOURCE_VGPU), ("initContainers", RESOURCE_VGPU), ("containers", RESOURCE_MILLI_TFLOPS)],
)
def test_vgpu_resource_on_a_pod_the_webhook_skips_is_denied_by_the_policy(
    tenant: CoreV1Api, field: str, resource: str
) -> None:
    # Unlabelled, so the webhook never sees it and only the policy stands between the resource and
    # the device plugin. The vGPU container is the pod's only one, or an init container beside a plain one.
    # A hand-set GPU share would spend the namespace's quota and the node's totals without a grant.
    with_vgpu = {"name": "wants-gpu", "image": IMAGE, "resources": {"limits": {resource: "1"}}}
    spec = {"containers": [{"name": "main", "image": IMAGE}], "terminationGracePeriodSeconds": 0, field: [with_vgpu]}
    name = f"bypass-{field.lower()}-{resource.rpartition('/')[2]}"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    with pytest.raises(ApiException) as denied:
        tenant.create_namespaced_pod(NAMESPACE, pod)
    assert denied.value.status == 403
    assert json.loads(denied.value.body)["message"] == (
        f"pods \"{name}\" is forbidden: ValidatingAdmissionPolicy 'tensor-fusion-pod-contract' with binding "
        "'tensor-fusion-pod-contract' denied request: tensor-fusion.ai/vgpu, tensor-fusion.ai/milli-tflops and "
        "tensor-fusion.ai/vram are set by the tensor-fusion webhook: label the pod tensor-fusion.ai/enabled=true "
        "and use the tensor-fusion.ai/* annotations"
    )


def test_forged_allocation_on_create_is_stripped_with_a_warning_and_replaced_at_bind(
    tenant: CoreV1Api, core: CoreV1Api
) -> None:
    pod = gpu_pod("forged-create", {**SHARE, allocation.KEY: forged("0000")})
    created, _, headers = tenant.create_namespaced_pod_with_http_info(NAMESPACE, pod)
    assert headers.getlist("Warning") == [
        '299 - "removed tensor-fusion.ai/allocation: only tensor-fusion components may set it"'
    ]
    assert allocation.KEY not in (created.metadata.annotations or {}), "the webhook stored the tenant's value"
    # Once bound it carries the extender's grant for its real request (default QoS), not the forgery.
    alloc = allocation_of(wait_bound(core, NAMESPACE, "forged-create"))
    assert alloc.pod_uid == created.metadata.uid and alloc.node == REAL_NODE and alloc.qos == Qos.MEDIUM
    assert [(g.tflops_request, g.vram_request) for g in alloc.gpus] == [(10_000, 1 << 30)]


def test_forged_allocation_patch_is_denied(tenant: CoreV1Api, core: CoreV1Api) -> None:
    tenant.create_namespaced_pod(NAMESPACE, gpu_pod("forged-patch", SHARE))
    uid = core.read_namespaced_pod("forged-patch", NAMESPACE).metadata.uid
    with pytest.raises(ApiException) as denied:
        tenant.patch_namespaced_pod(
            "forged-patch", NAMESPACE, {"metadata": {"annotations": {allocation.KEY: forged(uid)}}}
        )
    assert denied.value.status in (403, 422)
    assert allocation.KEY in denied.value.body
