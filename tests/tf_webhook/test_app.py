"""The webhook through HTTP: the FastAPI shell around the decision, with an injected cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from tf_webhook.app import MIGRATE_PATHS, MUTATE_PATH, create_app
from tf_webhook.cluster import ClusterUnavailable
from tf_webhook.settings import WebhookSettings
from tf_webhook.workload import WorkloadUpsert
from vgpu.contract import resolved
from vgpu.names import (
    NVIDIA_GPU,
    RESOURCE_MILLI_TFLOPS,
    RESOURCE_VGPU,
    RESOURCE_VRAM,
    Annotation,
    MigrationMode,
    SystemAnnotation,
)

from .builders import FakeCluster, apply_patch, body, decode_patch, review_of, seed_review

PROFILE = {"spec": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}


class WriteFails(FakeCluster):
    def upsert_workload(self, upsert: WorkloadUpsert) -> None:
        raise ClusterUnavailable("write tensorfusionworkloads default/pytorch-example: HTTP 403 Forbidden")


class Explodes(FakeCluster):
    def gpu_pools(self, *, fresh: bool = False) -> list[dict[str, object]]:
        raise RuntimeError("bug")


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster(profiles={("default", "default-profile"): PROFILE})


def client_for(cluster: FakeCluster) -> Iterator[TestClient]:
    with TestClient(create_app(WebhookSettings(), cluster)) as client:
        yield client


@pytest.fixture
def client(cluster: FakeCluster) -> Iterator[TestClient]:
    yield from client_for(cluster)


def test_seed_pod_is_patched_and_its_workload_written(client: TestClient, cluster: FakeCluster) -> None:
    doc = seed_review()
    reply = client.post(MUTATE_PATH, content=body(doc), headers={"content-type": "application/json"})
    assert reply.status_code == 200
    response = reply.json()["response"]
    assert response["uid"] == doc["request"]["uid"] and response["allowed"] is True
    pod = apply_patch(doc["request"]["object"], decode_patch(response))
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {
        RESOURCE_VGPU: "1",
        RESOURCE_MILLI_TFLOPS: "10000",
        RESOURCE_VRAM: str(4 * 1024**3),
    }
    spec = cluster.workloads[("default", "pytorch-example")]["spec"]
    assert spec["nodeAffinity"] == PROFILE["spec"]["nodeAffinity"] and spec["replicas"] == 1


def test_second_pod_merges_into_the_workload_instead_of_overwriting_it(
    client: TestClient, cluster: FakeCluster
) -> None:
    auto = {"autoSetReplicas": {"enable": True, "scaleUpStep": "2"}}
    cluster.workloads[("default", "pytorch-example")] = {"spec": {"autoScalingConfig": auto, "gpuModel": "H100"}}
    client.post(MUTATE_PATH, content=body(seed_review()))
    spec = cluster.workloads[("default", "pytorch-example")]["spec"]
    assert spec["autoScalingConfig"] == auto  # set by an operator, not by any pod: kept
    assert spec["gpuModel"] == "H100" and spec["qos"] == "medium"


def test_dry_run_writes_no_workload(client: TestClient, cluster: FakeCluster) -> None:
    doc = seed_review()
    doc["request"]["dryRun"] = True
    assert client.post(MUTATE_PATH, content=body(doc)).json()["response"]["allowed"] is True
    assert cluster.writes == []


def test_failed_workload_write_denies_the_pod_with_the_reason() -> None:
    for client in client_for(WriteFails(profiles={("default", "default-profile"): PROFILE})):
        response = client.post(MUTATE_PATH, content=body(seed_review())).json()["response"]
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 503 and "HTTP 403 Forbidden" in response["status"]["message"]
    assert response["status"]["reason"] == "ServiceUnavailable"


def test_a_bug_still_answers_with_a_well_formed_denial() -> None:
    for client in client_for(Explodes()):
        reply = client.post(MUTATE_PATH, content=body(review_of({Annotation.TFLOPS_REQUEST.value: "1"})))
    assert reply.status_code == 200
    assert reply.json()["response"]["status"] == {
        "metadata": {},
        "status": "Failure",
        "code": 500,
        "reason": "InternalError",
        "message": "internal error in the tensor-fusion webhook; see its log",
    }


@pytest.mark.parametrize(
    ("raw", "uid"),
    [
        (b"", ""),
        (b"{not json", ""),
        (b"[]", ""),
        (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(), ""),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u"}}), "u"),
    ],
)
def test_malformed_bodies_get_a_denial_not_an_error(client: TestClient, raw: bytes, uid: str) -> None:
    reply = client.post(MUTATE_PATH, content=raw)
    assert reply.status_code == 200
    doc = reply.json()
    assert (doc["apiVersion"], doc["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert doc["response"]["uid"] == uid and doc["response"]["allowed"] is False
    assert doc["response"]["status"]["message"].startswith("malformed AdmissionReview")


def test_metrics_count_results(client: TestClient) -> None:
    client.post(MUTATE_PATH, content=body(seed_review()))
    client.post(MUTATE_PATH, content=b"x")
    text = client.get("/metrics").text
    assert 'tf_webhook_admissions_total{result="patched"} 1.0' in text
    assert 'tf_webhook_admissions_total{result="malformed"} 1.0' in text
    assert 'tf_build_info{component="webhook",version="' in text and "process_cpu_seconds_total" in text
    assert client.get("/healthz").json() == {"status": "ok"}


def test_each_migration_entry_translates_nvidia_gpus_as_its_namespace_label_says() -> None:
    doc = review_of({}, labels={"app": "train"})
    doc["request"]["object"]["spec"]["containers"][0]["resources"] = {"limits": {NVIDIA_GPU: "1"}}
    settings = WebhookSettings(migration_replica_tflops="78", migration_replica_vram="10Gi")
    with TestClient(create_app(settings, FakeCluster())) as client:
        replies = {path: client.post(path, content=body(doc)).json()["response"] for path in MIGRATE_PATHS.values()}
        untouched = client.post(MUTATE_PATH, content=body(doc)).json()["response"]
    assert untouched == {"uid": untouched["uid"], "allowed": True}  # the pods entry never translates
    requests = {}
    for mode, path in MIGRATE_PATHS.items():
        assert replies[path]["warnings"][0].startswith(f'namespace label tensor-fusion.ai/migrate-nvidia-gpu: "{mode}"')
        pod = apply_patch(doc["request"]["object"], decode_patch(replies[path]))
        assert NVIDIA_GPU not in pod["spec"]["containers"][0]["resources"]["limits"]
        requests[mode] = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    whole, sliced = requests[MigrationMode.WHOLE], requests[MigrationMode.TIME_SLICED]
    assert (whole.dedicated_gpu, whole.gpu_count) == (True, 1)
    assert (sliced.dedicated_gpu, sliced.tflops_request, sliced.vram_request) == (False, 78_000, 10 * 1024**3)


def test_a_replica_share_that_is_no_quantity_stops_the_webhook_naming_it() -> None:
    with pytest.raises(
        ValidationError,
        match=r"migration_replica_vram\n  Value error, not a Kubernetes quantity such as 10, 2.5, 500m, 4Gi",
    ):
        WebhookSettings(migration_replica_vram="lots")
