"""The plugin's real Kubernetes adapter (device_plugin.cluster.kube) against a local HTTP server: every failure
is the shared taxonomy with its status, answers are the server's own JSON, the Event keeps its body, and a
410 during the pod watch makes the shared list–watch loop list again."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from device_plugin.cluster import kube
from device_plugin.cluster.kube import EVENT_COMPONENT, KubeApi
from device_plugin.cluster.pod_cache import NodePods
from tests.local_api import kubeconfig
from tf_shell.kube.api import GatewayError, GatewayTimeout, GoneError, RawObject, WatchEvent
from tf_shell.kube.client import api_client
from tf_shell.kube.list_watch import Informer


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any


@dataclass
class Answer:
    status: int = 200
    body: Any = None  # JSON; or, with ``lines``, the events of a watch stream
    lines: list[RawObject] = field(default_factory=list)


Script = Callable[[Request], Answer]


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection; a watch stream ends when the connection closes
    script: Script
    requests: list[Request]

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        url = urllib.parse.urlsplit(self.path)
        request = Request(
            self.command,
            url.path,
            dict(urllib.parse.parse_qsl(url.query)),
            self.headers.get("Content-Type"),
            json.loads(raw) if raw else None,
        )
        self.requests.append(request)
        answer = self.script(request)
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        if answer.lines:
            self.end_headers()
            for line in answer.lines:
                self.wfile.write(json.dumps(line).encode() + b"\n")
                self.wfile.flush()
            return
        body = json.dumps(answer.body if answer.body is not None else {}).encode()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = do_POST = _serve

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  (the base class's name)
        pass


@contextlib.contextmanager
def api_server(script: Script, tmp_path: Path) -> Iterator[tuple[KubeApi, list[Request]]]:
    """The real adapter talking to a local server that answers each request as ``script`` says."""
    requests: list[Request] = []
    handler = type("Handler", (_Handler,), {"script": staticmethod(script), "requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield KubeApi(api_client(kubeconfig(server.server_address[1], tmp_path))), requests
    finally:
        server.shutdown()
        server.server_close()


def _pod(name: str, rv: str) -> RawObject:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": rv}}


# --- failures: the shared taxonomy, with the HTTP status ---------------------------------------------


@pytest.mark.parametrize(
    ("call", "status", "reason", "what"),
    [
        (lambda api: api.get_node("n1"), 403, "Forbidden", "get node n1"),
        (lambda api: api.patch_pod_annotations("default", "p", {"a": "b"}), 404, "Not Found", "patch pod default/p"),
        (lambda api: api.patch_node("n1", {"l": "v"}, {"a": "b"}), 409, "Conflict", "patch node n1"),
        (lambda api: api.patch_node_resources("n1", {"r": "1"}), 422, "Unprocessable Entity", "patch node n1 status"),
        (lambda api: api.list_pods("n1"), 500, "Internal Server Error", "list pods on node n1"),
        (
            lambda api: api.record_node_event("n1", "GpuUnhealthy", "m", warning=True, key="k"),
            403,
            "Forbidden",
            "event on node n1",
        ),
        (
            lambda api: api.record_pod_event("ns", "p", "u", "n1", "LiveLimitsReset", "m", warning=True, key="k"),
            403,
            "Forbidden",
            "event on pod ns/p",
        ),
    ],
    ids=["get-node", "patch-pod", "patch-node", "patch-node-status", "list-pods", "node-event", "pod-event"],
)
def test_an_api_error_surfaces_as_a_gateway_error_with_its_status(
    tmp_path: Path, call: Callable[[KubeApi], object], status: int, reason: str, what: str
) -> None:
    def refuse(_: Request) -> Answer:
        return Answer(status, status_body(status, reason.replace(" ", ""), "said the API server"))

    with api_server(refuse, tmp_path) as (api, requests), pytest.raises(GatewayError) as raised:
        call(api)
    assert type(raised.value) is GatewayError and raised.value.status == status
    assert str(raised.value) == f"{what}: HTTP {status} {reason}: said the API server"
    assert len(requests) == 1  # no hidden retry


def test_a_transport_error_surfaces_as_a_gateway_error_without_a_status(tmp_path: Path) -> None:
    with socket.socket() as listener:  # accepts, then hangs up without an answer
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)

        def hang_up() -> None:
            connection, _ = listener.accept()
            connection.close()

        threading.Thread(target=hang_up, daemon=True).start()
        api = KubeApi(api_client(kubeconfig(listener.getsockname()[1], tmp_path)))
        with pytest.raises(GatewayError) as raised:
            api.get_node("n1")
    assert type(raised.value) is GatewayError and raised.value.status is None
    assert str(raised.value).startswith("get node n1: ")


def test_a_stalled_api_server_fails_the_pod_list_once_within_its_short_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Allocate waits on this LIST: it must fail fast, and urllib3 must not retry it behind our back."""
    monkeypatch.setattr(kube, "LIST_TIMEOUT", (0.3, 0.3))
    with socket.socket() as listener:  # connections complete in the kernel; nobody ever answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        api = KubeApi(api_client(kubeconfig(listener.getsockname()[1], tmp_path)))
        start = time.monotonic()
        with pytest.raises(GatewayTimeout, match=r"list pods on node n1: the API server did not answer within"):
            api.list_pods("n1")
        assert time.monotonic() - start < 0.6


