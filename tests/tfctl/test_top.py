"""``tfctl top``: per pod its grant and its use, per node its capacity, grants and use, from the API server's
objects and the custom metrics API; when that API cannot be read, a message that says how to fix it and
exit 2."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tf_metrics.api import value_list
from tf_shell.kube.api import GatewayError, RawObject
from tfctl import top
from tfctl.main import main
from vgpu.contract import allocation, inventory
from vgpu.names import GpuMetric, Qos, SystemAnnotation
from vgpu.usage_samples import Sampled

GI = 1024**3
WHEN = Sampled(at=0.0, timestamp="2025-03-01T12:00:00Z", window_s=5.0)


def grant(uuid: str, tflops: tuple[int, int], vram: tuple[int, int]) -> allocation.GpuGrant:
    return allocation.GpuGrant(uuid=uuid, index=0, tflops_request=tflops[0], tflops_limit=tflops[1],
                               vram_request=vram[0], vram_limit=vram[1], gpu_tflops=312_000)  # fmt: skip


def pod(
    name: str, node: str, *grants: allocation.GpuGrant, namespace: str = "team-a", phase: str = "Running"
) -> RawObject:
    granted = allocation.PodAllocation(pod_uid=f"uid-{name}", node=node, pool="default-pool", qos=Qos.MEDIUM,
                                       containers=("main",), gpus=grants, bound_at="2025-03-01T11:00:00Z")  # fmt: skip
    annotations = {SystemAnnotation.ALLOCATION.value: allocation.encode(granted)} if grants else {}
    return {"metadata": {"name": name, "namespace": namespace, "annotations": annotations}, "status": {"phase": phase}}


def node(name: str, gpus: int, *, mig_parent: bool = False) -> RawObject:
    listed = [inventory.GpuInfo(uuid=f"GPU-{name}-{i}", index=i, model="NVIDIA A100-SXM4-80GB", tflops=312_000,
                                vram=80 * GI) for i in range(gpus)]  # fmt: skip
    if mig_parent:
        listed.append(inventory.GpuInfo(uuid="GPU-mig", index=9, model="A100", tflops=312_000, vram=80 * GI, mig=True))
    published = inventory.NodeInventory(node=name, pool="default-pool", gpus=tuple(listed), slices_per_gpu=16,
                                        backend=inventory.EnforcementBackend.NONE, heartbeat="2025-03-01T12:00:00Z")  # fmt: skip
    return {
        "metadata": {"name": name, "annotations": {SystemAnnotation.NODE_INVENTORY.value: inventory.encode(published)}}
    }


def metric_body(metric: GpuMetric, values: dict[tuple[str, str], str]) -> bytes:
    items = [
        ({"kind": "Pod", "namespace": ns, "name": name, "apiVersion": "v1"} if ns else
         {"kind": "Node", "name": name, "apiVersion": "v1"}, value, WHEN)
        for (ns, name), value in values.items()
    ]  # fmt: skip
    return json.dumps(value_list("v1beta2", metric, items)).encode()


class FakeCluster:
    """The API server as ``tfctl top`` reads it; ``answers`` by path: (status, body)."""

    def __init__(self) -> None:
        self.pod_list = [
            pod("trainer", "gpu-1", grant("GPU-gpu-1-0", (20_000, 40_000), (8 * GI, 16 * GI))),
            pod("infer", "gpu-1", grant("GPU-gpu-1-1", (10_000, 10_000), (4 * GI, 4 * GI)),
                grant("GPU-gpu-1-0", (10_000, 10_000), (4 * GI, 4 * GI))),
            pod("done", "gpu-1", grant("GPU-gpu-1-1", (50_000, 50_000), (GI, GI)), phase="Succeeded"),
            pod("pending", "", namespace="team-a"),
        ]  # fmt: skip
        self.node_list = [node("gpu-1", 2, mig_parent=True), node("gpu-2", 1), {"metadata": {"name": "cpu-1"}}]
        pods = top.API + "/namespaces/team-a/pods/*/"
        self.answers: dict[str, tuple[int, bytes]] = {
            pods + "gpu_tflops": (200, metric_body(GpuMetric.TFLOPS, {("team-a", "trainer"): "12500m"})),
            pods + "gpu_vram_bytes": (200, metric_body(GpuMetric.VRAM_BYTES, {("team-a", "trainer"): "6Gi"})),
            pods + "gpu_utilization": (200, metric_body(GpuMetric.UTILIZATION, {("team-a", "trainer"): "31250m"})),
            top.API + "/nodes/*/gpu_tflops": (200, metric_body(GpuMetric.TFLOPS, {("", "gpu-1"): "15500m"})),
            top.API + "/nodes/*/gpu_vram_bytes": (200, metric_body(GpuMetric.VRAM_BYTES, {("", "gpu-1"): "7Gi"})),
        }
        self.asked: list[tuple[str, list[tuple[str, str]]]] = []
        self.selectors: list[tuple[str | None, str]] = []

    def pods(self, namespace: str | None, label_selector: str) -> list[RawObject]:
        self.selectors.append((namespace, label_selector))
        return self.pod_list

    def nodes(self) -> list[RawObject]:
        return self.node_list

    def get(self, path: str, query: Any = ()) -> tuple[int, bytes]:
        self.asked.append((path, list(query)))
        return self.answers.get(path, (200, metric_body(GpuMetric.TFLOPS, {})))


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster()
    monkeypatch.setattr(top.MetricsCluster, "connect", classmethod(lambda cls, kubeconfig: fake))
    return fake


def test_top_pods_shows_each_grant_beside_its_use(cluster: FakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "pods", "-n", "team-a"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "NAMESPACE  POD      NODE   TFLOPS REQ/LIMIT  TFLOPS USED  VRAM REQ/LIMIT  VRAM USED  GPU%",
        "team-a     infer    gpu-1  20/20             -            8Gi/8Gi         -          -",
        "team-a     trainer  gpu-1  20/40             12.5         8Gi/16Gi        6Gi        31%",
    ]
    assert cluster.selectors == [("team-a", "tensor-fusion.ai/enabled=true")]


def test_a_label_selector_narrows_the_pods_and_the_metrics(cluster: FakeCluster) -> None:
    assert main(["top", "pods", "-A", "-l", "app=trainer"]) == 0
    assert cluster.selectors == [(None, "tensor-fusion.ai/enabled=true,app=trainer")]
    assert {path for path, _ in cluster.asked} == {f"{top.API}/namespaces/*/pods/*/{m}" for m in GpuMetric}
    assert all(query == [("labelSelector", "app=trainer")] for _, query in cluster.asked)


def test_top_nodes_shows_capacity_reservations_and_use(
    cluster: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["top", "nodes"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "NODE   GPUS  TFLOPS RESERVED/CAPACITY  TFLOPS USED  VRAM RESERVED/CAPACITY  VRAM USED",
        "gpu-1  2     40/624                    15.5         16Gi/160Gi              7Gi",
        "gpu-2  1     0/312                     -            0B/80Gi                 -",
    ]


def test_nothing_to_show_is_said_in_words() -> None:
    assert top.pods_table([], {}) == "no GPU pod holds a grant here"
    assert "no node publishes a GPU inventory" in top.nodes_table({}, [], {})


@pytest.mark.parametrize(
    ("status", "message", "said"),
    [
        (404, "the server could not find the requested resource",
         "is not served in this cluster (the server could not find the requested resource): install tf-metrics"),
        (503, "the server is currently unable to handle the request",
         "registered but does not answer (the server is currently unable to handle the request): check "
         "`kubectl get apiservice v1beta2.custom.metrics.k8s.io`"),
        (403, 'pods.custom.metrics.k8s.io "*" is forbidden', "not allowed to read the custom metrics API"),
        (500, "boom", "answered HTTP 500: boom"),
    ],
)  # fmt: skip
def test_an_unreadable_metrics_api_is_explained_with_exit_2(
    cluster: FakeCluster, capsys: pytest.CaptureFixture[str], status: int, message: str, said: str
) -> None:
    body = json.dumps({"kind": "Status", "code": status, "message": message}).encode()
    cluster.answers[f"{top.API}/namespaces/team-a/pods/*/gpu_tflops"] = (status, body)
    assert main(["top", "pods", "-n", "team-a"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfctl top: ") and said in err


def test_an_answer_that_is_no_metric_value_list_is_an_error(
    cluster: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.answers[f"{top.API}/nodes/*/gpu_tflops"] = (200, b"<html>proxy login</html>")
    assert main(["top", "nodes"]) == 2
    assert "answered no MetricValueList" in capsys.readouterr().err


def test_an_api_server_that_cannot_be_reached_is_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(cls: object, kubeconfig: str | None) -> object:
        raise GatewayError("no usable kubeconfig: Invalid kube-config file. No configuration found.")

    monkeypatch.setattr(top.MetricsCluster, "connect", classmethod(refuse))
    assert main(["top", "nodes", "--kubeconfig", "/nowhere"]) == 2
    assert "tfctl top: no usable kubeconfig" in capsys.readouterr().err
