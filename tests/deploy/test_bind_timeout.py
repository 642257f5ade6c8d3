"""The extender answers every bind within --bind-timeout, below kube-scheduler's extender httpTimeout: the
chart derives both from its values and refuses to render a bind timeout that is not below the other."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scheduler_extender.main import settings_from as extender_settings
from scheduler_extender.settings import Settings
from tests.deploy.test_chart import (
    WORKLOADS,
    chart_scheduler_config,
    container,
    objects,
    pod_spec,
    render,
    standalone_scheduler_config,
)


def seconds(duration: str) -> float:
    assert duration.endswith("s"), duration
    return float(duration[:-1])


def test_the_shipped_bind_timeout_is_below_the_schedulers_http_timeout() -> None:
    kind, workload, name = WORKLOADS[0]
    shipped = extender_settings(container(pod_spec(objects(), kind, workload), name)["args"])
    (chart,) = chart_scheduler_config()["extenders"]
    (alone,) = standalone_scheduler_config()["extenders"]
    assert shipped.bind_timeout == Settings().bind_timeout == 6.0  # the standalone config relies on the default
    assert shipped.bind_timeout < seconds(chart["httpTimeout"]) == seconds(alone["httpTimeout"]) == 10.0


def test_the_chart_refuses_a_bind_timeout_not_below_the_http_timeout(tmp_path: Path) -> None:
    too_long = {"scheduler": {"extender": {"bindTimeoutSeconds": 10, "httpTimeoutSeconds": 10}}}
    with pytest.raises(subprocess.CalledProcessError) as failed:
        render(too_long, tmp_path)
    assert (
        "scheduler.extender.bindTimeoutSeconds (10) must be below scheduler.extender.httpTimeoutSeconds (10)"
        in failed.value.stderr
    )
    longer = render({"scheduler": {"extender": {"bindTimeoutSeconds": 7.5, "httpTimeoutSeconds": 12}}}, tmp_path)
    kind, workload, name = WORKLOADS[0]
    assert extender_settings(container(pod_spec(longer, kind, workload), name)["args"]).bind_timeout == 7.5
    config_map = next(d for d in longer if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config"))
    assert "httpTimeout: 12s" in config_map["data"]["config.yaml"]