# --- answers: the server's own JSON, and the bodies sent ---------------------------------------------


def test_reads_and_patches_return_the_servers_json_as_sent(tmp_path: Path) -> None:
    pod = {**_pod("p", "7"), "spec": {"nodeName": "n1", "notAField": [1]}}  # no client model would keep it
    node = {"metadata": {"name": "n1", "labels": {"x": "y"}}, "status": {"unknown": True}}
    listing = {"kind": "PodList", "metadata": {"resourceVersion": "42"}, "items": [pod]}

    def answer(request: Request) -> Answer:
        if request.method == "GET" and request.path == "/api/v1/pods":
            return Answer(body=listing)
        return Answer(body=pod if "/pods/" in request.path else node)

    with api_server(answer, tmp_path) as (api, requests):
        listed = api.list_pods("n1")
        assert (listed.items, listed.resource_version) == ([pod], "42")
        assert api.get_node("n1") == node
        assert api.patch_pod_annotations("default", "p", {"a": "b"}) == pod
        api.patch_node("n1", {"l": "v"}, {"a": "b"})
        api.patch_node_resources("n1", {"r": "1"})
    assert requests[0].query == {"fieldSelector": "spec.nodeName=n1"}
    patches = [(r.path, r.content_type, r.body) for r in requests if r.method == "PATCH"]
    assert patches == [
        (
            "/api/v1/namespaces/default/pods/p",
            "application/strategic-merge-patch+json",
            {"metadata": {"annotations": {"a": "b"}}},
        ),
        (
            "/api/v1/nodes/n1",
            "application/strategic-merge-patch+json",
            {"metadata": {"labels": {"l": "v"}, "annotations": {"a": "b"}}},
        ),
        (
            "/api/v1/nodes/n1/status",
            "application/strategic-merge-patch+json",
            {"status": {"capacity": {"r": "1"}, "allocatable": {"r": "1"}}},
        ),
    ]


def test_the_node_event_keeps_its_body(tmp_path: Path) -> None:
    with api_server(lambda _: Answer(201, {"kind": "Event"}), tmp_path) as (api, requests):
        api.record_node_event("n1", "GpuUnhealthy", "GPU x is unhealthy", warning=True, key="0a1b2c3d4e5f")
        api.record_node_event("n1", "GpuHealthy", "GPU x is healthy again", warning=False, key="5f4e3d2c1b0a")
    (first, second) = requests
    assert (first.method, first.path) == ("POST", "/api/v1/namespaces/default/events")
    event = first.body
    stamp = event["firstTimestamp"]
    assert event["metadata"]["name"] == "n1.0a1b2c3d4e5f"  # the key is the caller's: the same on every try
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|\+00:00)", stamp)
    assert event == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event["metadata"]["name"], "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
        "reason": "GpuUnhealthy",
        "message": "GPU x is unhealthy",
        "type": "Warning",
        "source": {"component": EVENT_COMPONENT, "host": "n1"},
        "reportingComponent": EVENT_COMPONENT,
        "reportingInstance": "n1",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    assert (second.body["reason"], second.body["type"]) == ("GpuHealthy", "Normal")
    assert second.body["metadata"]["name"] != event["metadata"]["name"]


