"""The short way in for filter, prioritize and bind (``routes.HotVerbs``): taken only for a good body on
their paths, and everything else reaches the app unchanged, its body replayed byte for byte."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from scheduler_extender.gateway import Kind
from scheduler_extender.routes import HotVerbs
from tests.scheduler_extender.conftest import Running
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_bind import bind_body


class Downstream:
    """The app behind the middleware: records what reached it, answers 418."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.calls.append((scope["method"], scope["path"], body))
        await send({"type": "http.response.start", "status": 418, "headers": []})
        await send({"type": "http.response.body", "body": b""})


JSON = [(b"content-type", b"application/json")]


def call(
    app: HotVerbs, method: str, path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]] = JSON
) -> tuple[int, bytes]:
    """One request through ``app``, its body sent in ``chunks``: the status and the body of the reply."""
    scope: Scope = {"type": "http", "method": method, "path": path, "headers": headers}
    messages: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1} for i, chunk in enumerate(chunks)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # nothing more: the client waits for the reply
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@pytest.fixture
def hot(run: Callable[..., Running], fake: FakeGateway) -> tuple[HotVerbs, Downstream, Running]:
    fake.put(Kind.NODE, make_node("big", gpus=2, vram=80 * GI))
    fake.put(Kind.NODE, make_node("small", gpus=1, vram=8 * GI))
    for name in ("p1", "p2"):  # pods to bind
        fake.put(Kind.POD, make_pod(name, gpu_request(vram=4 * GI)))
    app = run()
    downstream = Downstream()
    return HotVerbs(downstream, app.ext, ("", "/tf")), downstream, app


def body(**request: Any) -> bytes:
    pod = make_pod("p", gpu_request(**request))
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["big", "small", "ghost"]}).encode()


def test_a_good_filter_body_is_answered_by_the_verb_without_the_app(
    hot: tuple[HotVerbs, Downstream, Running],
) -> None:
    middleware, downstream, app = hot
    good = body(vram=12 * GI)
    status, reply = call(middleware, "POST", "/filter", [good[:100], good[100:]])  # a body in two chunks
    assert status == 200 and downstream.calls == []
    answer = json.loads(reply)
    assert answer["NodeNames"] == ["big"]
    assert set(answer["FailedNodes"]) | set(answer["FailedAndUnresolvableNodes"]) == {"small", "ghost"}
    assert answer == app.post("/filter", json.loads(good))  # what the FastAPI route answers


def test_a_good_prioritize_body_on_the_prefixed_path_is_answered_by_the_verb(
    hot: tuple[HotVerbs, Downstream, Running],
) -> None:
    middleware, downstream, _ = hot
    json_subtype = [(b"Content-Type", b"application/merge-patch+json; charset=utf-8")]
    status, reply = call(middleware, "POST", "/tf/prioritize", [body(vram=4 * GI)], json_subtype)
    assert status == 200 and downstream.calls == []
    scores = {entry["Host"]: entry["Score"] for entry in json.loads(reply)}
    assert set(scores) == {"big", "small", "ghost"} and scores["ghost"] == 0 and scores["big"] > 0


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b'{"NodeNames": 7}', b'{"Pod": "a string"}', b"\xff\xfe", b""],
    ids=["not-json", "wrong-type", "pod-not-object", "not-utf8", "empty"],
)
def test_a_bad_body_reaches_the_app_byte_for_byte(hot: tuple[HotVerbs, Downstream, Running], raw: bytes) -> None:
    middleware, downstream, _ = hot
    status, _ = call(middleware, "POST", "/filter", [raw[:3], raw[3:]] if len(raw) > 3 else [raw])
    assert status == 418
    assert downstream.calls == [("POST", "/filter", raw)]


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("GET", "/filter", JSON),
        ("POST", "/other/filter", JSON),
        ("POST", "/filter", []),  # no Content-Type: FastAPI does not read the body as JSON
        ("POST", "/prioritize", [(b"content-type", b"text/plain")]),
    ],
    ids=["get", "other-path", "no-content-type", "not-json"],
)
def test_other_requests_reach_the_app_unchanged(
    hot: tuple[HotVerbs, Downstream, Running], method: str, path: str, headers: list[tuple[bytes, bytes]]
) -> None:
    middleware, downstream, _ = hot
    good = body()
    status, _ = call(middleware, method, path, [good], headers)
    assert status == 418
    assert downstream.calls == [(method, path, good)]


def test_a_good_bind_body_is_bound_by_the_verb_and_answered_as_the_route_answers(
    hot: tuple[HotVerbs, Downstream, Running], fake: FakeGateway
) -> None:
    middleware, downstream, app = hot
    status, reply = call(middleware, "POST", "/tf/bind", [json.dumps(bind_body("p1", "big")).encode()])
    assert status == 200 and downstream.calls == []
    assert (
        json.loads(reply) == {"Error": ""} == app.post("/bind", bind_body("p2", "small"))
    )  # another node: "big" hands over to p1
    assert fake.bindings == [("default", "p1", "big"), ("default", "p2", "small")]
