"""Fuzzing the HTTP API: whatever arrives at a verb, the answer is HTTP 200 in the verb's reply shape;
no route of either app answers a 5xx, and hostile bodies (lone surrogates, invalid UTF-8, huge
numbers, deep nesting) are refused with a message naming the problem, before anything is reserved."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_extender.app import create_app, public_app
from scheduler_extender.gateway import Kind
from scheduler_extender.settings import Settings
from tests.hostile_json import (
    HOSTILE_TEXT,
    HUGE_NUMBERS,
    INVALID_UTF8,
    escaped,
    invalid_utf8,
    poisoned,
    raw,
    string_slots,
    with_number,
)
from tests.scheduler_extender.conftest import wait_for
from tests.scheduler_extender.fakes import FakeGateway, gpu_request, make_node, make_pod
from vgpu.contract import resolved as resolved_contract
from vgpu.names import LABEL_ENABLED, SystemAnnotation

VERBS = ("/filter", "/prioritize", "/bind", "/preempt")
JSON = st.recursive(
    # JSON has no Infinity: Python writes it, kube-scheduler never does, strict decoding refuses the body
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
NAMES = st.lists(st.sampled_from(["n1", "n2", "ghost", ""]) | st.text(max_size=8), max_size=5)
ANNOTATION = st.sampled_from(
    [
        resolved_contract.encode(gpu_request()),
        resolved_contract.encode(gpu_request(count=3)),
        "{",
        '{"version":"v1"}',
        "",
    ]
) | st.text(max_size=40)
POD = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {"name": st.text(max_size=8), "namespace": st.sampled_from(["default", ""]), "uid": st.text(max_size=8)},
            optional={
                "annotations": st.dictionaries(st.just(SystemAnnotation.RESOLVED_REQUEST.value), ANNOTATION),
                "labels": st.dictionaries(st.just(LABEL_ENABLED), st.sampled_from(["true", "no"])),
            },
        ),
        "spec": JSON,
        "status": JSON,
    }
)
ARGS = st.fixed_dictionaries({"Pod": POD | JSON, "NodeNames": NAMES | st.none(), "Nodes": st.none() | JSON})
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    fake = FakeGateway()
    fake.put(Kind.NODE, make_node("n1"))
    fake.put(Kind.NODE, make_node("n2", inventory="[]"))
    fake.put(Kind.POD, make_pod("p", gpu_request()))
    with TestClient(create_app(Settings(handoff_wait=0.05), fake)) as client:
        wait_for(lambda: client.get("/readyz").status_code == 200)
        yield client
        fake.close()


def check(client: TestClient, path: str, raw: bytes) -> Any:
    reply = client.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    if path == "/filter":
        assert set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
        assert "GPU extender filter failed" not in body["Error"]  # never the last-resort handler
    elif path == "/bind":
        assert set(body) == {"Error"} and "GPU extender bind failed" not in body["Error"]
    elif path == "/prioritize":
        assert isinstance(body, list) and all(0 <= e["Score"] <= 10 for e in body)
    else:
        assert set(body) == {"NodeNameToMetaVictims"}
    return body


@FUZZ
@given(path=st.sampled_from(VERBS), raw=st.binary(max_size=200))
def test_arbitrary_bytes(client: TestClient, path: str, raw: bytes) -> None:
    check(client, path, raw)


@FUZZ
@given(path=st.sampled_from(VERBS), doc=JSON)
def test_arbitrary_json(client: TestClient, path: str, doc: Any) -> None:
    check(client, path, json.dumps(doc).encode())


@FUZZ
@given(path=st.sampled_from(("/filter", "/prioritize")), doc=ARGS)
def test_scheduler_shaped_requests(client: TestClient, path: str, doc: dict[str, Any]) -> None:
    body = check(client, path, json.dumps(doc).encode())
    well_formed = isinstance(doc["Pod"], dict) and doc["Nodes"] is None and isinstance(doc["NodeNames"], list)
    if path == "/prioritize" and well_formed:
        assert [e["Host"] for e in body] == list(dict.fromkeys(doc["NodeNames"]))


@FUZZ
@given(
    doc=st.fixed_dictionaries(
        {
            "PodName": st.sampled_from(["p", "x"]) | st.text(max_size=5),
            "PodNamespace": st.sampled_from(["default", ""]),
            "PodUID": st.sampled_from(["uid-default-p", "u"]),
            "Node": NAMES.map(lambda n: n[0] if n else ""),
        }
    )
)
def test_bind_requests(client: TestClient, doc: dict[str, str]) -> None:
    check(client, "/bind", json.dumps(doc).encode())


@FUZZ
@given(
    doc=st.fixed_dictionaries(
        {
            "Pod": POD | JSON,
            "NodeNameToMetaVictims": st.dictionaries(
                st.text(max_size=4),
                st.fixed_dictionaries(
                    {
                        "Pods": st.lists(st.fixed_dictionaries({"UID": st.text(max_size=4)}), max_size=3),
                        "NumPDBViolations": st.integers(0, 3),
                    }
                ),
                max_size=3,
            )
            | st.none(),
            "NodeNameToVictims": st.none() | JSON,
        }
    )
)
def test_preempt_requests(client: TestClient, doc: dict[str, Any]) -> None:
    check(client, "/preempt", json.dumps(doc).encode())


# --- schemathesis: every operation of the app's own OpenAPI schema -----------------------------------
@pytest.fixture(scope="module")
def api_schema() -> Iterator[Any]:
    import schemathesis

    fake = FakeGateway()
    fake.put(Kind.NODE, make_node("n1"))
    fake.put(Kind.POD, make_pod("p", gpu_request()))
    app = create_app(Settings(handoff_wait=0.05), fake)
    extender = app.state.extender
    extender.start()
    wait_for(lambda: extender.ready)
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    extender.shutdown()
    fake.close()


def test_openapi_operations_never_answer_5xx(api_schema: Any) -> None:
    """Cases generated by schemathesis from each operation's schema (driven by hypothesis directly)."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {*VERBS, "/explain", "/explain/{namespace}/{name}"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        def call(case: Any) -> None:
            response = case.call()
            assert response.status_code < 500, (case.path, response.text)
            if case.path in VERBS:
                assert response.status_code == 200, response.text

        call()


