"""The chart's tf-metrics: its APIServices reach its Service with a caBundle that signs its certificate,
its RBAC grants exactly what an aggregated API server and its own code need, its settings (read by
its own flag parser) find the device plugins' Service, and reading the metrics is granted to the HPA
controller and to namespace viewers, metric by metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_chart import by_kind_and_name, container, objects, one, render, role_rules, triples
from tests.deploy.test_chart_install import rendered_notes
from tf_metrics.api import METRICS
from tf_metrics.settings import MetricsSettings
from tfctl.main import parser as tfctl_parser
from vgpu.names import CUSTOM_METRICS_GROUP, CUSTOM_METRICS_VERSIONS, METRICS_API_PORT

NAMESPACE = "tensor-fusion-system"
ACCOUNT = {"kind": "ServiceAccount", "name": "tensor-fusion-metrics-api", "namespace": NAMESPACE}


def settings_of(spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> MetricsSettings:
    """What tf-metrics makes of its container's environment."""
    for variable in container(spec, "metrics-api")["env"]:
        monkeypatch.setenv(variable["name"], variable["value"])
    return MetricsSettings()


def test_the_api_services_reach_the_service_with_v1beta2_preferred() -> None:
    services = {o["spec"]["version"]: o for o in objects() if o["kind"] == "APIService"}
    assert set(services) == set(CUSTOM_METRICS_VERSIONS)
    for version, service in services.items():
        assert service["metadata"]["name"] == f"{version}.{CUSTOM_METRICS_GROUP}"
        assert service["spec"]["group"] == CUSTOM_METRICS_GROUP
        assert service["spec"]["service"] == {"name": "tensor-fusion-metrics-api", "namespace": NAMESPACE, "port": 443}
        assert "insecureSkipTLSVerify" not in service["spec"]
        # cert-manager (deploy/manifests' values) injects the CA of the Certificate that names the Service.
        assert service["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/tensor-fusion-metrics-api"
        }
    preferred = max(services.values(), key=lambda s: s["spec"]["versionPriority"])
    assert preferred["spec"]["version"] == CUSTOM_METRICS_VERSIONS[0]
    certificate = one("Certificate", "metrics-api")
    assert f"tensor-fusion-metrics-api.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    (port,) = one("Service", "metrics-api")["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (443, "https")


