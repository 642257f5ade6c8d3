"""tf-extender's two listeners: the verbs on loopback, the read-only routes on their own port, which
serves no verb, from one process and one extender."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
import uvloop
from pydantic import ValidationError

from scheduler_extender.app import create_app
from scheduler_extender.gateway import Kind
from scheduler_extender.main import listeners, serve, settings_from
from scheduler_extender.settings import Settings
from tests.scheduler_extender.conftest import wait_for
from tests.scheduler_extender.fakes import FakeGateway, gpu_request, make_node, make_pod
from vgpu.names import EXTENDER_PUBLIC_PORT, EXTENDER_VERBS_PORT

VERBS = ("filter", "prioritize", "bind", "preempt")


def test_the_verbs_listen_on_loopback_and_the_read_only_routes_everywhere_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = settings_from([])
    assert (default.verbs_address, default.verbs_port) == ("127.0.0.1", EXTENDER_VERBS_PORT)
    assert (default.public_address, default.public_port) == ("0.0.0.0", EXTENDER_PUBLIC_PORT)
    monkeypatch.setenv("TF_EXTENDER_PUBLIC_PORT", "9000")
    given = settings_from(["--verbs-address=::1", "--verbs-port=7000", "--public-address=10.0.0.5"])
    assert (given.verbs_address, given.verbs_port, given.public_address, given.public_port) == (
        "::1",
        7000,
        "10.0.0.5",
        9000,
    )


def test_one_port_for_both_listeners_is_refused() -> None:
    with pytest.raises(ValidationError, match="verbs_port and public_port are both 8081"):
        Settings(verbs_port=8081)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def served() -> Iterator[tuple[str, str, FakeGateway, tuple[uvicorn.Server, uvicorn.Server]]]:
    """tf-extender's servers over a fake API server, run as main runs them (on a thread: no signals)."""
    fake = FakeGateway()
    fake.put(Kind.NODE, make_node("n1"))
    fake.put(Kind.POD, make_pod("p", gpu_request()))
    settings = Settings(verbs_port=free_port(), public_port=free_port(), public_address="127.0.0.1")
    servers = listeners(settings, create_app(settings, fake))
    thread = threading.Thread(target=uvloop.run, args=(serve(servers),), daemon=True)
    thread.start()
    verbs, public = f"http://127.0.0.1:{settings.verbs_port}", f"http://127.0.0.1:{settings.public_port}"
    wait_for(lambda: all(s.started for s in servers), what="both listeners")
    wait_for(lambda: httpx.get(f"{public}/readyz").status_code == 200, what="the extender to sync")
    try:
        yield verbs, public, fake, servers
    finally:
        for server in servers:
            server.should_exit = True
        thread.join(timeout=10)
        fake.close()


def test_the_public_listener_serves_the_read_only_routes_and_no_verb(
    served: tuple[str, str, FakeGateway, tuple[uvicorn.Server, uvicorn.Server]],
) -> None:
    verbs, public, fake, _ = served
    bind = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-default-p", "Node": "n1"}
    for verb in VERBS:
        assert httpx.post(f"{public}/{verb}", json=bind).status_code in (404, 405), verb
    assert not [c for c in fake.calls if c.startswith("bind")]
    assert httpx.get(f"{public}/healthz").json() == {"status": "ok"}
    assert "tf_extender_binds_total" in httpx.get(f"{public}/metrics").text
    assert httpx.get(f"{public}/explain/default/p").json()["pod"] == "default/p"
    # The verbs listener is the one kube-scheduler calls: the same bind works there.
    assert httpx.post(f"{verbs}/bind", json=bind, timeout=10).json() == {"Error": ""}
    assert "bind default/p n1" in fake.calls
    assert 'tf_extender_binds_total{result="bound"} 1.0' in httpx.get(f"{public}/metrics").text


def test_when_one_listener_stops_the_other_stops_too(
    served: tuple[str, str, FakeGateway, tuple[uvicorn.Server, uvicorn.Server]],
) -> None:
    verbs, _, _, (verbs_server, public_server) = served
    public_server.should_exit = True
    wait_for(lambda: verbs_server.should_exit, what="the verbs listener to be told to stop")
    port = int(verbs.rsplit(":", 1)[1])
    wait_for(lambda: not listening(port), what="the verbs port to close")


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_an_idle_connection_stays_open_for_the_clients_own_idle_timeout(
    served: tuple[str, str, FakeGateway, tuple[uvicorn.Server, uvicorn.Server]],
) -> None:
    """kube-scheduler reuses an idle connection for up to 90 s (Go's IdleConnTimeout) and does not retry a POST
    that meets EOF: uvicorn's default 5 s keep-alive closed connections it was about to reuse."""
    verbs, _, _, servers = served
    assert all(s.config.timeout_keep_alive >= 90 for s in servers)
    with httpx.Client(base_url=verbs, limits=httpx.Limits(keepalive_expiry=60)) as client:  # httpx's own: 5 s
        first = client.get("/healthz")
        sockets = {first.extensions["network_stream"].get_extra_info("socket").getsockname()}
        time.sleep(6)  # past uvicorn's default keep-alive
        again = client.get("/healthz")
        sockets.add(again.extensions["network_stream"].get_extra_info("socket").getsockname())
    assert (first.status_code, again.status_code, len(sockets)) == (200, 200, 1)  # one connection, still open
