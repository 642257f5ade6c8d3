"""What a new user meets installing the chart: a values schema that refuses misspelt and invalid values,
kube-scheduler at the cluster's own version, a render without --kube-version, the minimum version refused
on an older cluster, disruption budgets only where a second replica exists, the device plugin's probe,
and NOTES that tell how to check, label, use and explain it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import yaml

from device_plugin.main import settings_from as plugin_settings
from tests.deploy.test_chart import CHART, by_kind_and_name, container, helm_template, objects, one, pod_spec, render
from tfctl.main import parser as tfctl_parser
from vgpu.names import (
    EXTENDER_PUBLIC_PORT,
    LABEL_ENABLED,
    Annotation,
    EnforcementBackend,
    PlacementPolicy,
    SystemAnnotation,
)

VALUES = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
SCHEMA = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))


def resolved(node: dict[str, Any]) -> dict[str, Any]:
    """A schema node with its ``$ref`` (to ``#/definitions/...``) followed."""
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].removeprefix("#/definitions/")]
    return node


def uncovered(value: Any, node: dict[str, Any], path: str) -> list[str]:
    """The paths under ``value`` that ``node`` does not describe by name (or, for free-form maps such as
    resources or nodeSelector, by an ``additionalProperties`` schema), or gives no type or set of values."""
    node = resolved(node)
    if "type" not in node and "enum" not in node:
        return [path]
    if isinstance(value, dict):
        missing = []
        for key, child in value.items():
            named = node.get("properties", {}).get(key, node.get("additionalProperties"))
            missing += uncovered(child, named, f"{path}.{key}") if isinstance(named, dict) else [f"{path}.{key}"]
        return missing
    if isinstance(value, list):
        return [m for i, item in enumerate(value) for m in uncovered(item, node["items"], f"{path}[{i}]")]
    return []


def test_every_value_in_values_yaml_is_described_by_the_schema_and_valid() -> None:
    assert uncovered(VALUES, SCHEMA, "") == []
    jsonschema_rs.validator_for(SCHEMA).validate(VALUES)
    # A misspelt key is refused, not ignored, at the top and in every section.
    for section in [SCHEMA, *(resolved(s) for s in SCHEMA["properties"].values() if "properties" in resolved(s))]:
        assert section["additionalProperties"] is False
    assert uncovered({"scheduler": {"extender": {"polcy": "spread"}}}, SCHEMA, "") == [".scheduler.extender.polcy"]


