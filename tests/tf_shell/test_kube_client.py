"""The one error rule of every Kubernetes call: API errors keep their status, 410 is Gone, no answer in time is a
timeout, any other transport failure is a plain error naming the call."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError, ReadTimeoutError

from tf_shell.kube.api import GatewayError, GatewayTimeout, GoneError
from tf_shell.kube.client import api_client, call, send, throttle_credential_refresh


def failing(exc: Exception) -> object:
    def fn() -> object:
        raise exc

    return fn


def test_an_api_error_keeps_its_status_and_the_servers_message() -> None:
    exc = ApiException(status=403, reason="Forbidden")
    exc.body = '{"message": "pods is forbidden"}'
    with pytest.raises(GatewayError, match=r"^list pods: HTTP 403 Forbidden: pods is forbidden$") as failed:
        call("list pods", failing(exc))  # type: ignore[arg-type]
    assert failed.value.status == 403


def test_410_is_gone() -> None:
    with pytest.raises(GoneError) as failed:
        call("watch pods", failing(ApiException(status=410, reason="Gone")))  # type: ignore[arg-type]
    assert failed.value.status == 410


def test_no_answer_in_time_is_a_timeout_naming_the_limit() -> None:
    stalled = MaxRetryError(None, "/api", ReadTimeoutError(None, "/api", "read timed out"))  # type: ignore[arg-type]
    with pytest.raises(GatewayTimeout, match=r"get pod a/b: the API server did not answer within 1s to connect"):
        call("get pod a/b", failing(stalled), (1.0, 3.0))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "exc",
    [
        MaxRetryError(None, "/api", NewConnectionError(None, "Connection refused")),  # type: ignore[arg-type]
        ProtocolError("Connection aborted."),
        ConnectionResetError("reset by peer"),
    ],
    ids=["refused", "aborted", "reset"],
)
def test_other_transport_failures_are_plain_errors_without_a_status(exc: Exception) -> None:
    with pytest.raises(GatewayError, match=r"^get node n1: ") as failed:
        call("get node n1", failing(exc))  # type: ignore[arg-type]
    assert not isinstance(failed.value, GatewayTimeout) and failed.value.status is None


def test_the_credential_refresh_runs_at_most_once_a_second_and_first_at_the_first_call() -> None:
    now = [100.0]
    runs: list[str] = []
    configuration = Configuration()

    def refresh(config: Configuration) -> None:  # as the client's loaders do: each run installs a new hook
        runs.append(config.api_key.get("BearerToken", ""))
        config.refresh_api_key_hook = refresh  # type: ignore[assignment]  # the stubs type the hook as None

    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]
    throttle_credential_refresh(configuration, 1.0, clock=lambda: now[0])
    for _ in range(3):
        configuration.get_api_key_with_prefix("BearerToken")
    now[0] += 0.99
    configuration.get_api_key_with_prefix("BearerToken")
    assert runs == [""]
    configuration.api_key["BearerToken"] = "later"
    now[0] += 0.01
    configuration.get_api_key_with_prefix("BearerToken")
    configuration.get_api_key_with_prefix("BearerToken")
    assert runs == ["", "later"]


def test_a_client_from_a_kubeconfig_token_keeps_its_credential_and_refreshes_it_throttled(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: secret}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
    )
    configuration = api_client(str(kubeconfig)).configuration
    assert configuration.auth_settings()["BearerToken"]["value"] == "Bearer secret"
    configuration.api_key["BearerToken"] = "gone"  # what a refresh inside the second would have restored
    assert configuration.auth_settings()["BearerToken"]["value"] == "gone"


class _Recording(BaseHTTPRequestHandler):
    """Answers each request with the status and body queued on the server; records what it got."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def do_PUT(self) -> None:
        got = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append((self.command, self.path, dict(self.headers), got))
        status, answer = self.server.answers.pop(0)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *_: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    seen: list[tuple[str, str, dict[str, str], bytes]]
    answers: list[tuple[int, bytes]]


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Recording)
    srv.seen, srv.answers = [], []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_send_writes_the_body_as_given_with_the_credential_and_returns_the_answer(server: _Server) -> None:
    configuration = Configuration(host=f"http://127.0.0.1:{server.server_port}")
    configuration.api_key["BearerToken"] = "Bearer secret"
    api = ApiClient(configuration)
    lease = {"metadata": {"name": "l", "annotations": {"a": "ü"}}, "spec": {"renewTime": "2026-11-27T22:00:54.000001Z"}}
    server.answers += [
        (200, b'{"metadata": {"resourceVersion": "7"}}'),
        (409, b'{"message": "the object has been modified"}'),
    ]
    path = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"
    assert send(api, "PUT", path, lease, "update lease ns/l", (1.0, 2.0)) == {"metadata": {"resourceVersion": "7"}}
    method, seen_path, headers, body = server.seen[0]
    assert (method, seen_path, json.loads(body)) == ("PUT", path, lease)  # the MicroTime's fraction kept
    assert headers["authorization"] == "Bearer secret" and headers["Content-Type"] == "application/json"
    with pytest.raises(GatewayError) as refused:
        send(api, "PUT", path, lease, "update lease ns/l", (1.0, 2.0))
    assert refused.value.status == 409 and "update lease ns/l: HTTP 409" in str(refused.value)
    assert "the object has been modified" in str(refused.value)
    api.close()
