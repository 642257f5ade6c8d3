"""The extender's own preemption (GPU fragmentation) through the app: filter fails a critical pod on a node
whose totals fit it but no single GPU does; the preemptor evicts the fewest lower-QoS pods through the
Eviction API, honours PodDisruptionBudgets, nominates the node and holds the freed GPU for the pod."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from scheduler_extender import app as app_module
from scheduler_extender.gateway import Kind
from tests.scheduler_extender.conftest import Running, wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_cache import allocated_pod, grant
from vgpu.contract import allocation as allocation_contract
from vgpu.contract import resolved as resolved_contract
from vgpu.names import LABEL_DO_NOT_DISRUPT, Qos, SystemAnnotation
from vgpu.timefmt import rfc3339

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


def protect(pod: dict[str, Any], *, seconds: int | None = None, label: bool = False, ago: float = 0.0) -> None:
    """Granted ``ago`` seconds before now, with ``seconds`` of eviction-protection or the do-not-disrupt label."""
    ann = pod["metadata"]["annotations"]
    alloc = allocation_contract.decode(ann[SystemAnnotation.ALLOCATION])
    ann[SystemAnnotation.ALLOCATION] = allocation_contract.encode(replace(alloc, bound_at=rfc3339(time.time() - ago)))
    request = resolved_contract.decode(ann[SystemAnnotation.RESOLVED_REQUEST])
    ann[SystemAnnotation.RESOLVED_REQUEST] = resolved_contract.encode(replace(request, eviction_protection_s=seconds))
    if label:
        pod["metadata"]["labels"][LABEL_DO_NOT_DISRUPT] = "true"


def test_a_protected_pod_is_no_victim_while_its_protection_runs(
    run: Callable[..., Running], fragmented: FakeGateway
) -> None:
    """low-0 asked for 30 minutes of eviction-protection and got its GPU a minute ago: low-1 goes instead; low-1
    labelled do-not-disrupt as well leaves nobody to take; an expired protection protects nothing."""
    low0 = fragmented.pod("default", "low-0")
    protect(low0, seconds=1800, ago=60)
    fragmented.put(Kind.POD, low0)
    app = run()
    critical = waiting(fragmented, "critical", Qos.CRITICAL)
    filtered(app, critical)
    wait_for(lambda: outcomes(app).get("evicted"), what="a preemption")
    assert evictions(fragmented) == ["default/low-1"]


def test_nobody_is_taken_while_every_victim_is_protected_then_one_is_and_never_on_a_node_labelled_do_not_disrupt(
    run: Callable[..., Running], fragmented: FakeGateway
) -> None:
    for name, how in (("low-0", {"seconds": 600}), ("low-1", {"label": True})):
        pod = fragmented.pod("default", name)
        protect(pod, **how)  # type: ignore[arg-type]
        fragmented.put(Kind.POD, pod)
    app = run()
    filtered(app, waiting(fragmented, "wants-15", Qos.HIGH, 15))  # only a low pod may make room for it
    wait_for(lambda: outcomes(app).get("none"), what="a pass that found no victim")
    assert evictions(fragmented) == []
    for name in ("low-0", "low-1"):
        pod = fragmented.pod("default", name)
        protect(pod, seconds=60, ago=120)  # granted two minutes ago, protected for one: over
        pod["metadata"]["labels"].pop(LABEL_DO_NOT_DISRUPT, None)
        fragmented.put(Kind.POD, pod)
    app.settle()
    filtered(app, waiting(fragmented, "wants-15-again", Qos.HIGH, 15))
    wait_for(lambda: outcomes(app).get("evicted"), what="a preemption once the protection is over")
    assert len(evictions(fragmented)) == 1
    node = fragmented.objects[Kind.NODE][NODE]
    node["metadata"]["labels"][LABEL_DO_NOT_DISRUPT] = "true"  # an operator's: no pod there is taken
    fragmented.put(Kind.NODE, node)
    app.settle()
    assert filtered(app, waiting(fragmented, "wants-25", Qos.HIGH, 25)) == []  # only low-1's room would do
    wait_for(lambda: outcomes(app).get("none", 0) >= 2, what="a pass that found the node's pods protected")
    assert len(evictions(fragmented)) == 1


def test_a_pod_held_off_by_protection_is_planned_for_again_when_it_ends_without_being_asked(
    run: Callable[..., Running], fragmented: FakeGateway
) -> None:
    """The scheduler may not ask again for minutes (an unschedulable pod waits for a cluster event): the
    preemptor tries once more itself when the first protection in its way is over."""
    for name in ("low-0", "low-1"):
        pod = fragmented.pod("default", name)
        protect(pod, seconds=2, ago=0.5)  # over in 1.5 s
        fragmented.put(Kind.POD, pod)
    app = run()
    filtered(app, waiting(fragmented, "wants-15", Qos.HIGH, 15))  # asked once, never again
    wait_for(lambda: outcomes(app).get("none"), what="the pass held off by the protections")
    assert evictions(fragmented) == []
    wait_for(lambda: outcomes(app).get("evicted"), timeout=5.0, what="the pass once they are over")
    assert len(evictions(fragmented)) == 1
