"""A bind logs its pod, node and GPUs (in the JSON log format) and tells the user what was granted (an Event)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest

from scheduler_extender.gateway import Kind
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_bind import bind_body
from tf_shell.logfmt import JsonFormatter


def test_a_bind_logs_its_pod_node_and_gpus(
    run: Callable[..., Running], fake: FakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2, vram=16 * GI, tflops=100_000))
    fake.put(Kind.POD, make_pod("p1", gpu_request(tflops=30_000, vram=6 * GI)))
    app = run()
    with caplog.at_level(logging.INFO, logger="scheduler_extender.routes"):
        assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    (line,) = [json.loads(JsonFormatter().format(r)) for r in caplog.records if r.getMessage().startswith("bound")]
    assert (line["pod"], line["node"], len(line["gpus"])) == ("default/p1", "n1", 1)
    assert line["gpus"][0].startswith("GPU-n1-")


def test_a_bind_tells_the_user_what_was_granted(run: Callable[..., Running], fake: FakeGateway) -> None:
    fake.put(Kind.NODE, make_node("n1", gpus=2, vram=16 * GI, tflops=100_000))
    fake.put(Kind.POD, make_pod("p1", gpu_request(tflops=30_000, vram=6 * GI)))
    app = run()
    assert app.post("/bind", bind_body("p1", "n1")) == {"Error": ""}
    wait_for(lambda: fake.events, what="the GpuGranted event")
    (event,) = fake.events
    assert (event.type, event.reason, event.pod_name) == ("Normal", "GpuGranted", "p1")
    assert event.message.startswith("granted on node n1 (pool default-pool, qos medium): GPU-n1-")
    assert "30 TFLOPS / 6Gi reserved, limits 30 / 6Gi" in event.message