# --- hostile bodies: what no kube-scheduler sends, but anyone on the wire can --------------------------
HOSTILE_PATHS = (*VERBS, "/explain")
HOSTILE_POD = make_pod("h", gpu_request())


def clean_body(path: str) -> Any:
    """A well-formed body for ``path``, for pod h, which the hostile client holds but has never seen a verb for."""
    if path in ("/filter", "/prioritize"):
        return {"Pod": HOSTILE_POD, "NodeNames": ["n1", "n2"], "Nodes": None}
    if path == "/bind":
        return {"PodName": "h", "PodNamespace": "default", "PodUID": HOSTILE_POD["metadata"]["uid"], "Node": "n1"}
    if path == "/preempt":
        return {"Pod": HOSTILE_POD, "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v"}], "NumPDBViolations": 0}}}
    return HOSTILE_POD


@pytest.fixture(scope="module")
def hostile() -> Iterator[tuple[TestClient, TestClient, FakeGateway]]:
    """The verbs app and the public app of one extender that only ever receives hostile bodies."""
    fake = FakeGateway()
    fake.put(Kind.NODE, make_node("n1"))
    fake.put(Kind.NODE, make_node("n2"))
    fake.put(Kind.POD, HOSTILE_POD)
    verbs_app = create_app(Settings(handoff_wait=0.05), fake)
    with TestClient(verbs_app) as client, TestClient(public_app(verbs_app.state.extender)) as public:
        wait_for(lambda: public.get("/readyz").status_code == 200)
        yield client, public, fake
        fake.close()


def refused(hostile: tuple[TestClient, TestClient, FakeGateway], path: str, body: bytes, problem: str) -> None:
    """``body`` is refused at the door: the verb's neutral 200 (filter and bind name ``problem``) or a 422
    naming it; no 5xx, nothing reserved, nothing written to the API server."""
    client, public, fake = hostile
    if path == "/explain":
        for app in (client, public):
            reply = app.post(path, content=body, headers={"Content-Type": "application/json"})
            assert reply.status_code == 422 and problem in reply.json()["detail"], reply.text
    else:
        answer = check(client, path, body)
        if path in ("/filter", "/bind"):
            assert problem in answer["Error"], answer
    assert client.app.state.extender.cache.tentative_count() == 0  # type: ignore[attr-defined]
    assert fake.calls == []


