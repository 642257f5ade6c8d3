"""The extender's own preemption (GPU fragmentation) through the app: filter fails a critical pod on a node
whose totals fit it but no single GPU does; the preemptor evicts the fewest lower-QoS pods through the
Eviction API, honours PodDisruptionBudgets, nominates the node and holds the freed GPU for the pod."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from scheduler_extender import app as app_module
from scheduler_extender.gateway import Kind
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_cache import allocated_pod, grant
from vgpu.names import Qos, SystemAnnotation

NODE = "frag"


def holding(name: str, qos: Qos, index: int, vram_gi: int) -> dict[str, Any]:
    """A Running pod of ``qos`` holding ``vram_gi`` of GPU ``index`` on the node."""
    pod = allocated_pod(name, NODE, grant(NODE, index, vram_gi * GI))
    text = pod["metadata"]["annotations"][SystemAnnotation.ALLOCATION]
    pod["metadata"]["annotations"][SystemAnnotation.ALLOCATION] = text.replace('"low"', f'"{qos}"')
    return pod


@pytest.fixture
def fragmented(fake: FakeGateway, monkeypatch: pytest.MonkeyPatch) -> FakeGateway:
    """Two 80Gi GPUs, each with a 50Gi high pod and a 20Gi low pod: 20Gi free on the node, 10Gi per GPU."""
    monkeypatch.setattr(app_module, "PREEMPTION_SETTLE", 0.0)
    fake.put(Kind.NODE, make_node(NODE, gpus=2, vram=80 * GI))
    for i in range(2):
        fake.put(Kind.POD, holding(f"high-{i}", Qos.HIGH, i, 50))
        fake.put(Kind.POD, holding(f"low-{i}", Qos.LOW, i, 20))
    return fake


def waiting(fake: FakeGateway, name: str, qos: Qos, vram_gi: int = 25) -> dict[str, Any]:
    pod = make_pod(name, gpu_request(vram=vram_gi * GI, qos=qos))
    fake.put(Kind.POD, pod)
    return pod


def filtered(app: Running, pod: dict[str, Any]) -> list[str]:
    reply = app.post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": [NODE]})
    names: list[str] = reply["NodeNames"]
    return names


def outcomes(app: Running) -> dict[str, float]:
    """Each preemption outcome's count (every outcome is shown from the start, at 0)."""
    text = app.client.get("/metrics").text
    prefix = 'tf_extender_preemptions_total{result="'
    return {
        line[len(prefix) :].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def evictions(fake: FakeGateway) -> list[str]:
    return [c.split()[1] for c in fake.calls if c.startswith("evict ")]


def test_a_critical_pod_evicts_one_low_pod_and_gets_the_gpu_it_freed(
    run: Callable[..., Running], fragmented: FakeGateway
) -> None:
    app = run()
    critical = waiting(fragmented, "critical", Qos.CRITICAL)
    assert filtered(app, critical) == []
    wait_for(lambda: outcomes(app).get("evicted"), what="a preemption")
    assert evictions(fragmented) == ["default/low-0"]  # one victim, the lowest QoS; high pods stay
    assert f"nominate default/critical {NODE}" in fragmented.calls
    assert fragmented.pod("default", "critical")["status"]["nominatedNodeName"] == NODE
    app.settle()
    # The freed GPU is the critical pod's: another pod of lower QoS that would fit there does not pass...
    assert filtered(app, waiting(fragmented, "medium", Qos.MEDIUM, 15)) == []
    # ...and the critical pod does, onto GPU 0.
    assert filtered(app, critical) == [NODE]
    app.ext.events.drain()
    reasons = {(e.pod_name, e.reason) for e in fragmented.events}
    assert ("low-0", "Preempted") in reasons and ("critical", "GpuPreemption") in reasons
    victim = next(e for e in fragmented.events if e.reason == "Preempted")
    assert "default/critical (qos critical)" in victim.message and victim.type == "Warning"
    # Asked again while its preemption holds, it evicts nobody else.
    filtered(app, critical)
    assert evictions(fragmented) == ["default/low-0"]


def test_a_pod_disruption_budget_refusal_moves_the_plan_to_another_victim(
    run: Callable[..., Running], fragmented: FakeGateway
) -> None:
    fragmented.protected = {"default/low-0"}
    app = run()
    critical = waiting(fragmented, "critical", Qos.CRITICAL)
    filtered(app, critical)
    wait_for(lambda: outcomes(app).get("blocked"), what="the refused eviction")
    assert "default/low-0" in fragmented.objects[Kind.POD]
    app.ext.events.drain()
    blocked = [e for e in fragmented.events if e.reason == "GpuPreemptionBlocked"]
    assert blocked and blocked[0].pod_name == "critical" and "disruption budget" in blocked[0].message
    filtered(app, critical)  # the scheduler's next attempt
    wait_for(lambda: outcomes(app).get("evicted"), what="a preemption of the other low pod")
    assert evictions(fragmented) == ["default/low-0", "default/low-1"]
    assert "default/low-0" in fragmented.objects[Kind.POD] and "default/low-1" not in fragmented.objects[Kind.POD]


@pytest.mark.parametrize(("qos", "vram_gi"), [(Qos.LOW, 15), (Qos.HIGH, 35)])
def test_nobody_of_equal_or_higher_qos_is_evicted(
    run: Callable[..., Running], fragmented: FakeGateway, qos: Qos, vram_gi: int
) -> None:
    """A low pod preempts nobody; a high one needing more than a low pod frees would need a high victim."""
    app = run()
    filtered(app, waiting(fragmented, "p", qos, vram_gi))
    if qos is Qos.LOW:
        app.ext.preemptor.run_due()
        assert set(outcomes(app).values()) == {0}  # no pass ran (every outcome is shown from the start)
    else:
        wait_for(lambda: outcomes(app).get("none"), what="a pass that found no plan")
    assert evictions(fragmented) == []


def test_kube_schedulers_own_preemption_is_left_alone(run: Callable[..., Running], fragmented: FakeGateway) -> None:
    app = run(preemption_hold=30)
    critical = waiting(fragmented, "critical", Qos.CRITICAL)
    filtered(app, critical)
    victims = {"NodeNameToMetaVictims": {NODE: {"Pods": [{"UID": "uid-default-low-1"}], "NumPDBViolations": 0}}}
    reply = app.post(
        "/preempt",
        {"Pod": critical, "NodeNameToVictims": None, "NodeNameToMetaVictims": victims["NodeNameToMetaVictims"]},
    )
    assert reply["NodeNameToMetaVictims"]
    app.ext.preemptor.run_due()
    assert evictions(fragmented) == []


def test_a_pod_bound_meanwhile_is_skipped_and_zero_hold_turns_it_off(
    run: Callable[..., Running], fragmented: FakeGateway
) -> None:
    app = run()
    critical = waiting(fragmented, "critical", Qos.CRITICAL)
    filtered(app, critical)
    bound = fragmented.pod("default", "critical")
    bound["spec"]["nodeName"] = "elsewhere"
    fragmented.put(Kind.POD, bound)
    wait_for(lambda: outcomes(app).get("skipped"), what="the skipped pass")
    assert evictions(fragmented) == []
    off = run(preemption_hold=0)
    filtered(off, waiting(fragmented, "other", Qos.CRITICAL))
    off.ext.preemptor.run_due()
    assert set(outcomes(off).values()) == {0} and evictions(fragmented) == []


def test_the_freed_gpu_is_held_from_the_moment_the_terminating_victim_is_gone(
    run: Callable[..., Running], fragmented: FakeGateway
) -> None:
    fragmented.graceful_evictions = True
    app = run()
    critical = waiting(fragmented, "critical", Qos.CRITICAL)
    filtered(app, critical)
    wait_for(lambda: outcomes(app).get("evicted"), what="a preemption")
    app.settle()
    assert filtered(app, critical) == []  # the victim still terminates on its GPU
    other = waiting(fragmented, "medium", Qos.MEDIUM, 15)
    assert filtered(app, other) == []
    fragmented.delete(Kind.POD, "default/low-0")
    app.settle()
    assert filtered(app, other) == []  # the room went to the critical pod's hold, not to whoever asks first
    assert filtered(app, critical) == [NODE]
    assert evictions(fragmented) == ["default/low-0"]
