"""The custom metrics API's documents field for field as k8s.io/metrics types them and the adapters write them;
a query for an unknown metric, version, resource or scope is a 404 Status, a named object without a sample
a 404, a wildcard over objects without samples an empty list, stale samples are never served."""

from __future__ import annotations

import pytest

from tests.vgpu.usage_builders import T0, node_usage, samples_of, used
from tf_metrics.api import ALL, Query, answer, api_group, check, resource_list

SNAPSHOT = samples_of(
    node_usage("n1", used("trainer", tflops=10_000, limit=40_000), used("infer", namespace="team-b", tflops=5_000)),
    node_usage("n2", used("stale", tflops=1_000), at=T0 - 60),
)


def pods(metric: str, *, namespace: str = "team-a", name: str = ALL, version: str = "v1beta1") -> Query:
    return Query(version=version, resource="pods", namespace=namespace, name=name, metric=metric)


def test_discovery_lists_each_metric_per_resource_as_the_adapters_do() -> None:
    group = api_group()
    assert group["kind"] == "APIGroup" and group["name"] == "custom.metrics.k8s.io"
    assert [v["version"] for v in group["versions"]] == ["v1beta2", "v1beta1"]
    assert group["preferredVersion"] == {"groupVersion": "custom.metrics.k8s.io/v1beta2", "version": "v1beta2"}
    listed = resource_list("v1beta1")
    assert listed.code == 200
    assert listed.body["groupVersion"] == "custom.metrics.k8s.io/v1beta1" and listed.body["kind"] == "APIResourceList"
    resources = {r["name"]: r for r in listed.body["resources"]}
    assert set(resources) == {
        "pods/gpu_utilization", "pods/gpu_tflops", "pods/gpu_vram_bytes", "nodes/gpu_tflops", "nodes/gpu_vram_bytes",
    }  # fmt: skip
    assert resources["pods/gpu_utilization"] == {
        "name": "pods/gpu_utilization", "singularName": "", "namespaced": True, "kind": "MetricValueList",
        "verbs": ["get"],
    }  # fmt: skip
    assert resources["nodes/gpu_tflops"]["namespaced"] is False
    assert resource_list("v2").code == 404


def test_a_v1beta1_list_is_a_metric_value_list_of_the_pods_in_the_namespace() -> None:
    got = answer(pods("gpu_utilization"), SNAPSHOT, T0 + 1)
    assert got.code == 200
    assert got.body == {
        "kind": "MetricValueList",
        "apiVersion": "custom.metrics.k8s.io/v1beta1",
        "metadata": {},
        "items": [
            {
                "describedObject": {"kind": "Pod", "namespace": "team-a", "name": "trainer", "apiVersion": "v1"},
                "metricName": "gpu_utilization",
                "timestamp": "2025-03-01T12:00:00Z",
                "window": 5,
                "value": "25",
                "selector": None,
            }
        ],
    }


def test_a_v1beta2_item_names_its_metric_and_window_seconds() -> None:
    (item,) = answer(pods("gpu_tflops", version="v1beta2"), SNAPSHOT, T0 + 1).body["items"]
    assert item == {
        "describedObject": {"kind": "Pod", "namespace": "team-a", "name": "trainer", "apiVersion": "v1"},
        "metric": {"name": "gpu_tflops", "selector": None},
        "timestamp": "2025-03-01T12:00:00Z",
        "windowSeconds": 5,
        "value": "10",
    }


def test_every_namespace_and_a_uid_filter() -> None:
    every = answer(pods("gpu_tflops", namespace=ALL), SNAPSHOT, T0 + 1).body["items"]
    assert [(i["describedObject"]["namespace"], i["describedObject"]["name"]) for i in every] == [
        ("team-a", "trainer"), ("team-b", "infer"),
    ]  # fmt: skip
    chosen = answer(pods("gpu_tflops", namespace=ALL), SNAPSHOT, T0 + 1, uids={"uid-team-b-infer"}).body["items"]
    assert [i["describedObject"]["name"] for i in chosen] == ["infer"]
    assert answer(pods("gpu_tflops"), SNAPSHOT, T0 + 1, uids=set()).body["items"] == []


def test_a_named_pod_is_a_list_of_one_or_a_404() -> None:
    one = answer(pods("gpu_vram_bytes", name="trainer"), SNAPSHOT, T0 + 1)
    assert one.code == 200 and [i["value"] for i in one.body["items"]] == ["2Gi"]
    missing = answer(pods("gpu_vram_bytes", name="nobody"), SNAPSHOT, T0 + 1)
    assert missing.code == 404
    assert missing.body == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "the server could not find the metric gpu_vram_bytes for pods nobody", "reason": "NotFound",
        "code": 404,
    }  # fmt: skip


def test_stale_samples_are_never_served() -> None:
    assert answer(pods("gpu_tflops", name="stale"), SNAPSHOT, T0 + 1).code == 404
    assert answer(pods("gpu_tflops"), SNAPSHOT, T0 + 11).body["items"] == []  # n1's are two intervals old now


def test_nodes_are_cluster_scoped_with_their_use() -> None:
    query = Query(version="v1beta1", resource="nodes", namespace=None, name=ALL, metric="gpu_tflops")
    assert check(query, "") is None
    items = answer(query, SNAPSHOT, T0 + 1).body["items"]
    assert [(i["describedObject"], i["value"]) for i in items] == [
        ({"kind": "Node", "name": "n1", "apiVersion": "v1"}, "15")
    ]


@pytest.mark.parametrize(
    ("query", "code", "message"),
    [
        (pods("gpu_temperature"), 404, "the server could not find the metric gpu_temperature for pods"),
        (pods("gpu_tflops", version="v1"), 404, "the server could not find the requested resource"),
        (Query(version="v1beta1", resource="deployments", namespace="a", name=ALL, metric="gpu_tflops"), 404,
         "the server could not find the metric gpu_tflops for deployments"),
        (Query(version="v1beta1", resource="pods", namespace=None, name=ALL, metric="gpu_tflops"), 404,
         "the server could not find the metric gpu_tflops for pods"),
        (Query(version="v1beta1", resource="nodes", namespace=None, name=ALL, metric="gpu_utilization"), 404,
         "the server could not find the metric gpu_utilization for nodes"),
        (Query(version="v1beta1", resource="nodes", namespace="a", name=ALL, metric="gpu_tflops"), 404,
         "the server could not find the metric gpu_tflops for nodes"),
    ],
)  # fmt: skip
def test_what_is_not_served_is_a_404_status(query: Query, code: int, message: str) -> None:
    refused = check(query, "")
    assert refused is not None and refused.code == code
    assert refused.body["kind"] == "Status" and refused.body["message"] == message


def test_a_metric_label_selector_is_refused_with_the_reason() -> None:
    refused = check(pods("gpu_tflops"), "gpu=0")
    assert refused is not None and refused.code == 400
    assert "carry no labels" in refused.body["message"] and refused.body["reason"] == "BadRequest"