@FUZZ
@given(path=st.sampled_from(HOSTILE_PATHS), data=st.data(), extra=HOSTILE_TEXT, as_escape=st.booleans())
def test_a_lone_surrogate_anywhere_is_refused(
    hostile: tuple[TestClient, TestClient, FakeGateway], path: str, data: st.DataObject, extra: str, as_escape: bool
) -> None:
    """In every string position, keys included, written as a JSON escape (\\ud800) or as the raw
    UTF-8-style bytes of the code point (ED A0 80, which is not UTF-8)."""
    doc = clean_body(path)
    bad = poisoned(doc, data.draw(st.integers(0, string_slots(doc) - 1)), extra)
    if as_escape:
        refused(hostile, path, escaped(bad), "lone UTF-16 surrogate")
    else:
        refused(hostile, path, raw(bad), "not valid UTF-8")


@FUZZ
@given(path=st.sampled_from(HOSTILE_PATHS), data=st.data(), junk=st.sampled_from(INVALID_UTF8))
def test_invalid_utf8_inside_a_string_is_refused(
    hostile: tuple[TestClient, TestClient, FakeGateway], path: str, data: st.DataObject, junk: bytes
) -> None:
    at, body = data.draw(st.sampled_from(list(invalid_utf8(escaped(clean_body(path)), junk))))
    refused(hostile, path, body, f"byte {at} (0x{junk[0]:02x})")


@FUZZ
@given(path=st.sampled_from(HOSTILE_PATHS), data=st.data(), number=st.sampled_from(HUGE_NUMBERS))
def test_huge_numbers_anywhere_never_answer_5xx(
    hostile: tuple[TestClient, TestClient, FakeGateway], path: str, data: st.DataObject, number: str
) -> None:
    """A string replaced by a number no double holds, or one with thousands of digits."""
    doc = clean_body(path)
    body = with_number(doc, data.draw(st.integers(0, string_slots(doc) - 1)), number)
    client, public, fake = hostile
    for app in (client, public) if path == "/explain" else (client,):
        assert app.post(path, content=body).status_code < 500, (path, body[:80])
    assert client.app.state.extender.cache.tentative_count() == 0  # type: ignore[attr-defined]
    assert not [c for c in fake.calls if c.startswith("bind")]


@pytest.mark.parametrize("path", HOSTILE_PATHS)
@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deep_nesting_is_refused(hostile: tuple[TestClient, TestClient, FakeGateway], path: str, depth: int) -> None:
    """Past orjson's 1,024 levels the body is refused; below it a verb reads it as the wrong shape."""
    raw = b'{"Pod":' + b"[" * depth + b"]" * depth + b"}"
    if depth > 1024:
        refused(hostile, path, raw, "depth limit exceeded")
    else:
        client, public, _ = hostile
        assert client.post(path, content=raw).status_code < 500
        assert public.post("/explain", content=raw).status_code < 500


@FUZZ
@given(
    namespace=st.text(max_size=12) | HOSTILE_TEXT | st.sampled_from(["default", "..", "%2F", "%ED%A0%80", "%FF"]),
    name=st.text(max_size=12) | HOSTILE_TEXT | st.sampled_from(["h", "..", "%00", "%ED%A0%80", "%FF" * 3]),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
    raw=st.binary(max_size=40),
)
def test_no_route_of_either_app_answers_5xx(
    hostile: tuple[TestClient, TestClient, FakeGateway], namespace: str, name: str, method: str, raw: bytes
) -> None:
    """Every path either app serves (and some it does not), any method, junk body, hostile path text."""
    client, public, _ = hostile
    paths = [
        *VERBS,
        "/explain",
        f"/explain/{quote(namespace, safe='%', errors='surrogatepass')}/{quote(name, safe='%', errors='surrogatepass')}",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/docs",
    ]
    for app in (client, public):
        for path in paths:
            reply = app.request(method, path, content=raw)
            assert reply.status_code < 500, (method, path, raw, reply.text)


def test_a_bad_body_is_refused_before_prioritize_reserves_anything(
    hostile: tuple[TestClient, TestClient, FakeGateway],
) -> None:
    """The issue's case: before, prioritize reserved room on n1 for the pod, then died encoding the
    surrogate node name (HTTP 500) and left the reservation behind until it expired."""
    client, _, _ = hostile
    raw = json.dumps({"Pod": HOSTILE_POD, "NodeNames": ["n1", "\ud800"]}).encode()
    assert raw.count(b"\\ud800") == 1
    reply = client.post("/prioritize", content=raw, headers={"Content-Type": "application/json"})
    assert (reply.status_code, reply.json()) == (200, [])
    assert client.app.state.extender.cache.tentative_count() == 0  # type: ignore[attr-defined]
