"""No side doors: per-pod data served off loopback answers only callers the API server lets read it.

A tenant (a ServiceAccount with ``edit`` in its own namespace, its token as a pod of it would mount) asks the
kubelet node's device plugin for ``/usage`` and ``/metrics`` and the extender's read-only port for the explain of
another namespace's running GPU pod, at this machine's non-loopback address (the pod network, to them): every
answer is a refusal (401 without a token, 403 with its own), and none names the other pod. The same tenant
explains its own namespace's pods. Those who need the data still get it the same way: the extender's
ServiceAccount (nodes/stats, as the chart grants it) reads ``/usage``, and a Prometheus ServiceAccount with
kube-prometheus's ``nodes/metrics`` reads ``/metrics``. The programs' own reads go the same way: tf-metrics and the
extender's autoscaler reach the plugin off loopback with their ServiceAccounts' tokens in test_custom_metrics and
test_autoscaling, which fail if one of them is refused.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from kubernetes.client import CoreV1Api, RbacAuthorizationV1Api

from vgpu.contract import usage
from vgpu.names import Annotation

from .cluster import REAL_NODE, Cluster
from .deploy import service_accounts
from .fake_nodes import fake_nvml_yaml
from .kube import emptied, eventually, service_account_token, wait_running
from .pods import allocation_of, gpu_pod
from .procs import non_loopback_ipv4

SHARE = {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "1Gi"}


def get(url: str, token: str | None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def bind(cluster: Cluster, namespace: str, account: str, kind: str, role: str) -> None:
    """``role`` (a ClusterRole) for the ServiceAccount, in ``namespace`` (a RoleBinding) or everywhere."""
    rbac = RbacAuthorizationV1Api(cluster.admin)
    body = {
        "metadata": {"name": f"e2e-{account}-{role.replace(':', '-')}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    if kind == "RoleBinding":
        rbac.create_namespaced_role_binding(namespace, body)
    else:
        rbac.create_cluster_role_binding(body)


def test_a_tenant_reads_nothing_of_another_namespace_and_the_readers_still_read(
    cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("no non-loopback IPv4 address: every caller here would be on loopback")
    other = cluster.namespace("e2e-side-doors-other")
    try:
        secret = gpu_pod("secret-job", SHARE)
        secret["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
        core.create_namespaced_pod(other, secret)
        pod = wait_running(core, other, "secret-job")
        (grant,) = allocation_of(pod).gpus
        script = [{"pod": pod.metadata.uid, "container": "main", "gpu": grant.uuid, "smPercent": 20, "vramMiB": 256}]
        cluster.write_fake_nvml(fake_nvml_yaml(cluster.gpus, {}, usage=script))  # its use, on /usage and /metrics
        asked_as_tenant_and_readers(cluster, core, fresh, other, pod.metadata.uid, address)
    finally:
        cluster.write_fake_nvml(fake_nvml_yaml(cluster.gpus, {}))
        emptied(core, other)


def asked_as_tenant_and_readers(
    cluster: Cluster, core: CoreV1Api, fresh: str, other: str, uid: str, address: str
) -> None:
    """Everything asked once the other namespace's pod runs with its use scripted; ``uid``: its UID, which no
    question names, so an answer holding it leaked the pod."""
    core.create_namespaced_pod(fresh, gpu_pod("mine", SHARE))
    plugin = f"http://{address}:{cluster.plugin_metrics_port}"
    explain = f"http://{address}:{cluster.extender_public_port}/explain"
    # The pod is on the node's /usage (asked on loopback, where the plugin's own pod would ask).
    eventually("the other namespace's pod on /usage", lambda: uid in cluster.plugin_get(usage.PATH) or None, 30)

    service_account_token(cluster.admin, fresh, "app")  # creates the ServiceAccount
    bind(cluster, fresh, "app", "RoleBinding", "edit")
    tenant = service_account_token(cluster.admin, fresh, "app")
    asked = {
        "plugin /usage, no token": get(plugin + usage.PATH, None),
        "plugin /usage": get(plugin + usage.PATH, tenant),
        "plugin /metrics, no token": get(plugin + "/metrics", None),
        "plugin /metrics": get(plugin + "/metrics", tenant),
        "explain, no token": get(f"{explain}/{other}/secret-job", None),
        "explain": get(f"{explain}/{other}/secret-job", tenant),
    }
    leaked = {what: answer for what, answer in asked.items() if answer[0] == 200 or uid in answer[1]}
    assert leaked == {}, leaked  # 0 of 6
    assert {what: code for what, (code, _) in asked.items()} == {
        "plugin /usage, no token": 401,
        "plugin /usage": 403,
        "plugin /metrics, no token": 401,
        "plugin /metrics": 403,
        "explain, no token": 401,
        "explain": 403,
    }
    assert 'cannot get resource "nodes/stats"' in asked["plugin /usage"][1]
    # Its own namespace it may explain.
    code, body = get(f"{explain}/{fresh}/mine", tenant)
    assert code == 200 and f'"pod":"{fresh}/mine"' in body, body

    # The readers: the extender as the chart runs it, and a Prometheus granted what kube-prometheus grants.
    namespace, account = service_accounts()["extender"]
    code, body = get(plugin + usage.PATH, service_account_token(cluster.admin, namespace, account))
    assert code == 200 and uid in body
    service_account_token(cluster.admin, fresh, "prometheus")
    rbac = RbacAuthorizationV1Api(cluster.admin)
    rbac.create_cluster_role(
        {
            "metadata": {"name": "e2e-prometheus-nodes-metrics"},
            "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}],
        }
    )
    bind(cluster, fresh, "prometheus", "ClusterRoleBinding", "e2e-prometheus-nodes-metrics")
    code, body = get(plugin + "/metrics", service_account_token(cluster.admin, fresh, "prometheus"))
    assert code == 200 and "tf_build_info" in body
