"""The real gateway against local sockets: a stalled API server times out once, within the call's timeout,
and answers the bind path does not read still give their connection back to the pool."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from scheduler_extender.gateway import PodEvent
from scheduler_extender.kube.gateway import KubernetesGateway
from tests.local_api import kubeconfig
from tf_shell.kube.api import GatewayError, GatewayTimeout
from tf_shell.kube.client import api_client


def gateway_to(port: int, tmp_path: Path) -> KubernetesGateway:
    return KubernetesGateway(api_client(kubeconfig(port, tmp_path), pool_size=1))


@pytest.fixture
def stalled_port() -> Iterator[int]:
    """An API server stopped with SIGSTOP: the kernel completes connections, nobody ever answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("call", ["get", "patch", "bind"])
def test_a_stalled_api_server_times_out_once_within_the_calls_timeout(
    stalled_port: int, tmp_path: Path, call: str
) -> None:
    """urllib3 used to retry a read timeout three more times, so a 1 s GET took 4 s."""
    gateway = gateway_to(stalled_port, tmp_path)
    start = time.monotonic()
    with pytest.raises(GatewayTimeout, match=r"the API server did not answer within 0\.4s \(stalled\?\)"):
        if call == "get":
            gateway.get_pod("default", "p", timeout=0.4)
        elif call == "patch":
            gateway.patch_pod_annotations("default", "p", "u", {"a": "b"}, timeout=0.4)
        else:
            gateway.bind("default", "p", "u", "n1", timeout=0.4)
    assert time.monotonic() - start < 0.7


class _Pods(BaseHTTPRequestHandler):
    """Answers every PATCH and POST with a pod-sized JSON body, keeping the connection open."""

    protocol_version = "HTTP/1.1"
    connections: ClassVar[set[int]] = set()
    body = json.dumps({"kind": "Pod", "metadata": {"name": "p", "annotations": {"x": "y" * 4000}}}).encode()

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).connections.add(id(self.connection))
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_PATCH = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  (the base class's name)
        pass


def test_answers_the_bind_path_does_not_read_give_their_connection_back(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pods)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        gateway = gateway_to(server.server_address[1], tmp_path)
        for _ in range(5):
            gateway.patch_pod_annotations("default", "p", "u", {"a": "b"}, timeout=2)
            gateway.bind("default", "p", "u", "n1", timeout=2)
    finally:
        server.shutdown()
        server.server_close()
    assert len(_Pods.connections) == 1  # one pooled connection for all ten calls, none left checked out


class _Bindings(BaseHTTPRequestHandler):
    """Answers POST with 201, remembering each request's path and body."""

    posted: ClassVar[list[tuple[str, dict[str, object]]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        type(self).posted.append((self.path, body))
        answer = b'{"kind": "Status", "status": "Success"}'
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  (the base class's name)
        pass


def test_the_binding_carries_the_grant_and_its_preconditions(tmp_path: Path) -> None:
    """What the API server copies onto the pod with spec.nodeName, and the UID and resourceVersion it checks."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Bindings)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        gateway_to(server.server_address[1], tmp_path).bind(
            "team-a", "p", "u-1", "n1", annotations={"tensor-fusion.ai/allocation": "{}"},
            labels={"tensor-fusion.ai/allocated-node": "n1"}, resource_version="42", timeout=2,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    [(path, body)] = _Bindings.posted
    assert path == "/api/v1/namespaces/team-a/pods/p/binding"
    assert body["metadata"] == {
        "name": "p",
        "namespace": "team-a",
        "uid": "u-1",
        "resourceVersion": "42",
        "annotations": {"tensor-fusion.ai/allocation": "{}"},
        "labels": {"tensor-fusion.ai/allocated-node": "n1"},
    }
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}


def test_a_refused_connection_is_an_error_not_a_stall(tmp_path: Path) -> None:
    """Nothing listens: nothing was sent, so the outcome is known (urllib3 files it under connect timeouts)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    gateway = gateway_to(port, tmp_path)
    with pytest.raises(GatewayError) as failed:
        gateway.get_pod("default", "p", timeout=2.0)
    assert not isinstance(failed.value, GatewayTimeout)
    assert failed.value.status is None and "get pod default/p" in str(failed.value)


class _Leases(BaseHTTPRequestHandler):
    """Answers POST and PUT with the body sent, remembering each request's method, path and body; a PUT of
    lease "taken" is a 409."""

    written: ClassVar[list[tuple[str, str, dict[str, object]]]] = []

    def _answer(self, method: str) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).written.append((method, self.path, json.loads(raw)))
        status, answer = (
            (409, b'{"kind": "Status", "message": "the object has been modified"}')
            if (self.path.endswith("/taken"))
            else (200 if method == "PUT" else 201, raw)
        )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_POST(self) -> None:
        self._answer("POST")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  (the base class's name)
        pass


def test_leases_and_events_are_sent_as_written_a_whole_second_microtime_included(tmp_path: Path) -> None:
    """The client's own Lease methods parse the dict into their model and write a MicroTime of a whole second
    back as "…:54+00:00", which the API server refuses (it failed a two-extender e2e run once)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Leases)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    whole = "2026-11-27T17:45:54.000000Z"
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
            "spec": {"holderIdentity": "a", "renewTime": whole}}  # fmt: skip
    try:
        gateway = gateway_to(server.server_address[1], tmp_path)
        created = gateway.create_lease("ns", body, timeout=2)
        replaced = gateway.replace_lease("ns", "l", body, timeout=2)
        with pytest.raises(GatewayError) as conflict:
            gateway.replace_lease("ns", "taken", body, timeout=2)
        gateway.record_event(PodEvent(namespace="ns", pod_name="p", pod_uid="u-1", reason="GpuGranted", message="m"))
    finally:
        server.shutdown()
        server.server_close()
    assert created == replaced == body
    assert conflict.value.status == 409 and "the object has been modified" in str(conflict.value)
    *leases, (method, path, event) = _Leases.written
    assert [(m, p, b["spec"]) for m, p, b in leases] == [
        ("POST", "/apis/coordination.k8s.io/v1/namespaces/ns/leases", body["spec"]),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", body["spec"]),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/taken", body["spec"]),
    ]
    # the GpuGranted Event goes the same way (a hot path: the client's model round trip cost more than the call)
    assert (method, path, event["reason"], event["involvedObject"]["uid"]) == (
        "POST", "/api/v1/namespaces/ns/events", "GpuGranted", "u-1",
    )  # fmt: skip
    assert str(event["firstTimestamp"]).endswith("Z")  # as event_body wrote it, not re-serialised
