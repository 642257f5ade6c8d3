"""Reservations made by filter/prioritize are released when their TTL is up, with no request to trigger it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from scheduler_extender.app import build
from scheduler_extender.gateway import Kind
from scheduler_extender.settings import Settings
from scheduler_extender.sweeper import SWEEP_INTERVAL, reservation_sweeper
from scheduler_extender.wire import ExtenderArgs
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod


def test_sweeper_releases_a_reservation_once_its_ttl_is_up_by_the_caches_clock(fake: FakeGateway) -> None:
    now = [1000.0]
    ext = build(Settings(reservation_ttl=30), fake, clock=lambda: now[0])
    pod = make_pod("p1", gpu_request(vram=4 * GI))
    ext.cache.replace(Kind.NODE, [make_node("n1")])
    ext.cache.replace(Kind.POD, [pod])
    ext.verbs.prioritize(ExtenderArgs.model_validate({"Pod": pod, "Nodes": None, "NodeNames": ["n1"]}))
    assert ext.cache.tentative_count() == 1  # expires at 1030
    sweeper = reservation_sweeper(ext.cache, interval=0.01)
    sweeper.start()
    try:
        now[0] = 1029.99
        time.sleep(0.1)  # ten sweeps, all before the TTL
        assert ext.cache.tentative_count() == 1 and ext.cache.entry("default/p1") is not None
        now[0] = 1030.0
        wait_for(lambda: ext.cache.tentative_count() == 0, timeout=1.0, what="the sweeper to release the reservation")
        assert ext.cache.entries() == {}
        assert sum(g.vram_used for g in ext.cache.node("n1").gpus) == 0  # type: ignore[union-attr]
    finally:
        sweeper.stop()


def reservations(app: Running) -> float:
    text = app.client.get("/metrics").text
    found = re.search(r"^tf_extender_reservations (\S+)$", text, re.M)
    assert found is not None
    return float(found.group(1))


def test_reservations_gauge_falls_when_the_ttl_is_up_without_another_filter(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    """A reservation that no bind claims used to wait for the next filter call to be expired (150 s past a
    30 s TTL was seen); now it goes within SWEEP_INTERVAL of its TTL, and the gauge with it."""
    fake.put(Kind.NODE, make_node("n1", gpus=2, vram=16 * GI, tflops=100_000))
    pod = make_pod("p1", gpu_request(tflops=30_000, vram=6 * GI))
    fake.put(Kind.POD, pod)
    ttl = 0.4
    app = run(reservation_ttl=ttl)
    made = time.monotonic()
    app.post("/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": ["n1"]})
    assert reservations(app) == 1.0
    wait_for(lambda: reservations(app) == 0.0, timeout=ttl + 2, what="the reservation to expire")
    late = time.monotonic() - made - ttl
    assert late < SWEEP_INTERVAL + 0.3, f"released {late:.2f}s after its TTL"
    assert app.ext.cache.entries() == {}
