"""filter, prioritize, preempt and explain through the HTTP API against a fake cluster."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler_extender.app import create_app
from scheduler_extender.gateway import Kind
from scheduler_extender.objects import scheduled_pod
from scheduler_extender.settings import Settings
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_cache import allocated_pod, grant
from tests.scheduler_extender.test_preemptor import protect
from tf_shell.access import Gate
from tf_shell.catalog_file import CatalogFileError
from tf_shell.kube.api import GatewayError, Listing
from vgpu.contract import resolved as resolved_contract
from vgpu.names import LABEL_ENABLED, Qos, SystemAnnotation
from vgpu.scheduling.demand import demand_from_request
from vgpu.scheduling.filter import BATCH, filter_nodes
from vgpu.scheduling.model import NodeState
from vgpu.scheduling.packed import Columns, Floats, Ints
from vgpu.scheduling.scoring import score_nodes, to_extender_scores


@pytest.fixture
def cluster(fake: FakeGateway) -> FakeGateway:
    fake.put(Kind.NODE, make_node("big", gpus=2, vram=80 * GI))
    fake.put(Kind.NODE, make_node("small", gpus=2, vram=8 * GI))
    fake.put(Kind.NODE, make_node("t4", gpus=1, model="Tesla T4", vram=16 * GI, tflops=65_000))
    fake.put(Kind.NODE, make_node("broken", inventory="{oops"))
    fake.put(Kind.NODE, {"metadata": {"name": "cpu-only"}})
    return fake


def args(pod: dict[str, Any], *names: str) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": list(names)}


ALL = ("big", "small", "t4", "broken", "cpu-only", "ghost")


def test_filter_passes_fitting_nodes_and_gives_every_other_a_reason(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    app = run()
    reply = app.post("/filter", args(make_pod("p", gpu_request(vram=12 * GI, model="A100")), *ALL))
    assert reply["NodeNames"] == ["big"] and reply["Error"] == ""
    assert "VRAM" in reply["FailedAndUnresolvableNodes"]["small"] or "VRAM" in reply["FailedNodes"].get("small", "")
    unresolvable = reply["FailedAndUnresolvableNodes"]
    assert "T4" in unresolvable["t4"]
    assert "corrupt GPU inventory" in unresolvable["broken"]
    assert "no GPU" in unresolvable["cpu-only"]
    assert "unknown" in unresolvable["ghost"]


def test_filter_capacity_shortage_is_resolvable(run: Callable[..., Running], cluster: FakeGateway) -> None:
    cluster.put(Kind.POD, allocated_pod("hog", "small", grant("small", 0, 6 * GI), grant("small", 1, 6 * GI)))
    app = run()
    reply = app.post("/filter", args(make_pod("p", gpu_request(vram=4 * GI)), "small"))
    assert reply["NodeNames"] == [] and "insufficient VRAM" in reply["FailedNodes"]["small"]


def test_unschedulable_pod_gets_one_rate_limited_event_with_the_summary(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    app = run()
    pod = make_pod("p", gpu_request(vram=200 * GI))
    for _ in range(3):
        assert app.post("/filter", args(pod, *ALL))["NodeNames"] == []
    wait_for(lambda: cluster.events, what="event")
    app.ext.events.stop()
    assert len(cluster.events) == 1
    event = cluster.events[0]
    assert (event.reason, event.type, event.pod_uid) == ("FailedGpuScheduling", "Warning", "uid-default-p")
    assert event.message.startswith("0/6 nodes: 3 with GPUs too small")
    # counted by the reason the event names first: the one that rejected the most nodes
    assert 'tf_extender_unschedulable_total{reason="gpu-too-small"} 3.0' in app.client.get("/metrics").text


@pytest.mark.parametrize(
    ("annotations", "labels", "message"),
    [
        ({SystemAnnotation.RESOLVED_REQUEST: '{"version":"v1"}'}, {}, "invalid tensor-fusion.ai/resolved-request"),
        ({}, {LABEL_ENABLED: "true"}, "the tensor-fusion admission webhook did not process it"),
    ],
)
def test_invalid_request_is_every_nodes_unresolvable_reason(
    run: Callable[..., Running], cluster: FakeGateway, annotations: dict[str, str], labels: dict[str, str], message: str
) -> None:
    app = run()
    pod = make_pod("p", annotations=annotations)
    pod["metadata"]["labels"] = labels
    reply = app.post("/filter", args(pod, "big", "small"))
    assert reply["NodeNames"] == [] and reply["Error"] == ""
    assert set(reply["FailedAndUnresolvableNodes"]) == {"big", "small"}
    assert all(message in m for m in reply["FailedAndUnresolvableNodes"].values())
    assert app.post("/prioritize", args(pod, "big", "small")) == [
        {"Host": "big", "Score": 0},
        {"Host": "small", "Score": 0},
    ]


def test_non_cache_form_is_answered_with_the_node_objects(run: Callable[..., Running], cluster: FakeGateway) -> None:
    app = run()
    items = [cluster.objects[Kind.NODE][n] for n in ("big", "small")]
    body = {
        "Pod": make_pod("p", gpu_request(vram=12 * GI)),
        "Nodes": {"metadata": {}, "items": items},
        "NodeNames": None,
    }
    reply = app.post("/filter", body)
    assert reply["NodeNames"] is None and reply["Nodes"]["items"] == [items[0]]


def test_non_cache_form_judges_nodes_the_watch_has_not_delivered(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    app = run()
    fresh = make_node("fresh", gpus=1, vram=80 * GI)
    body = {
        "Pod": make_pod("p", gpu_request(vram=12 * GI)),
        "Nodes": {"metadata": {}, "items": [fresh]},
        "NodeNames": None,
    }
    assert app.post("/filter", body)["Nodes"]["items"] == [fresh]


def test_filter_decides_alone_passing_only_the_best_node(
    run: Callable[..., Running], cluster: FakeGateway, checks: list[str]
) -> None:
    """kube-scheduler binds a lone passed node without scoring; the other fitting nodes are in neither map, and
    the scores reuse the filter's verdicts (each node judged once)."""
    cluster.put(Kind.NODE, make_node("big2", gpus=2, vram=80 * GI))
    cluster.put(Kind.POD, allocated_pod("x", "big2", grant("big2", 0, 40 * GI)))
    app = run(policy="binpack")
    reply = app.post("/filter", args(make_pod("p", gpu_request(vram=4 * GI)), "big", "big2", "cpu-only"))
    assert reply["NodeNames"] == ["big2"]  # binpack: the fuller node
    assert reply["FailedNodes"] == {} and set(reply["FailedAndUnresolvableNodes"]) == {"cpu-only"}
    assert sorted(checks) == ["big", "big2", "cpu-only"]
    # p's own tentative hold on big2 (a lone node passed) never counts against p
    assert app.post("/filter", args(make_pod("p", gpu_request(vram=4 * GI)), "big", "big2"))["NodeNames"] == ["big2"]
    assert 'tf_extender_filter_passes_total{passed="one"} 2.0' in app.client.get("/metrics").text


