"""Over real TLS, as tf-metrics serves (uvicorn, its server context, the peer protocol): the front proxy's
certificate is what makes the user headers count; without a certificate only health answers; a
certificate of another CA is refused by TLS itself."""

from __future__ import annotations

import shutil
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from tests.e2e.pki import Pki, make_pki
from tests.scheduler_extender.conftest import wait_for
from tests.tf_metrics.test_app import ALICE, FakeCluster
from tests.tf_metrics.test_auth import PUBLISHED
from tests.vgpu.usage_builders import T0, node_usage, samples_of, used
from tf_metrics.app import create_app
from tf_metrics.auth import front_proxy
from tf_metrics.main import server_context, serving

PATH = "/apis/custom.metrics.k8s.io/v1beta1/namespaces/team-a/pods/*/gpu_tflops"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("openssl(1) makes the test certificates")
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def url(pki: Pki) -> Iterator[str]:
    proxy = front_proxy({**PUBLISHED, "requestheader-client-ca-file": pki.front_proxy_ca.read_text()})
    snapshot = samples_of(node_usage("n1", used("trainer", tflops=10_000)))
    app = create_app(proxy=proxy, samples=lambda: snapshot, cluster=FakeCluster(), ready=lambda: True,
                     registry=CollectorRegistry(), clock=lambda: T0 + 1)  # fmt: skip
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cert, key = pki.serving_pair("apiserver")
    server = uvicorn.Server(serving(app, "127.0.0.1", port, server_context(cert, key, proxy.client_ca), "warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, what="uvicorn to start")
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def client(pki: Pki, pair: tuple[Path, Path] | None) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(pki.ca_crt))
    if pair is not None:
        context.load_cert_chain(*pair)
    return httpx.Client(verify=context, timeout=10)


def test_the_front_proxy_certificate_makes_the_headers_count(pki: Pki, url: str) -> None:
    with client(pki, pki.front_proxy_client) as http:
        reply = http.get(url + PATH, headers=ALICE)
    assert reply.status_code == 200, reply.text
    assert [i["value"] for i in reply.json()["items"]] == ["10"]


def test_without_a_certificate_the_headers_count_for_nothing_but_health_answers(pki: Pki, url: str) -> None:
    with client(pki, None) as http:
        reply = http.get(url + PATH, headers={**ALICE, "X-Remote-Group": "system:masters"})
        assert reply.status_code == 401 and reply.json()["reason"] == "Unauthorized"
        assert http.get(url + "/readyz").status_code == 200


def test_a_certificate_of_another_ca_is_refused_by_tls_before_any_request_is_read(pki: Pki, url: str) -> None:
    # TLS 1.3: the client learns of the refusal on its first read, as a closed connection.
    with client(pki, pki.serving_pair("webhook")) as http, pytest.raises(httpx.TransportError):
        http.get(url + PATH, headers=ALICE)
