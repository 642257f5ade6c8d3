"""A real Prometheus scraping the e2e cluster's binaries, with the shipped alert rules loaded, and its HTTP API.

WHY: a dashboard panel or an alert is only as good as its query against the series the binaries really
export, with the labels a real scrape gives them; a query that parses and returns nothing is a broken
panel. So the tier runs Debian's ``prometheus`` itself (``scripts/bootstrap`` installs it), scraping
every second what the chart's ServiceMonitors scrape in a cluster — the extender's read-only port, the
webhook and tf-metrics over HTTPS verified with the cluster CA, the kubelet node's device plugin — with
``honor_labels`` and the same ``job`` names, and a device plugin's target labelled with its node, as the
ServiceMonitors' relabelings do. Extra targets that never answer stand for a crashed plugin or extender
pod, which is what such a pod is to Prometheus. It listens on loopback, keeps its data in the cluster's
temporary directory, and evaluates the rules every second.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .deploy import DEPLOY, service
from .procs import Proc, free_port, http_ok, wait_until

RULES = DEPLOY / "alerts" / "tensor-fusion.rules.yaml"
INTERVAL = "1s"  # scrape and rule evaluation
# The jobs the chart's ServiceMonitors set (templates/servicemonitor.yaml); the rules name them.
EXTENDER_JOB = "tensor-fusion-extender"
WEBHOOK_JOB = "tensor-fusion-webhook"
PLUGIN_JOB = "tensor-fusion-device-plugin"
METRICS_API_JOB = "tensor-fusion-metrics-api"


def binary() -> str | None:
    """The ``prometheus`` executable, None where it is not installed."""
    return shutil.which("prometheus")


@dataclass(frozen=True, slots=True)
class Target:
    """One scrape target: ``job``, ``address`` (host:port), and how to reach it."""

    job: str
    address: str
    labels: dict[str, str] = field(default_factory=dict)
    ca: Path | None = None  # HTTPS, verified with this CA
    server_name: str | None = None  # the name the certificate is checked for, when not the address's


def scrape_config(targets: list[Target]) -> dict[str, Any]:
    """``prometheus.yml``: every target scraped each :data:`INTERVAL` with ``honor_labels``, the shipped rules."""
    jobs: dict[str, dict[str, Any]] = {}
    for t in targets:
        tls = {"ca_file": str(t.ca)} | ({"server_name": t.server_name} if t.server_name else {})
        job = jobs.setdefault(
            t.job,
            {"job_name": t.job, "honor_labels": True, "static_configs": []}
            | ({"scheme": "https", "tls_config": tls} if t.ca else {}),
        )
        job["static_configs"].append({"targets": [t.address], "labels": t.labels})
    return {
        "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(RULES)],
        "scrape_configs": list(jobs.values()),
    }


def metrics_api_server_name() -> str:
    """The host tf-metrics' certificate names: its shipped Service's, as the chart's ServiceMonitor checks it."""
    meta = service("-metrics-api")["metadata"]
    return f"{meta['name']}.{meta['namespace']}.svc"


class Prometheus:
    """``prometheus`` on a free loopback port with ``targets``; :meth:`stop` ends it."""

    def __init__(self, root: Path, targets: list[Target]) -> None:
        found = binary()
        assert found is not None, "prometheus is not installed"
        root.mkdir(parents=True, exist_ok=True)
        config = root / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(targets), sort_keys=False), encoding="utf-8")
        self.url = f"http://127.0.0.1:{free_port()}"
        argv = [
            found,
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address={self.url.removeprefix('http://')}",
        ]
        self.proc = Proc("prometheus", argv, root / "prometheus.log").start()
        wait_until("prometheus ready", lambda: http_ok(f"{self.url}/-/ready"), 30, [self.proc])

    def stop(self) -> None:
        self.proc.stop()

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """``GET /api/v1/<path>``'s JSON, errors (a bad query's 400) included."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body: dict[str, Any] = json.load(answer)
        except urllib.error.HTTPError as failed:
            with failed:
                body = json.load(failed)
        return body

    def query(self, expr: str) -> dict[str, Any]:
        """An instant query: ``status`` ("success" or "error"), ``data.result`` or ``error``."""
        return self.api("query", query=expr)

    def rules(self) -> list[dict[str, Any]]:
        """Every rule loaded, with its ``health``, ``lastError``, ``state`` and active ``alerts``."""
        return [r for g in self.api("rules")["data"]["groups"] for r in g["rules"]]
