"""The shipped Grafana dashboard and alert rules against a real Prometheus scraping the cluster (issue 15).

Prometheus (``prometheus.py``) scrapes the extender, the webhook, the kubelet node's device plugin and
tf-metrics every second, with ``deploy/alerts/tensor-fusion.rules.yaml`` loaded. Then the cluster does what
each panel and alert is about: a GPU pod runs with its use scripted in the fake GPU file (a process of
another, unknown pod beside it, and NVML figures for every GPU); a second pod takes 300 of the 312 TFLOPS
and 75 of the 80 GiB of the one GPU of a kubelet-less node in a pool of its own; a third waits for a GPU
model no node has; one GPU fails its health check; the kubelet node's NVIDIA toolkit is left on its defaults
(any pod may take GPUs by environment); the first pod's container rewrites its ``limits.json`` (the
device plugin puts it back, and counts it) and holds more than its VRAM limit in a second process (the device
plugin kills it, and counts it) and uses more of its GPU than its TFLOPS limit (reported, and counted); two pods are bound to the kubelet node by hand, without the
extender's grant (the device plugin refuses their Allocate); the extender gets a malformed verb; and two targets
that never answer stand for a crashed device plugin and a crashed extender. Every target expression of
every panel of ``deploy/dashboards/tensor-fusion.json`` (template variables as "All", ``$__rate_interval``
as 1m) and every variable query must then succeed and return series; every rule must be loaded healthy,
its expression without the threshold must return series, and each alert must be pending for what was
staged — and the one nothing staged (allocation conflicts) inactive.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from vgpu.names import LIVE_LIMITS_FILE, Annotation

from .cluster import REAL_NODE, Cluster
from .conftest import REQUIRED_ENV
from .deploy import DEPLOY, EXTENDER_PREFIX
from .fake_nodes import fake_nvml_yaml, gpus
from .kube import bind_by_hand, emptied, eventually, wait_bound, wait_running
from .pods import allocation_of, gpu_pod, rewrite_as_tenant
from .procs import free_port
from .prometheus import (
    EXTENDER_JOB,
    METRICS_API_JOB,
    PLUGIN_JOB,
    WEBHOOK_JOB,
    Prometheus,
    Target,
    binary,
    metrics_api_server_name,
)

DASHBOARD = DEPLOY / "dashboards" / "tensor-fusion.json"
NAMESPACE = "e2e-dashboard"
POOL = "e2e-dashboard"  # the full pool: one kubelet-less node, no device plugin
FULL_NODE = "e2e-dashboard-full"
CRASHED_PLUGIN_NODE = "e2e-dashboard-crashed"  # the node label of the plugin target that never answers
SHARE = {
    Annotation.TFLOPS_REQUEST: "10",
    Annotation.TFLOPS_LIMIT: "20",
    Annotation.VRAM_REQUEST: "1Gi",
    Annotation.VRAM_LIMIT: "2Gi",
}
FULL = {Annotation.GPUPOOL: POOL, Annotation.TFLOPS_REQUEST: "300", Annotation.VRAM_REQUEST: "75Gi"}
ABSENT_MODEL = {**SHARE, Annotation.GPU_MODEL: "B200"}
# Grafana's variables as a viewer who picked "All" everywhere, and its rate interval.
VARIABLES = {r"\$(pool|node|namespace|pod)\b": ".*", r"\$__rate_interval\b": "1m"}
WITHIN_S = 45  # a few scrape and evaluation rounds after the pods have run, on a loaded 2-core machine
HEALTHY_AGAIN_S = 15  # the plugin checks each GPU every second and clears a fault after 2 s of passes


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return doc


def as_viewed(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = re.sub(variable, value, expr)
    return expr


def variable_query(definition: str) -> str:
    """Grafana's ``label_values(<selector>, <label>)`` as the query Prometheus answers it with."""
    found = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", definition)
    assert found, definition
    return f"count by ({found.group(2)}) ({found.group(1)})"


def without_threshold(expr: str) -> str:
    """The signal an alert compares: ``expr`` without a trailing top-level ``<op> <number>``, and of a
    top-level ``a unless b`` the ``a`` (what would fire were nothing excluded)."""
    expr = " ".join(expr.split())
    compared = re.fullmatch(r"(.+?)\s*(?:==|!=|>=|<=|>|<)\s*(?:bool\s+)?[-+]?[0-9.]+(?:e[-+]?[0-9]+)?", expr)
    if compared and _balanced(compared.group(1)):
        expr = compared.group(1)
    depth = 0
    for i, char in enumerate(expr):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and expr.startswith(" unless ", i):
            return expr[:i]
    return expr


def _balanced(expr: str) -> bool:
    depth = 0
    for char in expr:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


@dataclass(frozen=True, slots=True)
class Staged:
    """What the scenario set up, for the alerts' labels."""

    faulty_gpu: str
    prometheus: Prometheus


