"""Fuzzing the endpoint: whatever arrives, the answer is HTTP 200 with a well-formed AdmissionReview,
and the decision itself never falls into the shell's last-resort handler."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hostile_json import HOSTILE_TEXT, escaped, poisoned, raw, string_slots
from tf_webhook.app import MIGRATE_PATHS, MUTATE_PATH, create_app
from tf_webhook.settings import WebhookSettings
from vgpu.names import LABEL_ENABLED, NVIDIA_GPU, NVIDIA_GPU_SHARED, NVIDIA_MIG_PREFIX, Annotation, SystemAnnotation

from .builders import FakeCluster, review_of

KEYS = st.sampled_from([a.value for a in Annotation] + [s.value for s in SystemAnnotation]) | st.text(max_size=80)
VALUES = st.text(max_size=40) | st.sampled_from(["10", "4Gi", "true", "false", "medium", "python", "1e999", "-1"])
HUGE = st.integers(min_value=10_000, max_value=300_000).map(lambda n: "9" * n)
JSON = st.recursive(
    # JSON has no Infinity (Python writes it; the API server never does, and strict decoding refuses it)
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    cluster = FakeCluster(profiles={("default", "p"): {"spec": {"gpuCount": 1}}})
    with TestClient(create_app(WebhookSettings(), cluster)) as client:
        yield client


def check(client: TestClient, raw: bytes, path: str = MUTATE_PATH) -> dict[str, Any]:
    reply = client.post(path, content=raw)
    assert reply.status_code == 200
    doc = reply.json()
    assert (doc["apiVersion"], doc["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response = doc["response"]
    assert isinstance(response["uid"], str) and isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["message"] and "internal error" not in response["status"]["message"]
        assert len(response["status"]["message"]) <= 4000
    result: dict[str, Any] = response
    return result


@FUZZ
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes(client: TestClient, raw: bytes) -> None:
    check(client, raw)


@FUZZ
@given(request=JSON)
def test_arbitrary_json_in_request(client: TestClient, request: Any) -> None:
    check(
        client,
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode(),
    )


@FUZZ
@given(annotations=st.dictionaries(KEYS, VALUES | HUGE, max_size=8), label=st.sampled_from(["true", "false", "x"]))
def test_arbitrary_annotations(client: TestClient, annotations: dict[str, str], label: str) -> None:
    doc = review_of(annotations, labels={LABEL_ENABLED: label})
    response = check(client, json.dumps(doc, ensure_ascii=False).encode())
    assert response["uid"] == doc["request"]["uid"]


@FUZZ
@given(path=st.sampled_from(["metadata", "spec", "containers", "object", "labels"]), junk=JSON)
def test_missing_or_mistyped_pod_parts(client: TestClient, path: str, junk: Any) -> None:
    doc = review_of({Annotation.TFLOPS_REQUEST.value: "1"})
    obj = doc["request"]["object"]
    target = {
        "metadata": (obj, "metadata"),
        "spec": (obj, "spec"),
        "containers": (obj["spec"], "containers"),
        "object": (doc["request"], "object"),
        "labels": (obj["metadata"], "labels"),
    }[path]
    target[0][target[1]] = junk
    response = check(client, json.dumps(doc).encode())
    assert response["uid"] == doc["request"]["uid"]


@FUZZ
@given(data=st.data(), extra=HOSTILE_TEXT, as_escape=st.booleans())
def test_a_lone_surrogate_anywhere_is_a_clean_denial(
    client: TestClient, data: st.DataObject, extra: str, as_escape: bool
) -> None:
    """In any string of the review, keys included: once the uid with one was echoed into a reply no
    encoder could write (HTTP 500, which the API server turns into the failurePolicy)."""
    doc = review_of({Annotation.TFLOPS_REQUEST.value: "1"})
    bad = poisoned(doc, data.draw(st.integers(0, string_slots(doc) - 1)), extra)
    response = check(client, escaped(bad) if as_escape else raw(bad))
    assert response["allowed"] is False
    problem = "lone UTF-16 surrogate" if as_escape else "not valid UTF-8"
    assert problem in response["status"]["message"] and response["status"]["code"] == 400


RESOURCE_KEYS = st.sampled_from([NVIDIA_GPU, NVIDIA_GPU_SHARED, f"{NVIDIA_MIG_PREFIX}1g.5gb", NVIDIA_MIG_PREFIX, "cpu"])
SIDES = st.dictionaries(RESOURCE_KEYS | st.text(max_size=12), VALUES | JSON, max_size=4) | JSON
RESOURCES = st.dictionaries(st.sampled_from(["limits", "requests", "claims"]), SIDES, max_size=3) | JSON


@FUZZ
@given(
    path=st.sampled_from([MUTATE_PATH, *MIGRATE_PATHS.values()]),
    labels=st.sampled_from([{}, {LABEL_ENABLED: "true"}, {LABEL_ENABLED: "false"}]),
    containers=st.lists(RESOURCES, min_size=1, max_size=3),
    init=st.lists(RESOURCES, max_size=2),
)
def test_arbitrary_container_resources_on_every_path(
    client: TestClient, path: str, labels: dict[str, str], containers: list[Any], init: list[Any]
) -> None:
    """NVIDIA's resources in any shape, in app and init containers: translated, refused with the reason,
    or left alone; never the shell's last resort."""
    doc = review_of({}, labels=labels, containers=tuple(f"c{i}" for i in range(len(containers))))
    spec = doc["request"]["object"]["spec"]
    for container, resources in zip(spec["containers"], containers, strict=True):
        container["resources"] = resources
    spec["initContainers"] = [{"name": f"i{i}", "image": "x", "resources": r} for i, r in enumerate(init)]
    response = check(client, json.dumps(doc).encode(), path)
    assert response["uid"] == doc["request"]["uid"]


def test_deeply_nested_json(client: TestClient) -> None:
    check(client, b"[" * 100_000 + b"]" * 100_000)
