"""Replay of every request a real kube-scheduler v1.36.2 sent (tests/fixtures/extender-captures).

Each capture is POSTed to the path it was sent to, in the recorded order, against a fake cluster
with the same nodes (node-a, node-b: GPUs; node-c: none). The replies must have the exact shape
the scheduler's decoder accepts: PascalCase keys, the request's own node form, a score for every
node, Meta victims. The captured pods asked for no GPU, so they are replayed twice: as recorded
(pass-through) and with our resolved-request annotation added (the GPU path).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scheduler_extender.gateway import Kind
from tests.scheduler_extender.conftest import Running
from tests.scheduler_extender.fakes import FakeGateway, gpu_request, make_node
from vgpu.contract import resolved as resolved_contract
from vgpu.names import SystemAnnotation

CAPTURES = Path(__file__).resolve().parent.parent / "fixtures" / "extender-captures"
RESOLVED = resolved_contract.encode(gpu_request(tflops=5_000, vram=2 * 1024**3))


def captures(tag: str) -> list[tuple[str, str, dict[str, Any], Any]]:
    """(verb, path, request, recorded response) in the order the scheduler sent them."""
    out = []
    for request in sorted(CAPTURES.glob(f"{tag}-*.json")):
        if request.name.endswith((".meta.json", ".resp.json")):
            continue
        meta = json.loads(request.with_suffix("").with_suffix(".meta.json").read_text())
        response = json.loads(request.with_suffix("").with_suffix(".resp.json").read_text())
        verb = request.stem.rsplit("-", 1)[1]
        out.append((verb, meta["path"], json.loads(request.read_text()), response))
    return out


def as_gpu_pod(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["metadata"].setdefault("annotations", {})[SystemAnnotation.RESOLVED_REQUEST] = RESOLVED
    return pod


def seed(fake: FakeGateway, tag: str, gpu: bool) -> None:
    """The captured cluster: three nodes and every pod the captures mention, pending."""
    fake.put(Kind.NODE, make_node("node-a", gpus=2))
    fake.put(Kind.NODE, make_node("node-b", gpus=2))
    fake.put(Kind.NODE, {"metadata": {"name": "node-c"}})
    for _, _, body, _ in captures(tag):
        pods = [body.get("Pod")] + [p for v in (body.get("NodeNameToVictims") or {}).values() for p in v["Pods"]]
        for pod in filter(None, pods):
            pod = as_gpu_pod(pod) if gpu else copy.deepcopy(pod)
            pod["metadata"].pop("resourceVersion", None)
            pod["spec"].pop("nodeName", None)
            if f"default/{pod['metadata']['name']}" not in fake.objects[Kind.POD]:
                fake.put(Kind.POD, pod)


def input_names(body: dict[str, Any]) -> list[str]:
    if body["NodeNames"] is not None:
        return list(body["NodeNames"])
    return [n["metadata"]["name"] for n in body["Nodes"]["items"]]


def check_filter(body: dict[str, Any], reply: dict[str, Any]) -> list[str]:
    assert set(reply) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert reply["Error"] == ""
    offered = input_names(body)
    if body["NodeNames"] is not None:
        assert reply["Nodes"] is None and isinstance(reply["NodeNames"], list)
        passed = reply["NodeNames"]
    else:
        assert reply["NodeNames"] is None and isinstance(reply["Nodes"]["items"], list)
        passed = [n["metadata"]["name"] for n in reply["Nodes"]["items"]]
        by_name = {n["metadata"]["name"]: n for n in body["Nodes"]["items"]}
        assert all(n == by_name[n["metadata"]["name"]] for n in reply["Nodes"]["items"])  # full objects, unchanged
    assert set(passed) <= set(offered)
    rejected = set(reply["FailedNodes"]) | set(reply["FailedAndUnresolvableNodes"])
    assert rejected.isdisjoint(passed) and set(passed) | rejected <= set(offered)
    assert all(
        isinstance(v, str) and v for v in {**reply["FailedNodes"], **reply["FailedAndUnresolvableNodes"]}.values()
    )
    return passed


def check_prioritize(body: dict[str, Any], reply: Any) -> dict[str, int]:
    assert isinstance(reply, list)
    assert [e["Host"] for e in reply] == input_names(body)
    assert all(set(e) == {"Host", "Score"} and type(e["Score"]) is int and 0 <= e["Score"] <= 10 for e in reply)
    return {e["Host"]: e["Score"] for e in reply}


def check_preempt(body: dict[str, Any], reply: dict[str, Any]) -> None:
    assert set(reply) == {"NodeNameToMetaVictims"}
    proposed = body["NodeNameToMetaVictims"] or {
        node: {"Pods": [{"UID": p["metadata"]["uid"]} for p in v["Pods"]]}
        for node, v in body["NodeNameToVictims"].items()
    }
    for node, victims in reply["NodeNameToMetaVictims"].items():
        assert set(victims) == {"Pods", "NumPDBViolations"}
        assert victims["Pods"], "a kept node needs at least one victim"
        assert {p["UID"] for p in victims["Pods"]} <= {p["UID"] for p in proposed[node]["Pods"]}


@pytest.mark.parametrize("tag", ["cache", "full", "full2"])
def test_recorded_pods_pass_through_exactly(run: Callable[..., Running], fake: FakeGateway, tag: str) -> None:
    seed(fake, tag, gpu=False)
    app = run(url_prefix="/scheduler")
    for verb, path, body, recorded in captures(tag):
        reply = app.post(path, body)
        if verb == "filter":
            passed = check_filter(body, reply)
            assert passed == input_names(body)  # not our pods: every node passes
            assert not reply["FailedNodes"] and not reply["FailedAndUnresolvableNodes"]
        elif verb == "prioritize":
            check_prioritize(body, reply)
        elif verb == "bind":
            assert reply == recorded == {"Error": ""}
            assert (body["PodNamespace"], body["PodName"], body["Node"]) in fake.bindings
        else:
            check_preempt(body, reply)
            assert reply == recorded  # not our pods: the scheduler's own plan is echoed in Meta form


@pytest.mark.parametrize("decide", [False, True], ids=["prioritize-decides", "filter-decides"])
@pytest.mark.parametrize("tag", ["cache", "full", "full2"])
def test_recorded_requests_as_gpu_pods(run: Callable[..., Running], fake: FakeGateway, tag: str, decide: bool) -> None:
    seed(fake, tag, gpu=True)
    app = run(url_prefix="/scheduler", decide_in_filter=decide)
    for verb, path, body, _ in captures(tag):
        if body.get("Pod") is not None:
            body = {**body, "Pod": as_gpu_pod(body["Pod"])}
        reply = app.post(path, body)
        if verb == "filter":
            passed = check_filter(body, reply)
            fitting = set(input_names(body)) - {"node-c"}
            rejected = set(reply["FailedNodes"]) | set(reply["FailedAndUnresolvableNodes"])
            if decide:  # the best of the fitting nodes pass; the others fit, so they are in neither map
                assert passed and set(passed) <= fitting and rejected == set(input_names(body)) - fitting
            else:
                assert set(passed) == fitting and set(passed) | rejected == set(input_names(body))
            if "node-c" in input_names(body):
                assert "no GPU" in reply["FailedAndUnresolvableNodes"]["node-c"]
        elif verb == "prioritize":
            scores = check_prioritize(body, reply)
            assert max(scores.values()) == 10
        elif verb == "bind":
            assert reply == {"Error": ""}
            pod = fake.pod(body["PodNamespace"], body["PodName"])
            assert SystemAnnotation.ALLOCATION in pod["metadata"]["annotations"]
            fake.write_receipt(body["PodNamespace"], body["PodName"])  # the device plugin's part
        else:
            check_preempt(body, reply)
        app.settle()


def test_prefix_and_root_paths_both_answer(run: Callable[..., Running], fake: FakeGateway) -> None:
    seed(fake, "cache", gpu=False)
    app = run(url_prefix="/scheduler/")
    _, _, body, _ = captures("cache")[0]
    assert app.post("/scheduler/filter", body) == app.post("/filter", body)
