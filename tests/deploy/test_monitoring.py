"""The chart's monitoring: the Grafana dashboard ConfigMap and the PrometheusRule carry deploy/'s files as they
are, and the ServiceMonitors reach the /metrics port of every container of ours, keep the scraped series' own
labels and give each target the job the alert rules name. Every metric the dashboard and the rules read is one
a binary exports (docs/metrics.md); tests/e2e/test_dashboard.py evaluates them against a real Prometheus."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_chart import DEPLOY, objects, one, render
from tests.deploy.test_chart_install import VALUES

DASHBOARD = DEPLOY / "dashboards" / "tensor-fusion.json"
RULES = DEPLOY / "alerts" / "tensor-fusion.rules.yaml"
METRICS_DOC = DEPLOY.parent / "docs" / "metrics.md"
MONITORED = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
OUR_IMAGES = tuple(VALUES["images"][i]["repository"] for i in ("scheduler", "plugin"))


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return doc


def rules() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return doc


def expressions() -> list[str]:
    """Every PromQL expression shipped: the dashboard's targets and variable queries, the rules' exprs."""
    board = dashboard()
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", ())]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs + [r["expr"] for g in rules()["groups"] for r in g["rules"]]


def test_the_dashboard_configmap_is_the_shipped_json_under_the_sidecars_label() -> None:
    configmap = one("ConfigMap", "grafana-dashboard")  # deploy/manifests: on by default
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    (key,) = configmap["data"]
    assert key.endswith(".json") and json.loads(configmap["data"][key]) == dashboard()
    assert not [o for o in objects() if o["kind"] in ("PrometheusRule", "ServiceMonitor")]  # those need CRDs


def test_the_dashboard_goes_where_grafana_looks_or_nowhere(tmp_path: Path) -> None:
    values = {"grafanaDashboard": {"namespace": "monitoring", "annotations": {"grafana_folder": "GPUs"}}}
    (configmap,) = [d for d in render(values, tmp_path) if d["metadata"]["name"].endswith("grafana-dashboard")]
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
    off = render({"grafanaDashboard": {"enabled": False}}, tmp_path)
    assert not [d for d in off if d["metadata"]["name"].endswith("grafana-dashboard")]


def test_the_prometheus_rule_is_the_shipped_rule_file(tmp_path: Path) -> None:
    (rule,) = [d for d in render(MONITORED | {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}},
                                 tmp_path) if d["kind"] == "PrometheusRule"]  # fmt: skip
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == rules()
    assert "{{ $labels.node }}" in rule["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]  # not Helm's


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def scraped_containers(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(workload, container) -> the endpoint of the ServiceMonitor that reaches a port of that container."""
    services = [d for d in docs if d["kind"] == "Service"]
    reached: dict[tuple[str, str], dict[str, Any]] = {}
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        for service in (
            s for s in services if matches(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        ):
            for endpoint in monitor["spec"]["endpoints"]:
                (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
                for workload in (d for d in docs if d["kind"] in ("Deployment", "DaemonSet")):
                    template = workload["spec"]["template"]
                    if not matches(service["spec"]["selector"], template["metadata"]["labels"]):
                        continue
                    for c in template["spec"]["containers"]:
                        if port["targetPort"] in [p["name"] for p in c.get("ports", ())]:
                            reached[(workload["metadata"]["name"], c["name"])] = endpoint
    return reached


@pytest.mark.parametrize("metrics_api", [True, False])
def test_a_service_monitor_scrapes_every_container_of_ours_and_keeps_its_labels(
    metrics_api: bool, tmp_path: Path
) -> None:
    docs = render(MONITORED | {"metricsApi": {"enabled": metrics_api}}, tmp_path)
    ours = {
        (w["metadata"]["name"], c["name"])
        for w in docs
        if w["kind"] in ("Deployment", "DaemonSet")
        for c in w["spec"]["template"]["spec"]["containers"]
        if c["image"].startswith(OUR_IMAGES)
    }
    assert len(ours) == 3 + metrics_api  # extender, webhook, device plugin (+ tf-metrics)
    reached = scraped_containers(docs)
    assert set(reached) == ours
    jobs = {}
    for (workload, _), endpoint in reached.items():
        assert endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
        (job,) = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
        jobs[workload] = job
    assert jobs == {
        "tensor-fusion-scheduler": "tensor-fusion-extender",
        "tensor-fusion-webhook": "tensor-fusion-webhook",
        "tensor-fusion-device-plugin": "tensor-fusion-device-plugin",
    } | ({"tensor-fusion-metrics-api": "tensor-fusion-metrics-api"} if metrics_api else {})
    plugin = reached[("tensor-fusion-device-plugin", "device-plugin")]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in plugin["relabelings"]


@pytest.mark.parametrize("mode", ["cert-manager", "helm"])
def test_the_https_binaries_are_scraped_with_their_serving_certificates_ca(mode: str, tmp_path: Path) -> None:
    tls = {"tls": {"mode": mode}}
    docs = render(MONITORED | {"webhook": tls, "metricsApi": tls}, tmp_path)
    reached = scraped_containers(docs)
    for workload, container in (("tensor-fusion-webhook", "webhook"), ("tensor-fusion-metrics-api", "metrics-api")):
        endpoint = reached[(workload, container)]
        host = f"{workload}.tensor-fusion-system.svc"
        assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["serverName"] == host
        ca = endpoint["tlsConfig"]["ca"]["secret"]
        if mode == "helm":  # the chart's Secret holds the CA that signed the certificate for that host
            (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == ca["name"]]
            assert ca["key"] in secret["data"]
        else:  # cert-manager writes ca.crt into the Certificate's Secret
            (certificate,) = [d for d in docs if d["kind"] == "Certificate" and d["spec"]["secretName"] == ca["name"]]
            assert ca["key"] == "ca.crt" and host in certificate["spec"]["dnsNames"]


def test_every_job_the_rules_name_is_one_a_service_monitor_sets(tmp_path: Path) -> None:
    set_jobs = {r["replacement"] for e in scraped_containers(render(MONITORED, tmp_path)).values()
                for r in e["relabelings"] if r["targetLabel"] == "job"}  # fmt: skip
    named = set(re.findall(r'job="([^"]+)"', "\n".join(expressions())))
    named_by_regex = re.findall(r'job=~"([^"]+)"', "\n".join(expressions()))
    assert named and named <= set_jobs
    for pattern in named_by_regex:
        assert [j for j in set_jobs if re.fullmatch(pattern, j)], pattern


def documented_metrics() -> set[str]:
    return set(re.findall(r"`(tf_[a-z_]+)`", METRICS_DOC.read_text(encoding="utf-8")))


def test_every_metric_the_dashboard_and_the_rules_read_is_documented() -> None:
    read = {re.sub(r"_(bucket|count|sum)$", "", m) for e in expressions() for m in re.findall(r"\btf_[a-z_]+", e)}
    assert len(read) > 30
    assert sorted(read - documented_metrics()) == []


def test_every_panel_uses_the_templated_datasource_and_defined_variables() -> None:
    board = dashboard()
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "pool", "node", "namespace", "pod"} <= variables
    titles = [p["title"] for p in board["panels"]]
    assert len(titles) == len(set(titles))
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Cluster", "Node and GPU", "Workload and pod", "Scheduler", "Components"]
    for panel in (p for p in board["panels"] if p["type"] != "row"):
        assert panel["targets"], panel["title"]
        for source in (panel["datasource"], *(t["datasource"] for t in panel["targets"])):
            assert source == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, (panel["title"], used - variables)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
