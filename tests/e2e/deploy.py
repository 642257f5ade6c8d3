"""The manifests the e2e cluster takes from deploy/, with only the loopback addresses changed.

WHY: the tier must test what operators install — the CRDs, RBAC, admission policies, webhook
configuration and KubeSchedulerConfiguration shipped in deploy/ — not a copy that can drift.
Our binaries run as local processes instead of the shipped Deployments/DaemonSet, so those are
left out, and the webhook configuration's in-cluster Service reference becomes a loopback URL
with our test CA as its caBundle. Everything else is applied as shipped.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from .kube import load_docs

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CRDS = DEPLOY / "crds"
MANIFESTS = DEPLOY / "manifests"
EXAMPLES = DEPLOY / "examples"
SCHEDULER_CONFIG = DEPLOY / "scheduler-config.yaml"
EXTENDER_PREFIX = "/extender"  # the shipped configurations call the verbs at 127.0.0.1:<verbs port>/extender

# Kinds that run our binaries in a real cluster; the harness runs them as processes instead.
WORKLOAD_KINDS = frozenset({"Deployment", "DaemonSet", "Service", "Pod", "Secret"})
WEBHOOK_KINDS = frozenset({"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"})
# Registered when the harness starts tf-metrics, with its test CA (an APIService without a server behind it
# would fail the API server's discovery of its group for every client).
API_SERVICE = "APIService"
# The shipped manifests get the webhook certificate from cert-manager; the harness signs its own.
SKIPPED_GROUPS = ("cert-manager.io/",)
_FIRST = {"Namespace": 0, "CustomResourceDefinition": 1}

# Which of the shipped ServiceAccounts each of our processes runs as, by a word in its name.
COMPONENT_ACCOUNT_WORDS = {
    "extender": ("extender", "scheduler"),
    "webhook": ("webhook",),
    "device-plugin": ("plugin",),
    "metrics-api": ("metrics",),
}


def _shipped() -> list[dict[str, Any]]:
    paths = sorted(CRDS.glob("*.yaml")) + sorted(MANIFESTS.glob("*.yaml"))
    if not paths:
        raise FileNotFoundError(f"no manifests under {CRDS} and {MANIFESTS}")
    return [d for d in load_docs(paths) if not d["apiVersion"].startswith(SKIPPED_GROUPS)]


def cluster_objects() -> list[dict[str, Any]]:
    """CRDs first, then RBAC, policies, priority classes… (the namespace is created separately)."""
    docs = [d for d in _shipped() if d["kind"] not in WORKLOAD_KINDS | WEBHOOK_KINDS | {API_SERVICE}]
    return sorted(docs, key=lambda d: _FIRST.get(d["kind"], 2))


def system_namespace() -> str:
    """The namespace the shipped ServiceAccounts live in (README: ``kubectl create ns`` it first)."""
    return str(next(d["metadata"]["namespace"] for d in _shipped() if d["kind"] == "ServiceAccount"))


def service_accounts() -> dict[str, tuple[str, str]]:
    """component -> (namespace, ServiceAccount name) as shipped."""
    accounts = [d["metadata"] for d in _shipped() if d["kind"] == "ServiceAccount"]
    found: dict[str, tuple[str, str]] = {}
    for component, words in COMPONENT_ACCOUNT_WORDS.items():
        for meta in accounts:
            if any(w in meta["name"] for w in words):
                found[component] = (meta["namespace"], meta["name"])
                break
        else:
            raise LookupError(f"deploy/ ships no ServiceAccount for the {component} (names with {words})")
    return found


def webhook_configurations(base_url: str, ca: Path) -> list[dict[str, Any]]:
    """The shipped webhook configurations, calling ``base_url`` + the shipped path, trusting ``ca``."""
    bundle = base64.b64encode(ca.read_bytes()).decode()
    out: list[dict[str, Any]] = []
    for doc in _shipped():
        if doc["kind"] not in WEBHOOK_KINDS:
            continue
        doc = copy.deepcopy(doc)
        for hook in doc.get("webhooks", []):
            shipped = hook.get("clientConfig", {})
            path = shipped.get("service", {}).get("path") or urlsplit(shipped.get("url", "")).path
            hook["clientConfig"] = {"url": base_url + path, "caBundle": bundle}
        out.append(doc)
    if not out:
        raise LookupError("deploy/ ships no webhook configuration")
    return out


def api_services(ca: Path) -> list[dict[str, Any]]:
    """The shipped APIServices (tf-metrics' custom metrics API), trusting ``ca`` instead of cert-manager's."""
    bundle = base64.b64encode(ca.read_bytes()).decode()
    out = [copy.deepcopy(d) for d in _shipped() if d["kind"] == API_SERVICE]
    for doc in out:
        doc["metadata"].pop("annotations", None)
        doc["spec"]["caBundle"] = bundle
    if not out:
        raise LookupError("deploy/ ships no APIService")
    return out


def service(name_suffix: str) -> dict[str, Any]:
    """The shipped Service whose name ends in ``name_suffix`` (the harness gives it endpoints of its own)."""
    (found,) = [d for d in _shipped() if d["kind"] == "Service" and d["metadata"]["name"].endswith(name_suffix)]
    return found


def scheduler_config(kubeconfig: Path, verbs_port: int, client: tuple[float, int] | None = None) -> dict[str, Any]:
    """The shipped KubeSchedulerConfiguration with its two placeholders filled in, and nothing else — but
    for ``client``, (QPS, burst) of kube-scheduler's API client in place of the shipped ones (the
    throughput benchmark's knob: benchmarks/throughput.py)."""
    text = SCHEDULER_CONFIG.read_text()
    for placeholder in ("__KUBECONFIG__", "__EXTENDER_VERBS_PORT__"):
        if placeholder not in text:
            raise LookupError(f"{SCHEDULER_CONFIG} lacks the placeholder {placeholder}")
    text = text.replace("__KUBECONFIG__", str(kubeconfig)).replace("__EXTENDER_VERBS_PORT__", str(verbs_port))
    config: dict[str, Any] = yaml.safe_load(text)
    if client is not None:
        config["clientConnection"] |= {"qps": client[0], "burst": client[1]}
    return config


def chart_leader_election() -> dict[str, Any]:
    """The leaderElection block of the chart's KubeSchedulerConfiguration, as rendered into deploy/manifests
    (leaderElect true, the durations of the chart's values, its Lease's name and namespace)."""
    (config_map,) = [d for d in _shipped() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith(
        "-scheduler-config")]  # fmt: skip
    election: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])["leaderElection"]
    return election


_EXAMPLE_ORDER = {"GPUPool": 0, "WorkloadProfile": 1}


def examples() -> list[dict[str, Any]]:
    """deploy/examples/ in the order its README applies them: pool, profile, then the Deployment."""
    docs = load_docs(sorted(EXAMPLES.glob("*.yaml")))
    return sorted(docs, key=lambda d: _EXAMPLE_ORDER.get(d["kind"], 2))
