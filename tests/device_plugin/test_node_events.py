"""The plugin's Events reach the API server through a stall: a post it did not take is tried again under the
same name, a try that landed unanswered is not posted twice, a refusal or the last try gives up (counted), and
shutdown stops the tries at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from device_plugin.cluster.node_events import REASON_VRAM_OVERUSE, RETRY_AFTER_S, NodeEvents
from device_plugin.metrics import PluginMetrics
from tests.device_plugin.fakes import FakeKube

QUICK = (0.01,) * len(RETRY_AFTER_S)


def failed(metrics: PluginMetrics, where: str) -> float:
    return metrics.registry.get_sample_value("tf_device_plugin_errors_total", {"where": where}) or 0.0


def posted(answers: list[str]) -> tuple[FakeKube, PluginMetrics]:
    """One overuse Event (on the pod and the node) posted with the API server answering ``answers`` in turn."""
    kube, metrics = FakeKube(), PluginMetrics()
    kube.event_answers = list(answers)

    async def scenario() -> None:
        events = NodeEvents(kube, "node-a", metrics, retry_after_s=QUICK)
        events.vram_overuse("team-a", "p", "uid-p", "held too much")
        await events.drain()

    asyncio.run(scenario())
    return kube, metrics


@pytest.mark.parametrize(
    "answers",
    [
        pytest.param(["timeout", "timeout", "busy", "busy"], id="stalled-then-back"),
        pytest.param(["lost", "lost"], id="both-landed-unanswered"),
        pytest.param(["lost", "timeout", "ok", "timeout"], id="mixed"),
    ],
)
def test_an_event_the_api_server_did_not_take_is_posted_once_when_it_comes_back(answers: list[str]) -> None:
    kube, metrics = posted(answers)
    assert [(n, reason, m) for n, reason, m, _ in kube.node_events] == [
        ("node-a", REASON_VRAM_OVERUSE, "held too much")
    ]
    assert [(ns, name, reason) for ns, name, _, reason, _, _ in kube.pod_events] == [
        ("team-a", "p", REASON_VRAM_OVERUSE)
    ]
    assert kube.event_answers == [] and (failed(metrics, "node_event"), failed(metrics, "pod_event")) == (0.0, 0.0)


def test_a_refused_event_is_given_up_at_once_and_counted() -> None:
    kube, metrics = posted(["forbidden", "forbidden", "ok"])
    assert (kube.node_events, kube.pod_events) == ([], [])
    assert kube.event_answers == ["ok"]  # no second try of either
    assert (failed(metrics, "node_event"), failed(metrics, "pod_event")) == (1.0, 1.0)


def test_an_event_still_not_taken_after_its_last_try_is_given_up_and_counted() -> None:
    tries = 2 * (len(RETRY_AFTER_S) + 1)
    kube, metrics = posted(["timeout"] * tries + ["ok"])
    assert (kube.node_events, kube.pod_events) == ([], [])
    assert kube.event_answers == ["ok"]
    assert (failed(metrics, "node_event"), failed(metrics, "pod_event")) == (1.0, 1.0)


def test_closing_stops_the_tries_without_waiting_them_out() -> None:
    kube, metrics = FakeKube(), PluginMetrics()
    kube.event_answers = ["timeout"] * 10

    async def scenario() -> float:
        events = NodeEvents(kube, "node-a", metrics, retry_after_s=(60.0,))
        events.node_warning("Something", "m")
        await asyncio.sleep(0.2)  # the first try failed; the next waits 60 s
        started = time.monotonic()
        await events.close()
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 5
    assert kube.node_events == [] and failed(metrics, "node_event") == 1.0