def test_the_pod_event_names_the_pod_and_is_posted_in_its_namespace(tmp_path: Path) -> None:
    with api_server(lambda _: Answer(201, {"kind": "Event"}), tmp_path) as (api, requests):
        api.record_pod_event("team-a", "p", "uid-p", "n1", "LiveLimitsReset", "m", warning=True, key="0a1b2c3d4e5f")
    ((only,),) = [requests]
    assert (only.method, only.path) == ("POST", "/api/v1/namespaces/team-a/events")
    event = only.body
    assert event["metadata"]["name"] == "p.0a1b2c3d4e5f"
    assert event["metadata"]["namespace"] == "team-a"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "team-a",
        "name": "p",
        "uid": "uid-p",
    }
    assert (event["reason"], event["message"], event["type"]) == ("LiveLimitsReset", "m", "Warning")
    assert event["source"] == {"component": EVENT_COMPONENT, "host": "n1"}
    assert event["firstTimestamp"] == event["lastTimestamp"] and event["count"] == 1


# --- the pod watch -------------------------------------------------------------------------------------


def test_the_pod_watch_yields_the_streams_events_and_a_410_is_gone(tmp_path: Path) -> None:
    streams = [
        [
            {"type": "ADDED", "object": _pod("a", "11")},
            {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "12"}}},
            {"type": "ERROR", "object": status_body(410, "Expired", "too old resource version: 10 (12)")},
        ]
    ]

    def answer(request: Request) -> Answer:
        return Answer(lines=streams.pop(0)) if streams else Answer(410, status_body(410, "Gone", "gone"))

    with api_server(answer, tmp_path) as (api, requests):
        seen: list[WatchEvent] = []
        with pytest.raises(GoneError):
            seen.extend(api.watch_pods("n1", "10", 30))
        assert [(e.type, e.object["metadata"]["resourceVersion"]) for e in seen] == [
            ("ADDED", "11"),
            ("BOOKMARK", "12"),
        ]
        with pytest.raises(GoneError):  # the same, answered as an HTTP 410
            list(api.watch_pods("n1", "10", 30))
    assert requests[0].query == {
        "fieldSelector": "spec.nodeName=n1",
        "watch": "true",
        "resourceVersion": "10",
        "timeoutSeconds": "30",
        "allowWatchBookmarks": "true",
    }


class _Recorder:
    """A sink that records what the loop delivers."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    def listing(self) -> None:
        self.seen.append(("listing", None))

    def replace(self, items: list[RawObject]) -> None:
        self.seen.append(("replace", [i["metadata"]["name"] for i in items]))

    def apply(self, event: WatchEvent) -> None:
        self.seen.append((event.type, event.object["metadata"]["name"]))


def test_a_410_during_the_pod_watch_makes_the_shared_loop_list_again(tmp_path: Path) -> None:
    lists = [
        {"metadata": {"resourceVersion": "10"}, "items": [_pod("a", "9")]},
        {"metadata": {"resourceVersion": "20"}, "items": [_pod("a", "9"), _pod("b", "19")]},
    ]
    watches = [
        [{"type": "ERROR", "object": status_body(410, "Expired", "too old resource version: 10 (15)")}],
        [{"type": "ADDED", "object": _pod("c", "21")}],
    ]

    def answer(request: Request) -> Answer:
        if request.query.get("watch") == "true":
            return Answer(lines=watches.pop(0))
        return Answer(body=lists.pop(0))

    with api_server(answer, tmp_path) as (api, requests):
        stop = threading.Event()
        sink = _Recorder()
        informer = Informer(
            "pods on n1", NodePods(api, "n1", stop), sink, watch_timeout=30, backoff_max=30.0, stop=stop
        )
        informer.run(iterations=2)
    assert sink.seen == [
        ("listing", None),
        ("replace", ["a"]),
        ("listing", None),  # the 410: listed again at once, no backoff
        ("replace", ["a", "b"]),
        ("ADDED", "c"),
    ]
    assert informer.backoff.current == 0 and informer.resource_version == "21"
    assert [(r.query.get("watch"), r.query.get("resourceVersion")) for r in requests] == [
        (None, None),
        ("true", "10"),
        (None, None),
        ("true", "20"),
    ]