def test_tf_metrics_serves_its_certificate_on_its_port_and_finds_the_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = one("Deployment", "metrics-api")
    spec = deployment["spec"]["template"]["spec"]
    settings = settings_of(spec, monkeypatch)
    metrics_api = container(spec, "metrics-api")
    assert metrics_api["command"] == ["tf-metrics"]
    assert (
        metrics_api["ports"] == [{"name": "https", "containerPort": settings.port}]
        and settings.port == METRICS_API_PORT
    )
    (volume,) = spec["volumes"]
    (mount,) = metrics_api["volumeMounts"]
    assert volume["secret"]["secretName"] == one("Certificate", "metrics-api")["spec"]["secretName"]
    assert settings.tls_cert_file == Path(mount["mountPath"]) / "tls.crt"
    assert settings.tls_key_file == Path(mount["mountPath"]) / "tls.key"
    assert metrics_api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert metrics_api["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "https", "scheme": "HTTPS"}
    assert spec["serviceAccountName"] == ACCOUNT["name"] and deployment["spec"]["replicas"] == 2
    # The plugins' Service: the one tf-metrics lists EndpointSlices of, selecting the DaemonSet's pods, its
    # port named as tf-metrics looks for it, and targeting the port the plugin serves /usage on.
    plugins = one("Service", "device-plugin-metrics")
    assert (plugins["metadata"]["name"], settings.plugin_namespace) == (settings.plugin_service, NAMESPACE)
    daemon = one("DaemonSet", "device-plugin")["spec"]["template"]
    assert plugins["spec"]["selector"].items() <= daemon["metadata"]["labels"].items()
    (port,) = plugins["spec"]["ports"]
    assert port["name"] == settings.plugin_port_name
    (plugin,) = daemon["spec"]["containers"]
    assert port["targetPort"] in {p["name"] for p in plugin["ports"]}


def test_tf_metrics_is_granted_exactly_what_it_calls() -> None:
    # tf_shell/kube/reads.py: the pods a labelSelector chooses, in any namespace ...
    assert role_rules("-metrics-api") == triples("", "pods", "list") | triples("", "nodes/stats", "get")
    # ... the plugins' EndpointSlices, in the release's namespace only ...
    plugins = one("Role", "metrics-api-plugins")
    assert plugins["metadata"]["namespace"] == NAMESPACE
    assert plugins["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}]
    # ... and, as every aggregated API server, SubjectAccessReviews and the front proxy's configuration.
    granted = {(o["roleRef"]["kind"], o["roleRef"]["name"]): o for o in objects() if ACCOUNT in o.get("subjects", [])}
    assert set(granted) == {
        ("ClusterRole", "tensor-fusion-metrics-api"),
        ("Role", "tensor-fusion-metrics-api-plugins"),
        ("ClusterRole", "system:auth-delegator"),
        ("Role", "extension-apiserver-authentication-reader"),
    }
    assert granted[("Role", "extension-apiserver-authentication-reader")]["metadata"]["namespace"] == "kube-system"
    assert all(binding["subjects"] == [ACCOUNT] for binding in granted.values())


def test_reading_the_metrics_is_granted_to_the_hpa_controller_and_viewers_metric_by_metric() -> None:
    reader = one("ClusterRole", "metrics-reader")
    served = {f"{resource}/{metric}" for resource, (metrics, _) in METRICS.items() for metric in metrics}
    assert role_rules("-metrics-reader") == {
        (CUSTOM_METRICS_GROUP, resource, verb) for resource in served for verb in ("get", "list")
    }
    for role in ("view", "edit", "admin"):
        assert reader["metadata"]["labels"][f"rbac.authorization.k8s.io/aggregate-to-{role}"] == "true"
    (hpa,) = [
        o for o in objects() if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == reader["metadata"]["name"]
    ]
    assert hpa["subjects"] == [
        {"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}
    ]


def test_generated_tls_gives_the_api_services_the_ca_of_the_served_certificate(tmp_path: Path) -> None:
    helm = {"tls": {"mode": "helm"}}
    docs = by_kind_and_name(render({"metricsApi": helm, "webhook": helm}, tmp_path))
    secret = docs[("Secret", "tensor-fusion-metrics-api-tls")]
    for version in CUSTOM_METRICS_VERSIONS:
        service = docs[("APIService", f"{version}.{CUSTOM_METRICS_GROUP}")]
        assert service["spec"]["caBundle"] == secret["data"]["ca.crt"]
        assert "annotations" not in service["metadata"]
    webhook = docs[("Secret", "tensor-fusion-webhook-tls")]
    assert webhook["data"]["ca.crt"] != secret["data"]["ca.crt"]  # a CA of its own


def test_another_adapter_serving_the_group_turns_it_off(tmp_path: Path) -> None:
    docs = render({"metricsApi": {"enabled": False}}, tmp_path)
    assert not [d for d in docs if d["kind"] == "APIService" or "metrics-api" in d["metadata"]["name"]]
    assert not [d for d in docs if d["metadata"]["name"].endswith("device-plugin-metrics")]  # nor the plugins' Service
    kept = render({"metricsApi": {"enabled": False}, "serviceMonitor": {"enabled": True}}, tmp_path)
    assert [d for d in kept if d["metadata"]["name"].endswith("device-plugin-metrics")]  # Prometheus still needs it


def test_the_notes_show_how_to_see_gpu_use(tmp_path: Path) -> None:
    notes = rendered_notes(tmp_path)
    assert f"kubectl get apiservice v1beta1.{CUSTOM_METRICS_GROUP}" in notes
    assert f"kubectl get --raw '/apis/{CUSTOM_METRICS_GROUP}/v1beta1/namespaces/*/pods/*/gpu_utilization'" in notes
    tops = [line.split()[1:] for line in notes.splitlines() if line.strip().startswith("tfctl top")]
    assert [tfctl_parser().parse_args(argv).what for argv in tops] == ["pods", "nodes"]  # tfctl takes them