def test_filter_keeps_ties_for_kube_schedulers_own_scores(run: Callable[..., Running], cluster: FakeGateway) -> None:
    """Equal 0–10 scores pass together, and prioritize scores them equal, as it would have among all the fitting
    nodes: kube-scheduler's own scores break the tie."""
    for name in ("big2", "big3"):
        cluster.put(Kind.NODE, make_node(name, gpus=2, vram=80 * GI))
    cluster.put(Kind.POD, allocated_pod("x", "big2", grant("big2", 0, 2 * GI)))  # a little less empty than 'big'
    cluster.put(Kind.POD, allocated_pod("y", "big3", grant("big3", 0, 60 * GI), grant("big3", 1, 60 * GI)))
    app = run(policy="spread")
    pod = make_pod("p", gpu_request(vram=4 * GI))
    assert app.post("/filter", args(pod, "big", "big2", "big3"))["NodeNames"] == ["big", "big2"]
    # for another pod, without the filter's tie, prioritize ranks by itself: spread prefers the emptier node
    assert app.post("/prioritize", args(make_pod("q", gpu_request(vram=4 * GI)), "big", "big2")) == [
        {"Host": "big", "Score": 10},
        {"Host": "big2", "Score": 0},
    ]
    assert app.post("/prioritize", args(pod, "big", "big2")) == [
        {"Host": "big", "Score": 10},
        {"Host": "big2", "Score": 10},
    ]
    assert 'tf_extender_filter_passes_total{passed="tie"} 1.0' in app.client.get("/metrics").text


def test_a_tie_holds_for_its_own_cycle_only(run: Callable[..., Running], cluster: FakeGateway) -> None:
    """A later cycle whose filter passes every fitting node (here the pod states a soft preference by then) has
    prioritize rank them, even when they are the nodes of an earlier tie that no prioritize took."""
    for name in ("big2", "big3"):
        cluster.put(Kind.NODE, make_node(name, gpus=2, vram=80 * GI))
    cluster.put(Kind.POD, allocated_pod("x", "big2", grant("big2", 0, 2 * GI)))
    cluster.put(Kind.POD, allocated_pod("y", "big3", grant("big3", 0, 60 * GI), grant("big3", 1, 60 * GI)))
    app = run(policy="spread")
    pod = make_pod("p", gpu_request(vram=4 * GI))
    assert app.post("/filter", args(pod, "big", "big2", "big3"))["NodeNames"] == ["big", "big2"]  # a tie
    pod["spec"]["affinity"] = SOFT["preferred node affinity"]
    assert app.post("/filter", args(pod, "big", "big2"))["NodeNames"] == ["big", "big2"]  # every fitting node
    assert app.post("/prioritize", args(pod, "big", "big2")) == [
        {"Host": "big", "Score": 10},
        {"Host": "big2", "Score": 0},
    ]


