"""tf-metrics' HTTP shell in-process: who may ask what, what a read answers, and that bad input is a 4xx
Status, never a 5xx. The front proxy's certificate is stood in for by the scope extension the real
protocol sets (test_tls.py runs that over TLS)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.tf_metrics.test_auth import PROXY
from tests.vgpu.usage_builders import T0, node_usage, samples_of, used
from tf_metrics.app import create_app
from tf_metrics.peer import EXTENSION
from tf_shell.kube.api import GatewayError, RawObject
from tf_shell.usage_feed import Target, UsageFeed
from vgpu.usage_samples import node_samples

API = "/apis/custom.metrics.k8s.io"
ALICE = {"X-Remote-User": "alice", "X-Remote-Group": "devs"}
SNAPSHOT = samples_of(node_usage("n1", used("trainer", tflops=10_000), used("infer", tflops=30_000)))


class FakeCluster:
    """SubjectAccessReviews allowed while ``allow``; pods chosen by label selector from ``labelled``."""

    def __init__(self) -> None:
        self.allow = True
        self.down = False
        self.reviews: list[RawObject] = []
        self.listed: list[tuple[str | None, str]] = []
        self.labelled = {"app=trainer": ["uid-team-a-trainer"]}

    def review(self, body: RawObject) -> RawObject:
        self.reviews.append(body)
        if self.down:
            raise GatewayError("create subjectaccessreview: the API server did not answer within 5.0s (stalled?)")
        return {**body, "status": {"allowed": self.allow, "reason": "" if self.allow else "no RBAC rule"}}

    def pods(self, namespace: str | None, label_selector: str) -> list[RawObject]:
        self.listed.append((namespace, label_selector))
        if label_selector not in self.labelled:
            raise GatewayError(f"list pods: HTTP 400 Bad Request: unable to parse requirement: {label_selector}", 400)
        return [{"metadata": {"uid": uid}} for uid in self.labelled[label_selector]]


def through_front_proxy(app: ASGIApp, common_name: str | None) -> ASGIApp:
    """``app`` as the peer protocol serves it to a client whose verified certificate has ``common_name``."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope = {**scope, "extensions": {**scope.get("extensions", {}), EXTENSION: {"common_name": common_name}}}
        await app(scope, receive, send)

    return wrapped


class Harness:
    def __init__(self) -> None:
        self.cluster = FakeCluster()
        self.now = T0 + 1
        self.ready = False
        self.registry = CollectorRegistry()
        self.app = create_app(
            proxy=PROXY,
            samples=lambda: SNAPSHOT,
            cluster=self.cluster,
            ready=lambda: self.ready,
            registry=self.registry,
            ttl=10.0,
            clock=lambda: self.now,
        )

    def client(self, common_name: str | None = "front-proxy-client") -> TestClient:
        return TestClient(through_front_proxy(self.app, common_name))


@pytest.fixture
def harness() -> Iterator[Harness]:
    yield Harness()


def get(client: TestClient, path: str, headers: dict[str, str] | None = None, **params: str) -> tuple[int, Any]:
    reply = client.get(path, headers=ALICE if headers is None else headers, params=params)
    assert reply.headers["content-type"] == "application/json"
    return reply.status_code, reply.json()


def test_an_allowed_user_reads_the_pods_metric_through_the_front_proxy(harness: Harness) -> None:
    code, body = get(harness.client(), f"{API}/v1beta1/namespaces/team-a/pods/*/gpu_utilization")
    assert code == 200 and body["kind"] == "MetricValueList"
    assert {i["describedObject"]["name"]: i["value"] for i in body["items"]} == {"trainer": "25", "infer": "75"}
    (review,) = harness.cluster.reviews
    assert review["spec"]["user"] == "alice" and review["spec"]["groups"] == ["devs"]
    assert review["spec"]["resourceAttributes"]["subresource"] == "gpu_utilization"


def test_discovery_needs_the_front_proxy_but_no_review(harness: Harness) -> None:
    client = harness.client()
    code, group = get(client, API)
    assert code == 200 and group["preferredVersion"]["version"] == "v1beta2"
    code, listed = get(client, f"{API}/v1beta2")
    assert code == 200 and "pods/gpu_utilization" in {r["name"] for r in listed["resources"]}
    assert harness.cluster.reviews == []


@pytest.mark.parametrize(("common_name", "headers"), [(None, ALICE), ("intruder", ALICE), ("front-proxy-client", {})])
def test_anyone_but_the_front_proxy_naming_a_user_is_unauthenticated(
    harness: Harness, common_name: str | None, headers: dict[str, str]
) -> None:
    for path in (API, f"{API}/v1beta1", f"{API}/v1beta1/namespaces/team-a/pods/*/gpu_tflops"):
        code, body = get(harness.client(common_name), path, headers)
        assert (code, body["kind"], body["reason"]) == (401, "Status", "Unauthorized")
    assert harness.cluster.reviews == []