@pytest.fixture(scope="module")
def staged(cluster: Cluster) -> Iterator[Staged]:
    """Prometheus scraping the cluster, and everything the module docstring lists staged; all undone after."""
    if binary() is None:
        missing = "prometheus (Debian: apt-get install prometheus; scripts/bootstrap installs it as root)"
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(f"{REQUIRED_ENV}=1 but {missing} is missing", pytrace=False)
        pytest.skip(f"{missing} is missing")
    assert cluster.cp is not None and cluster.cp.pki is not None
    core, ca = cluster.core, cluster.cp.pki.ca_crt
    with ExitStack() as undo:  # undone in reverse, whatever failed
        cluster.start_metrics_api()
        undo.callback(cluster.stop_metrics_api)
        cluster.add_fake_node(FULL_NODE, gpus("dash", 1), pool=POOL)
        undo.callback(core.delete_node, FULL_NODE)
        targets = [
            Target(EXTENDER_JOB, f"127.0.0.1:{cluster.extender_public_port}"),
            Target(EXTENDER_JOB, f"127.0.0.1:{free_port()}"),  # a crashed extender pod
            Target(WEBHOOK_JOB, f"127.0.0.1:{cluster.webhook_port}", ca=ca),
            Target(PLUGIN_JOB, f"127.0.0.1:{cluster.plugin_metrics_port}", {"node": REAL_NODE}),
            Target(PLUGIN_JOB, f"127.0.0.1:{free_port()}", {"node": CRASHED_PLUGIN_NODE}),
            Target(
                METRICS_API_JOB,
                f"{cluster.metrics_api_address}:{cluster.metrics_api_port}",
                ca=ca,
                server_name=metrics_api_server_name(),
            ),
        ]
        prometheus = Prometheus(cluster.root / "prometheus", targets)
        undo.callback(prometheus.stop)
        # Scraped once before anything happens, so every counter's first increment is a rate.
        eventually("every target scraped", lambda: len(prometheus.query("up")["data"]["result"]) == len(targets), 20)

        ns = cluster.namespace(NAMESPACE)
        undo.callback(emptied, core, NAMESPACE)
        core.create_namespaced_pod(ns, gpu_pod("busy", SHARE))
        core.create_namespaced_pod(ns, gpu_pod("full", FULL))
        core.create_namespaced_pod(ns, gpu_pod("waiting", ABSENT_MODEL))
        busy = wait_running(core, ns, "busy")
        wait_bound(core, ns, "full")
        (grant,) = allocation_of(busy).gpus
        faulty = next(g.uuid for g in cluster.gpus if g.uuid != grant.uuid)
        script = [
            # At 40 % of the SMs, past the 7 % its 20 TFLOPS limit gives HAMi-core: reported (compute).
            {"pod": busy.metadata.uid, "container": "main", "gpu": grant.uuid, "smPercent": 40, "vramMiB": 512},
            {"pod": "no-such-pod", "container": "main", "gpu": grant.uuid, "smPercent": 1, "vramMiB": 64},
            # A second process of it past the pod's 2Gi VRAM limit: the device plugin kills it, and counts it.
            {"pod": busy.metadata.uid, "container": "main", "gpu": grant.uuid, "smPercent": 0, "vramMiB": 4096},
        ]
        doc = yaml.safe_load(fake_nvml_yaml(cluster.gpus, {faulty: "fell off the bus (e2e)"}, usage=script))
        for gpu in doc["gpus"]:
            gpu |= {"utilization": 40, "memoryUsedMiB": 1024, "temperature": 45, "powerWatts": 120.5}
        assert cluster.node is not None
        cluster.node.set_toolkit(guarded=False)
        undo.callback(cluster.node.set_toolkit, guarded=True)
        undo.callback(eventually, "every GPU healthy again", lambda: not unhealthy(cluster), HEALTHY_AGAIN_S)
        undo.callback(cluster.set_gpu_faults, {})
        cluster.write_fake_nvml(yaml.safe_dump(doc, sort_keys=False))

        # A tenant rewriting its own limits, as its container can on the path it sees; the plugin puts it back.
        limits = cluster.live_limits_dir / busy.metadata.uid / "main" / LIVE_LIMITS_FILE
        kept = limits.read_text()
        rewrite_as_tenant(limits, "{not json")
        eventually("the tampered limits put back", lambda: limits.read_text() == kept, 10)

        # Errors that keep coming: the counter's series appears with the first (no rate can see that one).
        refused = f'tf_device_plugin_errors_total{{where="allocate", node="{REAL_NODE}"}}'
        for i, name in enumerate(("bound-by-hand-0", "bound-by-hand-1")):
            core.create_namespaced_pod(ns, gpu_pod(name, ABSENT_MODEL))
            bind_by_hand(core, ns, name, REAL_NODE)
            if i == 0:
                eventually(
                    "the first refused Allocate scraped", lambda: prometheus.query(refused)["data"]["result"], 30
                )
        malformed_prioritize(cluster)
        counted = 'tf_extender_errors_total{verb="prioritize", kind="invalid-body"}'
        eventually("the first error scraped", lambda: prometheus.query(counted)["data"]["result"], 10)
        malformed_prioritize(cluster)
        yield Staged(faulty, prometheus)