SOFT = {
    "preferred node affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}},
    "preferred pod affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}},
    "preferred pod anti-affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}},
}


@pytest.mark.parametrize("spec", [{"affinity": a} for a in SOFT.values()] + [
    {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]}
], ids=[*SOFT, "ScheduleAnyway spread"])  # fmt: skip
def test_a_pod_kube_scheduler_weighs_nodes_for_gets_every_fitting_node(
    run: Callable[..., Running], cluster: FakeGateway, spec: dict[str, Any]
) -> None:
    cluster.put(Kind.NODE, make_node("big2", gpus=2, vram=80 * GI))
    cluster.put(Kind.POD, allocated_pod("x", "big2", grant("big2", 0, 40 * GI)))
    app = run(policy="binpack")
    pod = make_pod("p", gpu_request(vram=4 * GI))
    pod["spec"].update(spec)
    assert app.post("/filter", args(pod, "big", "big2"))["NodeNames"] == ["big", "big2"]
    assert 'tf_extender_filter_passes_total{passed="every"} 1.0' in app.client.get("/metrics").text
    hard = make_pod("q", gpu_request(vram=4 * GI))  # a DoNotSchedule constraint is a filter: nothing to weigh
    hard["spec"]["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"}
    ]
    assert app.post("/filter", args(hard, "big", "big2"))["NodeNames"] == ["big2"]


@pytest.mark.parametrize(
    ("tolerations", "passed"),
    [
        ([], ["big", "big2"]),
        ([{"key": "spot", "operator": "Equal", "value": "no", "effect": "PreferNoSchedule"}], ["big", "big2"]),
        ([{"key": "spot", "operator": "Equal", "value": "yes", "effect": "PreferNoSchedule"}], ["big2"]),
        ([{"key": "spot", "operator": "Exists"}], ["big2"]),
        ([{"operator": "Exists"}], ["big2"]),
        ([{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}], ["big", "big2"]),
    ],
)
def test_an_untolerated_prefer_no_schedule_taint_leaves_the_choice_to_kube_scheduler(
    run: Callable[..., Running], cluster: FakeGateway, tolerations: list[dict[str, str]], passed: list[str]
) -> None:
    """kube-scheduler's TaintToleration scores a node with such a taint lower, by more than a tie."""
    tainted = make_node("big2", gpus=2, vram=80 * GI)
    tainted["spec"] = {"taints": [{"key": "spot", "value": "yes", "effect": "PreferNoSchedule"}]}
    cluster.put(Kind.NODE, tainted)
    cluster.put(Kind.POD, allocated_pod("x", "big2", grant("big2", 0, 40 * GI)))
    app = run(policy="binpack")
    pod = make_pod("p", gpu_request(vram=4 * GI))
    pod["spec"]["tolerations"] = tolerations
    assert app.post("/filter", args(pod, "big", "big2"))["NodeNames"] == passed
    cluster.put(Kind.NODE, make_node("big2", gpus=2, vram=80 * GI))  # the taint removed: filter decides again
    app.settle()
    assert app.post("/filter", args(pod, "big", "big2"))["NodeNames"] == ["big2"]


