"""The custom metrics API (issue 15) through the real API server's aggregation layer: a GPU pod on the
kubelet node has its container's use scripted in the fake GPU file (5 % of its A100's SMs: 15.6 TFLOPS,
78 % of its 20-TFLOPS limit, and 512 MiB); the device plugin samples it, tf-metrics — registered with
the shipped APIServices, finding the plugin through its Service's EndpointSlice — serves it, and within
two sample periods the seed's query (``kubectl get --raw /apis/custom.metrics.k8s.io/v1beta1/namespaces/
*/pods/*/gpu_utilization``) answers 78 for the pod, as does ``tfctl top``. Then what a user without RBAC,
an unknown metric, a label selector, v1beta2 and a caller past the API server each get.

Every read here is an HTTPS request to the API server as a user (``kubectl get --raw``), or to tf-metrics
itself with the front proxy's client certificate, as the aggregator sends it.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import AuthorizationV1Api

from vgpu.names import Annotation

from .cluster import METRICS_API_INTERVAL, PLUGIN_USAGE_INTERVAL, REAL_NODE, TENANT, VENV_BIN, Cluster
from .fake_nodes import fake_nvml_yaml
from .kube import eventually, wait_running
from .pods import allocation_of, gpu_pod

NAMESPACE = "e2e-custom-metrics"
OTHER = "e2e-custom-metrics-other"  # the tenant may read nothing here
SHARE = {
    Annotation.TFLOPS_REQUEST: "10",
    Annotation.TFLOPS_LIMIT: "20",
    Annotation.VRAM_REQUEST: "1Gi",
    Annotation.VRAM_LIMIT: "2Gi",
}
SM_PERCENT, VRAM_MIB = 5, 512
API = "/apis/custom.metrics.k8s.io"
SEED_QUERY = f"{API}/v1beta1/namespaces/*/pods/*/gpu_utilization"
# Two sample periods (the plugin's, then tf-metrics' pass), and a second for a loaded 2-core machine.
WITHIN_S = 2 * max(PLUGIN_USAGE_INTERVAL, METRICS_API_INTERVAL) + 1


def get_raw(cluster: Cluster, user: str, path: str) -> tuple[int, Any]:
    """``kubectl get --raw PATH`` as ``user`` (a static-token user of the API server): status and JSON."""
    assert cluster.cp is not None and cluster.cp.pki is not None
    token = cluster.cp.identities[user].token
    request = urllib.request.Request(cluster.cp.server + path, headers={"Authorization": f"Bearer {token}"})
    return _send(request, ssl.create_default_context(cafile=str(cluster.cp.pki.ca_crt)))


def direct(cluster: Cluster, path: str, headers: dict[str, str], front_proxy: bool = True) -> tuple[int, Any]:
    """GET ``path`` of tf-metrics itself, past the API server: with the front proxy's client certificate
    and the user headers it would send, or with no certificate at all."""
    assert cluster.cp is not None and cluster.cp.pki is not None
    context = ssl.create_default_context(cafile=str(cluster.cp.pki.ca_crt))
    context.check_hostname = False  # the certificate names the Service; we dial its endpoint
    if front_proxy:
        context.load_cert_chain(*cluster.cp.pki.front_proxy_client)
    url = f"https://{cluster.metrics_api_address}:{cluster.metrics_api_port}{path}"
    return _send(urllib.request.Request(url, headers=headers), context)


def _send(request: urllib.request.Request, context: ssl.SSLContext) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return int(answer.status), json.load(answer)
    except urllib.error.HTTPError as failed:
        return failed.code, json.loads(failed.read() or b"null")


def values(body: Any) -> dict[tuple[str, str], str]:
    return {
        (i["describedObject"].get("namespace", ""), i["describedObject"]["name"]): i["value"] for i in body["items"]
    }


@pytest.fixture(scope="module")
def metrics_api(cluster: Cluster) -> Iterator[None]:
    cluster.start_metrics_api()
    yield
    cluster.stop_metrics_api()


@pytest.fixture(scope="module")
def busy(cluster: Cluster, metrics_api: None) -> Iterator[tuple[Any, float]]:
    """The pod, its use scripted, and when the script was written (monotonic); the tenant may view its namespace."""
    core = cluster.core
    cluster.namespace(OTHER)
    cluster.grant_tenant(cluster.namespace(NAMESPACE), "view")
    core.create_namespaced_pod(NAMESPACE, gpu_pod("busy", SHARE, labels={"app": "busy"}))
    try:
        pod = wait_running(core, NAMESPACE, "busy")
        (grant,) = allocation_of(pod).gpus
        script = [{"pod": pod.metadata.uid, "container": "main", "gpu": grant.uuid, "smPercent": SM_PERCENT,
                   "vramMiB": VRAM_MIB}]  # fmt: skip
        written = time.monotonic()
        cluster.write_fake_nvml(fake_nvml_yaml(cluster.gpus, {}, usage=script))
        yield pod, written
    finally:
        cluster.set_gpu_faults({})
        core.delete_namespaced_pod("busy", NAMESPACE, grace_period_seconds=0)
        eventually("pod busy gone", lambda: not core.list_namespaced_pod(NAMESPACE).items, 60)  # its GPU share too


def test_the_seed_query_shows_the_pods_use_within_two_sample_periods(cluster: Cluster, busy: tuple[Any, float]) -> None:
    pod, written = busy

    def shown() -> Any:
        code, body = get_raw(cluster, "admin", SEED_QUERY)
        return body if code == 200 and values(body).get((NAMESPACE, "busy")) == "78" else None

    body = eventually("78 % on the seed's query", shown, WITHIN_S, 0.1)
    took = time.monotonic() - written
    print(f"\ncustom metrics: the pod's use reached the seed's query {took:.2f}s after it was scripted")
    print(f"$ kubectl get --raw '{SEED_QUERY}'\n{json.dumps(body)}")
    assert took <= WITHIN_S
    (item,) = [i for i in body["items"] if i["describedObject"]["name"] == "busy"]
    assert item["describedObject"] == {"kind": "Pod", "namespace": NAMESPACE, "name": "busy", "apiVersion": "v1"}
    assert (item["metricName"], item["window"], item["value"], item["selector"]) == ("gpu_utilization", 1, "78", None)
    assert body["kind"] == "MetricValueList" and body["apiVersion"] == "custom.metrics.k8s.io/v1beta1"
    for metric, value in (("gpu_tflops", "15600m"), ("gpu_vram_bytes", f"{VRAM_MIB}Mi")):
        code, got = get_raw(cluster, "admin", f"{API}/v1beta1/namespaces/{NAMESPACE}/pods/*/{metric}")
        assert (code, values(got)) == (200, {(NAMESPACE, "busy"): value})
    code, nodes = get_raw(cluster, "admin", f"{API}/v1beta1/nodes/*/gpu_tflops")
    assert code == 200 and values(nodes)[("", REAL_NODE)] == "15600m"
    assert pod.spec.node_name == REAL_NODE


def test_tfctl_top_shows_the_grant_beside_the_use(cluster: Cluster, busy: tuple[Any, float]) -> None:
    assert cluster.cp is not None
    admin = str(cluster.cp.kubeconfig("admin"))
    tfctl = [str(VENV_BIN / "tfctl"), "top"]
    pods = subprocess.run([*tfctl, "pods", "-n", NAMESPACE, "--kubeconfig", admin], capture_output=True, text=True)
    assert pods.returncode == 0, pods.stderr
    print(f"\n$ tfctl top pods -n {NAMESPACE}\n{pods.stdout}")
    header, row = pods.stdout.splitlines()
    assert header.split()[:3] == ["NAMESPACE", "POD", "NODE"]
    assert row.split() == [NAMESPACE, "busy", REAL_NODE, "10/20", "15.6", "1Gi/2Gi", "512Mi", "78%"]
    nodes = subprocess.run([*tfctl, "nodes", "--kubeconfig", admin], capture_output=True, text=True)
    assert nodes.returncode == 0, nodes.stderr
    print(f"$ tfctl top nodes\n{nodes.stdout}")
    (mine,) = [line.split() for line in nodes.stdout.splitlines() if line.startswith(REAL_NODE)]
    assert mine[1] == str(len(cluster.gpus)) and mine[3] == "15.6" and mine[5] == "512Mi"


def test_what_the_rbac_of_a_user_allows_is_what_it_reads(cluster: Cluster, busy: tuple[Any, float]) -> None:
    own = f"{API}/v1beta1/namespaces/{NAMESPACE}/pods/*/gpu_utilization"

    def readable() -> Any:  # once the role aggregation controller has put the chart's reader role into view
        code, body = get_raw(cluster, TENANT, own)
        return body if code == 200 else None

    assert values(eventually("the tenant's view of its namespace", readable)) == {(NAMESPACE, "busy"): "78"}
    for path in (SEED_QUERY, f"{API}/v1beta1/namespaces/{OTHER}/pods/*/gpu_utilization"):
        code, refused = get_raw(cluster, TENANT, path)
        assert (code, refused["reason"]) == (403, "Forbidden"), refused
        assert f'User "{TENANT}" cannot get resource "pods/gpu_utilization"' in refused["message"]
    # The HPA controller's service account may read every namespace's pods' metrics.
    attributes = {"group": "custom.metrics.k8s.io", "resource": "pods", "subresource": "gpu_utilization",
                  "verb": "get", "namespace": OTHER, "name": "*"}  # fmt: skip
    hpa = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
    review = AuthorizationV1Api(cluster.admin).create_subject_access_review(
        {"spec": {"user": hpa, "resourceAttributes": attributes}}
    )
    assert review.status.allowed


def test_an_unknown_metric_is_a_404_and_pods_without_samples_an_empty_list(
    cluster: Cluster, busy: tuple[Any, float]
) -> None:
    code, body = get_raw(cluster, "admin", f"{API}/v1beta1/namespaces/{NAMESPACE}/pods/*/gpu_temperature")
    assert (code, body["kind"], body["reason"]) == (404, "Status", "NotFound")
    assert body["message"] == "the server could not find the metric gpu_temperature for pods"
    code, body = get_raw(cluster, "admin", f"{API}/v1beta1/namespaces/{OTHER}/pods/*/gpu_utilization")
    assert (code, body["items"]) == (200, [])
    code, body = get_raw(cluster, "admin", f"{API}/v1beta1/namespaces/{NAMESPACE}/pods/nobody/gpu_utilization")
    assert (code, body["message"]) == (404, "the server could not find the metric gpu_utilization for pods nobody")


def test_v1beta2_a_named_pod_and_label_selectors(cluster: Cluster, busy: tuple[Any, float]) -> None:
    code, body = get_raw(cluster, "admin", f"{API}/v1beta2/namespaces/{NAMESPACE}/pods/busy/gpu_utilization")
    assert code == 200 and body["apiVersion"] == "custom.metrics.k8s.io/v1beta2"
    (item,) = body["items"]
    assert (item["metric"], item["windowSeconds"], item["value"]) == (
        {"name": "gpu_utilization", "selector": None},
        1,
        "78",
    )
    listed = f"{API}/v1beta2/namespaces/{NAMESPACE}/pods/*/gpu_tflops"
    assert values(get_raw(cluster, "admin", listed + "?labelSelector=app%3Dbusy")[1]) == {(NAMESPACE, "busy"): "15600m"}
    assert get_raw(cluster, "admin", listed + "?labelSelector=app%3Dother")[1]["items"] == []
    code, body = get_raw(cluster, "admin", listed + "?labelSelector=app+in+%28")
    assert (code, body["reason"]) == (400, "BadRequest") and "labelSelector" in body["message"]


def test_past_the_api_server_only_the_front_proxy_is_believed_and_tf_metrics_authorises_itself(
    cluster: Cluster, busy: tuple[Any, float]
) -> None:
    own = f"{API}/v1beta1/namespaces/{NAMESPACE}/pods/*/gpu_utilization"
    masters = {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}
    code, body = direct(cluster, own, masters, front_proxy=False)
    assert (code, body["reason"]) == (401, "Unauthorized")
    code, body = direct(cluster, SEED_QUERY, {"X-Remote-User": TENANT, "X-Remote-Group": "system:authenticated"})
    assert (code, body["reason"]) == (403, "Forbidden")  # tf-metrics' own SubjectAccessReview
    code, body = direct(cluster, own, masters)
    assert code == 200 and values(body) == {(NAMESPACE, "busy"): "78"}