def malformed_prioritize(cluster: Cluster) -> None:
    """A prioritize call whose body is not one: the verb's neutral answer, and one error counted."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.extender_verbs_port}{EXTENDER_PREFIX}/prioritize",
        data=b'{"NodeNames": 7}',
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def unhealthy(cluster: Cluster) -> list[str]:
    """The plugin's ``tf_gpu_healthy`` lines of /metrics that say 0."""
    lines = cluster.plugin_get("/metrics").splitlines()
    return [line for line in lines if line.startswith("tf_gpu_healthy{") and line.endswith(" 0.0")]


def panel_queries() -> list[tuple[str, str]]:
    """(panel title and target, query as viewed) for every target of every panel, then every variable."""
    board = dashboard()
    queries = [
        (f"{p['title']} [{t['refId']}]", as_viewed(t["expr"])) for p in board["panels"] for t in p.get("targets", ())
    ]
    variables = [v for v in board["templating"]["list"] if v["type"] == "query"]
    return queries + [(f"variable ${v['name']}", as_viewed(variable_query(v["query"]["query"]))) for v in variables]


def test_every_panel_and_variable_query_returns_series(staged: Staged) -> None:
    prometheus = staged.prometheus
    queries = panel_queries()
    assert len(queries) > 50
    answers: dict[str, dict[str, Any]] = {}

    def every_one_has_series() -> bool:
        for title, expr in queries:
            answers[title] = prometheus.query(expr)
        return all(a["status"] == "success" and a["data"]["result"] for a in answers.values())

    deadline = time.monotonic() + WITHIN_S
    while not every_one_has_series() and time.monotonic() < deadline:
        time.sleep(1)
    width = max(len(title) for title, _ in queries)
    print(f"\n{'PANEL [TARGET]':<{width}}  SERIES")
    for title, _ in queries:
        answer = answers[title]
        shown = len(answer["data"]["result"]) if answer["status"] == "success" else f"error: {answer['error']}"
        print(f"{title:<{width}}  {shown}")
    failed = {
        title: (expr, answers[title].get("error")) for title, expr in queries if answers[title]["status"] != "success"
    }
    assert failed == {}
    empty = [f"{title}: {expr}" for title, expr in queries if not answers[title]["data"]["result"]]
    assert empty == [], "panels whose query returns nothing"


def test_every_alert_is_loaded_healthy_and_pending_for_what_was_staged(staged: Staged) -> None:
    prometheus = staged.prometheus
    shipped = [r for g in yaml.safe_load((DEPLOY / "alerts" / "tensor-fusion.rules.yaml").read_text())["groups"]
               for r in g["rules"]]  # fmt: skip
    expected = {
        "TensorFusionGpuUnhealthy": {"node": REAL_NODE, "gpu": staged.faulty_gpu},
        "TensorFusionPoolTflopsNearlyFull": {"pool": POOL},
        "TensorFusionPoolVramNearlyFull": {"pool": POOL},
        "TensorFusionDevicePluginDown": {"node": CRASHED_PLUGIN_NODE},
        "TensorFusionDevicePluginMissing": {"node": FULL_NODE},
        "TensorFusionExtenderErrors": {"verb": "prioritize", "kind": "invalid-body"},
        "TensorFusionComponentDown": {"job": EXTENDER_JOB},
        "TensorFusionGpuNodeOpenToEnvvar": {"node": REAL_NODE, "state": "off"},
        "TensorFusionLiveLimitsTampered": {"node": REAL_NODE},
        "TensorFusionVramLimitExceeded": {"node": REAL_NODE, "outcome": "killed"},
        "TensorFusionComputeLimitExceeded": {"node": REAL_NODE},
        "TensorFusionDevicePluginErrors": {"node": REAL_NODE, "where": "allocate"},
    }
    quiet = {"TensorFusionAllocationConflicts"}  # nothing staged conflicts
    assert set(expected) | quiet == {r["alert"] for r in shipped}

    def active(rule: dict[str, Any]) -> bool:
        want = expected.get(rule["name"])
        return want is not None and any(want.items() <= a["labels"].items() for a in rule["alerts"])

    def all_staged_alerts_active() -> list[dict[str, Any]] | None:
        loaded = prometheus.rules()
        return loaded if sum(map(active, loaded)) == len(expected) else None

    try:
        loaded = eventually("every staged alert pending", all_staged_alerts_active, WITHIN_S, 1)
    except AssertionError:
        loaded = prometheus.rules()
    by_name = {r["name"]: r for r in loaded}
    assert set(by_name) == {r["alert"] for r in shipped}
    for rule in shipped:
        name = rule["alert"]
        got = by_name[name]
        assert (got["health"], got.get("lastError", "")) == ("ok", ""), name
        signal = without_threshold(rule["expr"])
        answer = prometheus.query(signal)
        assert answer["status"] == "success" and answer["data"]["result"], (name, signal, answer)
        print(
            f"{name}: {got['state']}, {len(got['alerts'])} alerts; signal {signal!r}: {len(answer['data']['result'])} series"
        )
        if name in quiet:
            assert got["state"] == "inactive", (name, got["alerts"])
        else:
            assert active(got), (name, expected[name], [a["labels"] for a in got["alerts"]])
            assert got["state"] in ("pending", "firing"), name