def test_the_schema_enums_are_the_codes_own_sets() -> None:
    props = SCHEMA["properties"]
    assert set(props["devicePlugin"]["properties"]["backend"]["enum"]) == set(EnforcementBackend)
    assert set(props["scheduler"]["properties"]["extender"]["properties"]["policy"]["enum"]) == set(PlacementPolicy)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"devicePlugin": {"backend": "foo"}},
            "at '/devicePlugin/backend': value must be one of 'none', 'hami-core', 'mps'",
        ),
        ({"webhook": {"tls": {"mod": "helm"}}}, "at '/webhook/tls': additional properties 'mod' not allowed"),
        ({"devicePlugins": {"backend": "mps"}}, "at '': additional properties 'devicePlugins' not allowed"),
        ({"scheduler": {"replicas": 0}}, "at '/scheduler/replicas': minimum: got 0, want 1"),
        (
            {"webhook": {"migration": {"replicaShare": {"vram": "lots"}}}},
            "at '/webhook/migration/replicaShare/vram': 'lots' does not match pattern",
        ),
    ],
)
def test_helm_refuses_a_misspelt_or_invalid_value_with_the_schemas_message(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failed:
        render(values, tmp_path)
    assert "values don't meet the specifications of the schema" in failed.value.stderr
    assert message in failed.value.stderr


def kube_scheduler_image(docs: list[dict[str, Any]]) -> str:
    spec = pod_spec(docs, "Deployment", "tensor-fusion-scheduler")
    image: str = container(spec, "kube-scheduler")["image"]
    return image


@pytest.mark.parametrize("version", ["1.30.4", "1.36.2"])
def test_kube_scheduler_runs_the_clusters_own_version_unless_pinned(version: str, tmp_path: Path) -> None:
    assert (
        kube_scheduler_image(render({}, tmp_path, kube_version=version)) == f"registry.k8s.io/kube-scheduler:v{version}"
    )
    pinned = render({"images": {"kubeScheduler": {"tag": "v1.33.1"}}}, tmp_path, kube_version=version)
    assert kube_scheduler_image(pinned) == "registry.k8s.io/kube-scheduler:v1.33.1"


def test_helm_template_renders_without_a_kube_version(tmp_path: Path) -> None:
    """helm's default (no cluster) is Kubernetes v1.20.0, below the minimum: rendered all the same."""
    assert kube_scheduler_image(render({}, tmp_path, kube_version=None)) == "registry.k8s.io/kube-scheduler:v1.20.0"


def test_a_cluster_older_than_1_30_is_refused(tmp_path: Path) -> None:
    """A cluster's API list names kinds (v1/Pod), helm's offline default does not: --api-versions stands in
    for the cluster."""
    with pytest.raises(subprocess.CalledProcessError) as failed:
        render({}, tmp_path, "--api-versions", "v1/Pod", kube_version="1.29.9")
    assert "tensor-fusion needs Kubernetes >= 1.30.0 (ValidatingAdmissionPolicy v1); the cluster runs v1.29.9" in (
        failed.value.stderr
    )
    assert kube_scheduler_image(render({}, tmp_path, "--api-versions", "v1/Pod", kube_version="1.30.0")).endswith(
        ":v1.30.0"
    )


def test_a_disruption_budget_only_for_a_component_with_a_second_replica(tmp_path: Path) -> None:
    docs = by_kind_and_name(render({"webhook": {"replicas": 1}, "metricsApi": {"replicas": 1}}, tmp_path))
    budgets = {name for kind, name in docs if kind == "PodDisruptionBudget"}
    assert budgets == {"tensor-fusion-scheduler"}  # one webhook: minAvailable 1 would block every drain
    assert {o["metadata"]["name"] for o in objects() if o["kind"] == "PodDisruptionBudget"} == {
        "tensor-fusion-scheduler",
        "tensor-fusion-webhook",
        "tensor-fusion-metrics-api",
    }


def test_the_device_plugin_is_probed_on_the_port_it_serves_metrics_on() -> None:
    (plugin,) = one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    probe = plugin["livenessProbe"]["httpGet"]
    assert probe == {"path": "/healthz", "port": "metrics"}  # open: /metrics is authorised off loopback
    (port,) = [p for p in plugin["ports"] if p["name"] == probe["port"]]
    assert port["containerPort"] == plugin_settings(plugin["args"]).metrics_port


def rendered_notes(tmp_path: Path) -> str:
    """templates/NOTES.txt as helm install prints it. helm template skips NOTES.txt, so a copy of the chart
    keeps it outside templates/ and renders it, with the chart's helpers, into a document of its own."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "NOTES.txt").rename(chart / "NOTES.txt")
    (chart / "templates" / "notes.yaml").write_text('notes: {{ tpl (.Files.Get "NOTES.txt") . | toJson }}\n')
    out = helm_template({}, tmp_path, "--show-only", "templates/notes.yaml", kube_version="1.30.4", chart=chart)
    notes: str = yaml.safe_load(out)["notes"]
    return notes


def test_the_notes_tell_how_to_check_label_use_and_explain(tmp_path: Path) -> None:
    notes = rendered_notes(tmp_path)
    assert "kubectl -n tensor-fusion-system rollout status deploy/tensor-fusion-scheduler" in notes
    assert "kube-scheduler registry.k8s.io/kube-scheduler:v1.30.4" in notes
    assert "\n  kubectl label node <node> nvidia.com/gpu.present=true\n" in notes
    inventory = SystemAnnotation.NODE_INVENTORY.replace(".", "\\.")  # jsonpath escapes the dots of a key
    assert f"jsonpath='{{.metadata.annotations.{inventory}}}'" in notes
    assert "Kubernetes 1.30.0 or newer" in notes
    example = notes[notes.index("  apiVersion: v1") : notes.index("\n\n", notes.index("  apiVersion: v1"))]
    pod = yaml.safe_load(example)
    assert pod["metadata"]["labels"] == {LABEL_ENABLED: "true"}
    assert set(pod["metadata"]["annotations"]) == {Annotation.TFLOPS_REQUEST, Annotation.VRAM_REQUEST}
    forward = f"kubectl -n tensor-fusion-system port-forward svc/tensor-fusion-extender {EXTENDER_PUBLIC_PORT}"
    assert forward in notes
    (explain,) = [line.split() for line in notes.splitlines() if line.strip().startswith("tfctl explain")]
    args = tfctl_parser().parse_args(explain[1:])
    assert args.extender == f"http://127.0.0.1:{EXTENDER_PUBLIC_PORT}"