def test_filter_passes_a_node_handing_gpus_over_only_when_no_other_fits(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    """As prioritize ranks it (below): a's tentative hold is on 'big', so b's bind there would wait at its gate."""
    cluster.put(Kind.NODE, make_node("big2", gpus=2, vram=80 * GI))
    app = run(policy="binpack")
    a, b = make_pod("a", gpu_request(vram=4 * GI)), make_pod("b", gpu_request(vram=4 * GI))
    assert app.post("/filter", args(a, "big"))["NodeNames"] == ["big"]
    assert app.post("/filter", args(b, "big", "big2"))["NodeNames"] == ["big2"]  # binpack alone: 'big'
    assert app.post("/filter", args(make_pod("c", gpu_request(vram=4 * GI)), "big"))["NodeNames"] == ["big"]


def test_filter_accounts_for_a_pod_whose_bind_has_not_come_yet(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    """The scheduler assumed pod a on 'small' (its only node); b's filter arrives before a's bind."""
    app = run()
    a = make_pod("a", gpu_request(vram=8 * GI, count=2))
    b = make_pod("b", gpu_request(vram=4 * GI))
    assert app.post("/filter", args(a, "small"))["NodeNames"] == ["small"]
    assert app.post("/filter", args(b, "small"))["NodeNames"] == []
    assert app.post("/filter", args(a, "small"))["NodeNames"] == ["small"]  # a's own hold never blocks a
    assert "tf_extender_reservations 1.0" in app.client.get("/metrics").text


def test_prioritize_holds_room_on_the_best_node(run: Callable[..., Running], cluster: FakeGateway) -> None:
    app = run()
    a = make_pod("a", gpu_request(vram=80 * GI, count=2))
    scores = app.post("/prioritize", args(a, "big", "small", "ghost"))
    assert scores == [{"Host": "big", "Score": 10}, {"Host": "small", "Score": 0}, {"Host": "ghost", "Score": 0}]
    assert app.post("/filter", args(make_pod("b", gpu_request(vram=GI)), "big"))["NodeNames"] == []


def test_prioritize_scores_every_node_binpack_prefers_the_fuller(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    cluster.put(Kind.NODE, make_node("big2", gpus=2, vram=80 * GI))
    cluster.put(Kind.POD, allocated_pod("x", "big2", grant("big2", 0, 40 * GI)))
    pod = make_pod("p", gpu_request(vram=4 * GI))
    binpack = run(policy="binpack")
    assert binpack.post("/prioritize", args(pod, "big", "big2")) == [
        {"Host": "big", "Score": 0},
        {"Host": "big2", "Score": 10},
    ]
    spread = run(policy="spread")
    assert spread.post("/prioritize", args(make_pod("q", gpu_request(vram=4 * GI)), "big", "big2"))[0]["Score"] == 10


def test_prioritize_checks_no_fit_the_filter_already_judged(
    run: Callable[..., Running], cluster: FakeGateway, checks: list[str]
) -> None:
    """One fit check per node per decision: prioritize scores the nodes the filter passed on the same node
    states, and judges only a node whose state changed since (here: none did)."""
    app = run(policy="binpack", decide_in_filter=False)
    pod = make_pod("p", gpu_request(vram=12 * GI))  # fits 'big' and 't4': the filter holds no room
    assert app.post("/filter", args(pod, *ALL))["NodeNames"] == ["big", "t4"]
    judged = sorted(checks)
    assert judged == ["big", "broken", "cpu-only", "small", "t4"]
    scores = {s["Host"]: s["Score"] for s in app.post("/prioritize", args(pod, *ALL))}
    assert sorted(checks) == judged  # none again
    assert scores == dict.fromkeys(ALL, 0) | {"t4": 10}  # binpack: the fuller of the two fits
    # prioritize alone (a pod the filter never saw) judges every node itself, and scores only the fits
    other = make_pod("q", gpu_request(vram=30 * GI))
    assert {s["Host"]: s["Score"] for s in app.post("/prioritize", args(other, *ALL))} == dict.fromkeys(ALL, 0) | {
        "big": 10
    }
    assert len(checks) == 2 * len(judged)


def test_a_cold_decision_gathers_the_packed_nodes_once(
    run: Callable[..., Running], fake: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over many nodes of many states the filter's fit check and the fragmentation policy's scoring read the
    nodes as arrays: the filter packs them into the policy's columns, so scoring gets the same arrays."""
    names = [f"n{i:03d}" for i in range(BATCH + 16)]
    for i, name in enumerate(names):
        fake.put(Kind.NODE, make_node(name, gpus=1 + i % 8, vram=(40 + i) * GI))  # a state of its own each
    gathered: list[tuple[object, object]] = []
    gather = Columns.gather

    def spy(columns: Columns, nodes: Sequence[NodeState]) -> tuple[Ints, Floats]:
        arrays = gather(columns, nodes)
        gathered.append(arrays)
        return arrays

    monkeypatch.setattr(Columns, "gather", spy)
    app = run()
    reply = app.post("/filter", args(make_pod("p", gpu_request(vram=4 * GI)), *names))
    assert reply["NodeNames"] and not reply["FailedNodes"] and not reply["FailedAndUnresolvableNodes"]
    assert len(gathered) == 2  # the fit check's and the scoring's
    assert gathered[1][0] is gathered[0][0] and gathered[1][1] is gathered[0][1]
    assert not app.ext.verbs.packed.kinds()  # the verbs' own columns: for policies that keep none


def test_a_new_workload_of_a_known_shape_is_judged_from_what_is_remembered(
    run: Callable[..., Running], cluster: FakeGateway, checks: list[str]
) -> None:
    """The memo is keyed by what the core reads of a demand, not by the pod's request text: another
    workload in another namespace asking the same shape is not a cold decision."""
    app = run(decide_in_filter=False)
    first = make_pod("a", gpu_request(vram=12 * GI, workload="train"))
    assert app.post("/filter", args(first, *ALL))["NodeNames"] == ["big", "t4"]
    judged = len(checks)
    assert judged == 5
    second = make_pod("b", gpu_request(vram=12 * GI, workload="serve"), namespace="other")
    assert app.post("/filter", args(second, *ALL))["NodeNames"] == ["big", "t4"]
    assert len(checks) == judged
    # another shape, or the same shape held to another model, is judged anew
    assert app.post("/filter", args(make_pod("c", gpu_request(vram=12 * GI, model="A100")), *ALL))["NodeNames"] == [
        "big"
    ]
    assert len(checks) == 2 * judged


def test_prioritize_ranks_a_node_handing_gpus_to_another_pod_below_the_free_ones(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    """a is likely bound to 'big' (its tentative reservation): b's bind there would wait at the node's gate."""
    cluster.put(Kind.NODE, make_node("big2", gpus=2, vram=80 * GI))
    app = run(policy="binpack")
    a, b = make_pod("a", gpu_request(vram=4 * GI)), make_pod("b", gpu_request(vram=4 * GI))
    assert app.post("/prioritize", args(a, "big", "big2")) == [
        {"Host": "big", "Score": 10},
        {"Host": "big2", "Score": 10},
    ]
    # binpack alone would rank 'big', fuller by a's hold, first
    assert app.post("/prioritize", args(b, "big", "big2")) == [
        {"Host": "big", "Score": 0},
        {"Host": "big2", "Score": 10},
    ]
    assert app.post("/prioritize", args(a, "big", "big2"))[0] == {"Host": "big", "Score": 10}  # its own hold
    # no free node: the policy's scores stand, and a bind waits at the gate
    assert app.post("/prioritize", args(make_pod("c", gpu_request(vram=4 * GI)), "big")) == [
        {"Host": "big", "Score": 10}
    ]


def preempt_args(pod: dict[str, Any], victims: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "Pod": pod,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for n, uids in victims.items()
        },
    }


def test_preempt_keeps_the_fewest_lower_qos_victims_and_vetoes_hopeless_nodes(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    cluster.put(Kind.POD, allocated_pod("low1", "small", grant("small", 0, 6 * GI)))
    cluster.put(Kind.POD, allocated_pod("low2", "small", grant("small", 1, 3 * GI)))
    crit = allocated_pod("crit", "big", grant("big", 0, 80 * GI), grant("big", 1, 80 * GI))
    crit["metadata"]["annotations"][SystemAnnotation.ALLOCATION] = crit["metadata"]["annotations"][
        SystemAnnotation.ALLOCATION
    ].replace('"low"', '"critical"')
    cluster.put(Kind.POD, crit)
    app = run()
    pod = make_pod("hi", gpu_request(vram=7 * GI, qos=Qos.HIGH))
    reply = app.post(
        "/preempt",
        preempt_args(
            pod, {"small": ["uid-default-low1", "uid-default-low2", "uid-default-web"], "big": ["uid-default-crit"]}
        ),
    )
    # small: evicting low2 (3Gi) frees GPU 1 enough; the scheduler's non-GPU victim 'web' stays in the plan
    assert reply == {
        "NodeNameToMetaVictims": {
            "small": {"Pods": [{"UID": "uid-default-low2"}, {"UID": "uid-default-web"}], "NumPDBViolations": 0}
        }
    }


def test_preempt_keeps_no_protected_victim_and_vetoes_a_node_left_without_one(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    """As above, but low2 (the smaller victim) asked for eviction-protection: low1 goes instead; with low1
    labelled do-not-disrupt too, the node is vetoed and kube-scheduler evicts nobody there."""
    low1 = allocated_pod("low1", "small", grant("small", 0, 6 * GI))
    low2 = allocated_pod("low2", "small", grant("small", 1, 3 * GI))
    protect(low2, seconds=1800)
    cluster.put(Kind.POD, low1)
    cluster.put(Kind.POD, low2)
    app = run()
    pod = make_pod("hi", gpu_request(vram=7 * GI, qos=Qos.HIGH))
    proposed = {"small": ["uid-default-low1", "uid-default-low2"]}
    assert app.post("/preempt", preempt_args(pod, proposed)) == {
        "NodeNameToMetaVictims": {"small": {"Pods": [{"UID": "uid-default-low1"}], "NumPDBViolations": 0}}
    }
    protect(low1, label=True)
    cluster.put(Kind.POD, low1)
    app.settle()
    assert app.post("/preempt", preempt_args(pod, proposed)) == {"NodeNameToMetaVictims": {}}


def test_preempt_echoes_the_plan_for_pods_without_gpu(run: Callable[..., Running], cluster: FakeGateway) -> None:
    app = run()
    body = preempt_args(make_pod("web"), {"small": ["u1"], "big": []})
    assert app.post("/preempt", body) == {
        "NodeNameToMetaVictims": {"small": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 0}}
    }


@pytest.mark.parametrize(
    ("path", "raw", "expected"),
    [
        ("/filter", b"{", {"Error"}),
        ("/filter", b'{"Pod": 3, "NodeNames": "x"}', {"Error"}),
        ("/filter", b'{"NodeNames": ["a"]}', {"Error"}),
        ("/bind", b"[1,2]", {"Error"}),
        ("/bind", b'{"PodName": 7}', {"Error"}),
        ("/prioritize", b"nonsense", None),
        ("/preempt", b'{"NodeNameToMetaVictims": {"a": {"Pods": [{"x": 1}]}}}', None),
    ],
)
def test_malformed_bodies_get_http_200(
    run: Callable[..., Running], cluster: FakeGateway, path: str, raw: bytes, expected: set[str] | None
) -> None:
    app = run()
    reply = app.client.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert reply.status_code == 200
    body = reply.json()
    if expected is not None:
        assert body["Error"]
    elif path == "/prioritize":
        assert body == []
    else:
        assert body == {"NodeNameToMetaVictims": {}}


class NeverSynced(FakeGateway):
    def list(self, kind: Kind) -> Listing:
        raise GatewayError("forbidden", 403)


def test_not_ready_until_the_first_lists_land() -> None:
    gateway = NeverSynced()
    with TestClient(create_app(Settings(backoff_max=0.05), gateway)) as client:
        assert client.get("/readyz").status_code == 503 and client.get("/healthz").status_code == 200
        reply = client.post("/filter", json=args(make_pod("p", gpu_request()), "n1")).json()
        assert "not synced" in reply["Error"]
        assert (
            "not synced"
            in client.post("/bind", json={"PodName": "p", "PodNamespace": "d", "PodUID": "u", "Node": "n"}).json()[
                "Error"
            ]
        )
        gateway.close()


def test_explain_a_pending_pod_and_a_submission(run: Callable[..., Running], cluster: FakeGateway) -> None:
    cluster.put(Kind.POD, make_pod("p", gpu_request(vram=12 * GI)))
    app = run()
    assert app.client.get("/readyz").json()["ready"] is True
    answer = app.client.get("/explain/default/p").json()
    assert answer["schedulable"] is True and answer["summary"].startswith("2/5 nodes")
    assert {n: v["verdict"] for n, v in answer["nodes"].items()} == {
        "big": "fits",
        "t4": "fits",
        "small": "unresolvable",  # 8Gi GPUs can never hold 12Gi
        "broken": "unresolvable",
        "cpu-only": "unresolvable",
    }
    assert answer["nodes"]["small"]["reason"] == "GPU-small-0 has 8Gi VRAM in all, pod requests 12Gi per GPU"
    assert app.client.get("/explain/default/nope").status_code == 404
    spec = {
        "metadata": {
            "name": "q",
            "labels": {LABEL_ENABLED: "true"},
            "annotations": {"tensor-fusion.ai/vram-request": "100Gi"},
        },
        "spec": {"containers": [{"name": "main"}]},
    }
    what_if = app.client.post("/explain", json=spec).json()
    assert what_if["schedulable"] is False and what_if["summary"].startswith("0/5 nodes")
    bad = {**spec, "metadata": {**spec["metadata"], "annotations": {"tensor-fusion.ai/vram-request": "lots"}}}
    assert app.client.post("/explain", json=bad).json()["admitted"] is False
    assert app.ext.cache.entries() == {}  # explaining reserves nothing


class TenantReviews:
    """The API server for explain's gate: token ``team-a`` may get and create pods in team-a only."""

    def token_review(self, body: dict[str, Any]) -> dict[str, Any]:
        known = body["spec"]["token"] == "team-a"
        user = {"username": "system:serviceaccount:team-a:app", "groups": ["system:serviceaccounts"]}
        return {"status": {"authenticated": known, **({"user": user} if known else {})}}

    def review(self, body: dict[str, Any]) -> dict[str, Any]:
        asked = body["spec"]["resourceAttributes"]
        return {"status": {"allowed": asked["namespace"] == "team-a" and asked["resource"] == "pods"}}


def test_explain_off_loopback_answers_only_who_may_read_that_namespace_s_pods(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    cluster.put(Kind.POD, make_pod("mine", gpu_request(vram=4 * GI), namespace="team-a"))
    cluster.put(Kind.POD, make_pod("theirs", gpu_request(vram=4 * GI), namespace="team-b"))
    client = run(access=Gate(TenantReviews())).client  # TestClient's peer is "testclient": off loopback

    def ask(path: str, token: str | None, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        answer = client.post(path, json=body, headers=headers) if body else client.get(path, headers=headers)
        return answer.status_code, answer.json()

    assert ask("/explain/team-a/mine", "team-a")[0] == 200
    code, body = ask("/explain/team-b/theirs", "team-a")
    assert code == 403 and "team-b" not in json.dumps({k: v for k, v in body.items() if k != "detail"})
    assert body["detail"].startswith('Forbidden: User "system:serviceaccount:team-a:app" cannot get resource "pods"')
    assert ask("/explain/team-b/theirs", None)[0] == 401 and ask("/explain/team-b/theirs", "forged")[0] == 401
    spec = {"metadata": {"name": "q", "namespace": "team-b", "labels": {LABEL_ENABLED: "true"}}, "spec": {}}
    assert ask("/explain", "team-a", spec)[0] == 403
    assert ask("/explain", "team-a", {**spec, "metadata": {**spec["metadata"], "namespace": "team-a"}})[0] == 200
    assert client.get("/healthz").status_code == 200  # no pod data: open


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"metadata": "q"}, "metadata 'q': must be an object, not a string"),
        (
            {"metadata": {"annotations": ["x"]}},
            "metadata.annotations \"['x']\": must be an object of strings, not an array",
        ),
        ({"metadata": {"labels": "x"}}, "metadata.labels 'x': must be an object of strings, not a string"),
        (
            {"metadata": {"annotations": {"tensor-fusion.ai/vram-request": 4}}},
            "metadata.annotations['tensor-fusion.ai/vram-request'] '4': must be a string, not a number",
        ),
        ({"metadata": {}, "spec": [1]}, "spec '[1]': must be an object, not an array"),
        ({"spec": {"containers": 3}}, "spec.containers '3': must be an array, not a number"),
        (
            {"metadata": {"labels": {"a": True}}, "spec": {"containers": {}}},
            "metadata.labels['a'] 'True': must be a string, not a boolean; spec.containers '{}': must be an array, not an object",
        ),
    ],
)
def test_explain_of_a_body_not_shaped_like_a_pod_is_422_naming_the_field(
    run: Callable[..., Running], cluster: FakeGateway, body: dict[str, Any], field: str
) -> None:
    response = run().client.post("/explain", json=body)
    assert response.status_code == 422
    assert response.json()["detail"] == f"not a Pod: {field}"


def test_local_gpu_affinity_does_not_cross_namespaces(run: Callable[..., Running], fake: FakeGateway) -> None:
    """A pod of workload "train" in team-a holds GPUs on 'home'; team-b's own "train" must not be drawn there."""
    fake.put(Kind.NODE, make_node("home", gpus=1, vram=80 * GI))
    fake.put(Kind.NODE, make_node("away", gpus=1, vram=80 * GI))
    fake.put(Kind.POD, allocated_pod("hog", "away", grant("away", 0, 60 * GI)))  # binpack alone prefers 'away'
    local = gpu_request(vram=4 * GI, workload="train", is_local_gpu=True)
    member = allocated_pod("train-0", "home", grant("home", 0, 4 * GI), namespace="team-a")
    member["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST] = resolved_contract.encode(local)
    fake.put(Kind.POD, member)
    app = run(policy="binpack")

    def scores(namespace: str) -> dict[str, int]:
        reply = app.post("/prioritize", args(make_pod("train-1", local, namespace=namespace), "home", "away"))
        return {s["Host"]: s["Score"] for s in reply}

    assert scores("team-a") == {"home": 10, "away": 0}
    assert scores("team-b") == {"home": 0, "away": 10}


def test_memoised_verdicts_follow_node_changes(run: Callable[..., Running], cluster: FakeGateway) -> None:
    """Replicas share a request text: a verdict is reused only while the node's state is unchanged."""
    app = run(decide_in_filter=False)
    same = gpu_request(vram=8 * GI, count=2)
    a, b = make_pod("a", same), make_pod("b", same)
    assert app.post("/filter", args(b, "small", "big"))["NodeNames"] == ["small", "big"]
    assert app.post("/filter", args(a, "small"))["NodeNames"] == ["small"]  # a holds all of 'small' now
    assert app.post("/filter", args(b, "small", "big"))["NodeNames"] == ["big"]
    cluster.put(Kind.POD, allocated_pod("hog", "big", grant("big", 1, 73 * GI)))  # b still holds 8Gi on GPU 0 and 1
    app.settle()
    reply = app.post("/filter", args(b, "small", "big"))
    assert reply["NodeNames"] == [] and set(reply["FailedNodes"]) == {"small", "big"}
    assert [e["Score"] for e in app.post("/prioritize", args(b, "small", "big"))] == [0, 0]


def test_filter_and_prioritize_wait_in_the_pool_while_the_cache_is_busy(
    run: Callable[..., Running], cluster: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    # They run on the event loop only when the cache's lock is free; when it is held (a relist, a bind)
    # they wait in the thread pool, so the loop keeps answering, and the answers are the uncontended ones.
    app = run()
    body = args(make_pod("p", gpu_request(vram=12 * GI, model="A100")), *ALL)
    expected = [app.post("/filter", body), app.post("/prioritize", body)]
    entered = threading.Event()
    verbs = app.ext.verbs
    original = verbs.filter

    def filter_entered(request: Any) -> Any:
        entered.set()
        return original(request)

    monkeypatch.setattr(verbs, "filter", filter_entered)
    replies: list[Any] = []
    posting = threading.Thread(
        target=lambda: replies.extend([app.post("/filter", body), app.post("/prioritize", body)])
    )
    with app.ext.cache.lock:
        posting.start()
        assert entered.wait(5)  # filter is in a worker thread, about to wait for the lock
        assert app.client.get("/healthz").json() == {"status": "ok"}  # the loop is free
        assert not replies
    posting.join(5)
    assert replies == expected


def test_memoised_replies_equal_the_cores_in_any_offered_order(
    run: Callable[..., Running], cluster: FakeGateway
) -> None:
    # filter and prioritize assemble their replies from the memo in C-level passes; whatever the order
    # of names (unknown ones included), the reply is the core's own verdict, in the offered order.
    app = run()
    pod = make_pod("p", gpu_request(vram=12 * GI, model="A100"))
    scheduled = scheduled_pod(pod)
    assert scheduled.request is not None
    demand = demand_from_request(scheduled.request, pod_key=scheduled.ref.key)
    shuffle = random.Random(7).shuffle
    for _ in range(6):
        names = list(ALL)
        shuffle(names)
        reply = app.post("/filter", args(pod, *names))
        core = filter_nodes(demand, app.ext.cache.snapshot(), names, app.ext.verbs.catalog)
        assert reply["NodeNames"] == list(core.passed)
        assert reply["FailedNodes"] == core.failed_messages()
        assert reply["FailedAndUnresolvableNodes"] == core.unresolvable_messages()
        assert list(reply["FailedAndUnresolvableNodes"]) == [n for n in names if n in core.unresolvable]
        policy = app.ext.verbs.policies.default
        raw = score_nodes(demand, app.ext.cache.snapshot(), names, policy, app.ext.verbs.catalog)  # before its hold
        wire = to_extender_scores(raw)
        scores = app.post("/prioritize", args(pod, *names))
        assert [s["Host"] for s in scores] == names
        assert {s["Host"]: s["Score"] for s in scores} == {n: wire.get(n, 0) for n in names}


def test_gpu_models_added_by_the_catalog_file_can_be_requested_by_alias(
    run: Callable[..., Running], fake: FakeGateway, tmp_path: Any
) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "- {key: ACME-X1, tflops: 50, memoryMiB: 32768, nvmlNames: [ACME X1 Accelerator], aliases: [x1]}\n"
    )
    fake.put(Kind.NODE, make_node("acme", gpus=1, model="ACME X1 Accelerator", vram=32 * GI, tflops=50_000))
    fake.put(Kind.NODE, make_node("a100", gpus=1, vram=80 * GI))
    pod = make_pod("p", gpu_request(vram=4 * GI, model="x1"))
    with_file = run(gpu_catalog=str(catalog)).post("/filter", args(pod, "acme", "a100"))
    assert with_file["NodeNames"] == ["acme"]
    without = run().post("/filter", args(pod, "acme", "a100"))  # the built-in catalog knows no alias x1
    assert without["NodeNames"] == []


def test_an_unusable_catalog_file_stops_the_extender_naming_it(fake: FakeGateway, tmp_path: Any) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("- {key: ACME-X1, tflops: fast}\n")
    with pytest.raises(CatalogFileError, match=r"catalog\.yaml\[0\]\.tflops 'fast'"):
        create_app(Settings(gpu_catalog=str(catalog)), fake)