def test_a_user_the_api_server_would_refuse_is_refused_and_the_verdict_is_kept_for_the_ttl(harness: Harness) -> None:
    harness.cluster.allow = False
    path = f"{API}/v1beta1/namespaces/team-a/pods/*/gpu_tflops"
    code, body = get(harness.client(), path)
    assert code == 403 and body["reason"] == "Forbidden"
    assert body["message"] == (
        'pods.custom.metrics.k8s.io "*" is forbidden: User "alice" cannot get resource "pods/gpu_tflops" in API '
        'group "custom.metrics.k8s.io" in the namespace "team-a": no RBAC rule'
    )
    harness.cluster.allow = True
    assert get(harness.client(), path)[0] == 403  # the denial is kept ...
    harness.now += 10.5
    assert get(harness.client(), path)[0] == 200  # ... for the TTL, then asked again
    assert len(harness.cluster.reviews) == 2


def test_an_api_server_that_cannot_authorise_is_a_503_that_says_so(harness: Harness) -> None:
    harness.cluster.down = True
    code, body = get(harness.client(), f"{API}/v1beta1/namespaces/team-a/pods/*/gpu_tflops")
    assert code == 503 and "cannot authorise the request" in body["message"]


def test_a_label_selector_chooses_pods_by_uid(harness: Harness) -> None:
    path = f"{API}/v1beta2/namespaces/team-a/pods/*/gpu_tflops"
    code, body = get(harness.client(), path, labelSelector="app=trainer")
    assert code == 200 and [i["describedObject"]["name"] for i in body["items"]] == ["trainer"]
    assert harness.cluster.listed == [("team-a", "app=trainer")]
    get(harness.client(), f"{API}/v1beta2/namespaces/*/pods/*/gpu_tflops", labelSelector="app=trainer")
    assert harness.cluster.listed[-1] == (None, "app=trainer")  # every namespace


@pytest.mark.parametrize(
    ("path", "params", "code", "message"),
    [
        ("/v1beta1/namespaces/team-a/pods/*/gpu_tflops", {"labelSelector": "app in (x"}, 400, "unable to parse"),
        ("/v1beta1/nodes/*/gpu_tflops", {"labelSelector": "gpu=yes"}, 400, "only pod metrics are selected by label"),
        ("/v1beta1/namespaces/team-a/pods/*/gpu_tflops", {"metricLabelSelector": "x=y"}, 400, "carry no labels"),
        ("/v1beta1/namespaces/team-a/pods/*/gpu_nonsense", {}, 404, "could not find the metric gpu_nonsense for pods"),
        ("/v1beta1/namespaces/team-a/pods/nobody/gpu_tflops", {}, 404, "for pods nobody"),
        ("/v1/namespaces/team-a/pods/*/gpu_tflops", {}, 404, "could not find the requested resource"),
        ("/v1beta1/namespaces/team-a/metrics/x", {}, 404, "could not find the requested resource"),
        ("/v1beta1/namespaces/%ED%A0%80/pods/%FF/gpu_tflops", {}, 404, "for pods"),
    ],
)
def test_bad_input_is_a_4xx_status_that_says_what_is_wrong(
    harness: Harness, path: str, params: dict[str, str], code: int, message: str
) -> None:
    got, body = get(harness.client(), API + path, **params)
    assert got == code and body["kind"] == "Status" and message in body["message"], body


def test_wildcards_over_pods_without_samples_are_empty_lists(harness: Harness) -> None:
    code, body = get(harness.client(), f"{API}/v1beta1/namespaces/empty/pods/*/gpu_utilization")
    assert (code, body["items"]) == (200, [])


def test_other_methods_and_paths_are_status_documents(harness: Harness) -> None:
    client = harness.client()
    reply = client.post(f"{API}/v1beta1/namespaces/team-a/pods/*/gpu_tflops", headers=ALICE)
    assert reply.status_code == 405 and reply.json()["kind"] == "Status"
    reply = client.get("/apis", headers=ALICE)
    assert reply.status_code == 404 and reply.json()["kind"] == "Status"


def test_health_needs_no_certificate_and_readiness_waits_for_the_first_pass(harness: Harness) -> None:
    client = harness.client(None)
    assert client.get("/healthz").status_code == 200 and client.get("/livez").text == "ok"
    assert client.get("/readyz").status_code == 503
    harness.ready = True
    assert client.get("/readyz").status_code == 200
    get(harness.client(), f"{API}/v1beta1/namespaces/team-a/pods/*/gpu_tflops")
    assert 'tf_metrics_requests_total{code="200"} 1.0' in client.get("/metrics").text


def test_every_metric_tf_metrics_exports_is_in_the_docs(harness: Harness) -> None:
    collector = UsageFeed(
        lambda: [Target("n1", "http://n1/usage")], lambda url: b"{}", 1, harness.registry, node_samples
    )
    collector.poll()
    get(harness.client(), f"{API}/v1beta1/namespaces/team-a/pods/*/gpu_tflops")
    exported = {
        sample.name for family in harness.registry.collect() for sample in family.samples
        if not sample.name.endswith("_created")
    }  # fmt: skip
    assert exported == {"tf_metrics_plugin_fetches_total", "tf_metrics_plugins", "tf_metrics_requests_total"}
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    assert [name for name in sorted(exported) if f"`{name}`" not in docs] == []
