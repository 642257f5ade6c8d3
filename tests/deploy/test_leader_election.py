"""kube-scheduler's leader election fails a crashed leader over within 15 s (issue 12): the chart renders
the durations of ``scheduler.leaderElection`` into its KubeSchedulerConfiguration, and refuses — with a
message naming the values — what kube-scheduler's leader elector would refuse to start with
(client-go's NewLeaderElector: renewDeadline < leaseDuration and renewDeadline > 1.2 x retryPeriod).
tests/e2e/test_failover.py runs two replicas with these durations and measures the failover."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_bind_timeout import seconds
from tests.deploy.test_chart import chart_scheduler_config, one, render
from tests.deploy.test_chart_install import VALUES
from vgpu.names import SCHEDULER_NAME

JITTER = 1.2  # client-go's leaderelection.JitterFactor: a standby polls every retryPeriod x [1, 1 + 1.2)
DURATIONS = ("leaseDuration", "renewDeadline", "retryPeriod")


def election(config: dict[str, Any]) -> tuple[float, float, float]:
    """(leaseDuration, renewDeadline, retryPeriod) in seconds."""
    lease, renew, retry = (seconds(config["leaderElection"][k]) for k in DURATIONS)
    return lease, renew, retry


def test_the_shipped_election_takes_a_crashed_leaders_lease_over_within_15_s() -> None:
    config = chart_scheduler_config()
    namespace = one("ConfigMap", "scheduler-config")["metadata"]["namespace"]
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceName": SCHEDULER_NAME,
        "resourceNamespace": namespace,
        "leaseDuration": "8s",
        "renewDeadline": "6s",
        "retryPeriod": "1s",
    }
    given = VALUES["scheduler"]["leaderElection"]
    lease, renew, retry = election(config)
    assert (lease, renew, retry) == (
        given["leaseDurationSeconds"],
        given["renewDeadlineSeconds"],
        given["retryPeriodSeconds"],
    )
    # The standby polls every retryPeriod x [1, 1 + JITTER): up to one gap to see the leader's last renewal,
    # leaseDuration, up to one more gap to poll again: the worst case, with time left for the first bind.
    assert lease + 2 * (1 + JITTER) * retry <= 12.5
    assert JITTER * retry < renew < lease  # kube-scheduler starts with them


def test_the_chart_renders_the_durations_it_is_given(tmp_path: Path) -> None:
    values = {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20, "retryPeriodSeconds": 4}
    docs = render({"scheduler": {"leaderElection": values}}, tmp_path)
    (config_map,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-scheduler-config")
    ]
    assert election(yaml.safe_load(config_map["data"]["config.yaml"])) == (30, 20, 4)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"renewDeadlineSeconds": 8},
            "scheduler.leaderElection.renewDeadlineSeconds (8) must be below "
            "scheduler.leaderElection.leaseDurationSeconds (8)",
        ),
        (
            {"retryPeriodSeconds": 5},
            "scheduler.leaderElection.renewDeadlineSeconds (6) must be above 1.2 x "
            "scheduler.leaderElection.retryPeriodSeconds (5)",
        ),
        ({"retryPeriodSeconds": 1.5}, "at '/scheduler/leaderElection/retryPeriodSeconds': got number, want integer"),
        ({"leaseDurationSeconds": 0}, "at '/scheduler/leaderElection/leaseDurationSeconds': minimum: got 0, want 1"),
        ({"leaseDuration": 10}, "at '/scheduler/leaderElection': additional properties 'leaseDuration' not allowed"),
    ],
)
def test_the_chart_refuses_durations_kube_scheduler_would_not_start_with(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failed:
        render({"scheduler": {"leaderElection": values}}, tmp_path)
    assert message in failed.value.stderr
