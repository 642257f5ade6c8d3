"""Fuzzing the HTTP API: whatever arrives at a verb, the answer is HTTP 200 in the verb's reply shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_extender.app import create_app
from scheduler_extender.gateway import Kind
from scheduler_extender.settings import Settings
from tests.scheduler_extender.conftest import wait_for
from tests.scheduler_extender.fakes import FakeGateway, gpu_request, make_node, make_pod
from vgpu.contract import resolved as resolved_contract
from vgpu.names import LABEL_ENABLED, SystemAnnotation

VERBS = ("/filter", "/prioritize", "/bind", "/preempt")
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
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
