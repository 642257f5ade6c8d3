"""The autoscaler's state and pass (vgpu/autoscale/evaluate.py): samples fed once, layers evaluated at their
own periods, pods and workloads forgotten when gone, cool-downs from any change of scale, checkpoints."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from vgpu.autoscale.config import parse
from vgpu.autoscale.evaluate import Autoscaler, Grant, Member, Sample, Workload, samples_of
from vgpu.autoscale.recommend import Reason
from vgpu.contract.usage import ContainerUsage, NodeUsage

T0 = 1_700_000_000.0
GI = 1024**3
CONFIG: dict[str, Any] = {
    "autoSetLimits": {
        "enable": True,
        "evaluationPeriod": "2s",
        "maxRatioToRequests": "3.0",
        "targetResource": "tflops",
    },
    "autoSetRequests": {
        "enable": True,
        "aggregationPeriod": "10s",
        "evaluationPeriod": "1s",
        "targetResource": "tflops",
    },
    "autoSetReplicas": {
        "enable": True,
        "evaluationPeriod": "2s",
        "targetTFlopsOfLimits": "50%",
        "scaleDownCoolDownTime": "30s",
    },
}


def grant(gpu: str = "GPU-a", limit: int = 20_000) -> Grant:
    return Grant(
        gpu=gpu,
        tflops_request=10_000,
        tflops_limit=limit,
        vram_request=GI,
        vram_limit=2 * GI,
        tflops_capacity=312_000,
        vram_capacity=80 * GI,
    )


def member(uid: str, limit: int = 20_000) -> Member:
    return Member(uid=uid, name=f"pod-{uid}", grants=(grant(f"GPU-{uid}", limit),), admitted_tflops_limit=20_000,
                  admitted_vram_limit=2 * GI)  # fmt: skip


def workload(*members: Member, replicas: int | None = None, name: str = "w") -> Workload:
    return Workload(
        namespace="ns",
        name=name,
        config=parse(CONFIG),
        members=members,
        tflops_request=10_000,
        tflops_limit=20_000,
        vram_request=GI,
        vram_limit=2 * GI,
        gpu_count=1,
        replicas=len(members) if replicas is None else replicas,
        min_replicas=1,
        max_replicas=5,
    )


def sample(uid: str, at: float, tflops: int = 19_800) -> Sample:
    return Sample(uid, f"GPU-{uid}", tflops, GI, True, at, 1.0, 20_000, 2 * GI)


def test_a_sample_is_counted_once_and_only_for_members() -> None:
    state, w = Autoscaler(), workload(member("a"))
    assert state.feed([sample("a", T0), sample("stranger", T0)], [w]) == 1
    assert state.feed([sample("a", T0)], [w]) == 0  # the plugin's same document read again
    assert state.feed([sample("a", T0 + 1)], [w]) == 1
    assert state.streams() == 1 and len(state) == 1


def test_gone_pods_and_workloads_are_forgotten() -> None:
    state = Autoscaler()
    a, b = member("a"), member("b")
    state.feed(
        [sample("a", T0), sample("b", T0), sample("c", T0)], [workload(a, b), workload(member("c"), name="other")]
    )
    assert state.streams() == 3 and len(state) == 2
    state.feed([], [workload(a)])
    assert state.streams() == 1 and len(state) == 1


def test_the_limits_layer_raises_at_its_period_and_repeats_its_decision_between() -> None:
    state, w = Autoscaler(), workload(member("a"))
    for i in range(3):
        state.feed([sample("a", T0 + i)], [w])
    first = state.evaluate(w, T0 + 2.5)
    (d,) = first.limits
    assert (d.tflops.reason, d.tflops.value) == (Reason.AT_MAX_RATIO, 30_000)  # pressed on: 2 × 20, capped at 3 × 10
    assert d.vram.reason is Reason.DISABLED and not d.vram.changed  # targetResource tflops
    # 1 s later the 2 s period has not passed: the same decision, not a new one.
    assert state.evaluate(w, T0 + 3.5).limits is first.limits
    assert state.evaluate(w, T0 + 4.6).limits is not first.limits


def test_a_vram_limit_is_raised_only_into_the_room_the_gpus_other_pods_leave() -> None:
    """A grant carries what the GPU's other pods hold (each its larger of VRAM request and limit): the limit stops
    there, and the requests layer's room is the same figure."""
    vram_config = {**CONFIG, "autoSetLimits": {**CONFIG["autoSetLimits"], "targetResource": "vram",
                                               "maxRatioToRequests": "100", "scaleUpStep": "10000%"}}  # fmt: skip
    held = replace(grant("GPU-a"), vram_limit=GI, vram_others=30 * GI)
    assert held.vram_room == 50 * GI and replace(held, vram_others=90 * GI).vram_room == 0
    m = Member(uid="a", name="pod-a", grants=(held,), admitted_tflops_limit=20_000, admitted_vram_limit=GI)
    w = replace(workload(m), config=parse(vram_config))
    state = Autoscaler()
    for i in range(3):
        state.feed([sample("a", T0 + i)], [w])  # 1Gi used: pressing on the 1Gi limit
    (d,) = state.evaluate(w, T0 + 2.5).limits
    assert (d.vram.reason, d.vram.value) == (Reason.CAPPED_BY_OTHER_PODS, 50 * GI)


def test_a_limit_is_lowered_only_on_a_window_of_samples_taken_under_it_the_first_excepted() -> None:
    """A raise from 8Gi to 16Gi: the window still holds the use pressing on 8Gi, and the first sample under 16Gi
    may still show it (the use follows a change late). Lowering back on those would undo the raise a period
    after it; it waits until the window holds only later samples under 16Gi, which then decide either way."""
    vram_config = {**CONFIG, "autoSetLimits": {**CONFIG["autoSetLimits"], "targetResource": "vram",
                                               "maxRatioToRequests": "100"}}  # fmt: skip

    def pod(limit: int) -> Workload:
        g = replace(grant("GPU-a"), vram_limit=limit)
        m = Member(uid="a", name="pod-a", grants=(g,), admitted_tflops_limit=20_000, admitted_vram_limit=GI)
        return replace(workload(m), config=parse(vram_config))

    def used(at: float, vram: int, limit: int) -> Sample:
        return Sample("a", "GPU-a", 0, vram, True, at, 1.0, 20_000, limit)

    state, before, after = Autoscaler(), pod(8 * GI), pod(16 * GI)
    for i in range(3):
        state.feed([used(T0 + i, 8 * GI, 8 * GI)], [before])
    (raised,) = state.evaluate(before, T0 + 2.5).limits
    assert (raised.vram.reason, raised.vram.value) == (Reason.LIMITS_RAISED, 16 * GI)
    # The allocation now says 16Gi; the plugin's next sample says so too, its use still at the old 8Gi.
    state.feed([used(T0 + 3, 8 * GI, 16 * GI)], [after])
    (waiting,) = state.evaluate(after, T0 + 4.6).limits
    assert (waiting.vram.reason, waiting.vram.value) == (Reason.WAITING_FOR_HISTORY, 16 * GI), waiting.vram.message
    assert "lowering waits for a window of samples all taken under it" in waiting.vram.message
    # Then the use follows (pressing on 16Gi: raised again), or it does not (lowered, now on evidence).
    pressed, idle = Autoscaler(), Autoscaler()
    for s in (pressed, idle):
        s.feed([used(T0 + i, 8 * GI, 8 * GI) for i in range(3)] + [used(T0 + 3, 8 * GI, 16 * GI)], [after])
    for i in range(4, 7):
        pressed.feed([used(T0 + i, 16 * GI, 16 * GI)], [after])
        idle.feed([used(T0 + i, 4 * GI, 16 * GI)], [after])
    (up,) = pressed.evaluate(after, T0 + 6.5).limits
    (down,) = idle.evaluate(after, T0 + 6.5).limits
    assert (up.vram.reason, up.vram.value) == (Reason.LIMITS_RAISED, 32 * GI)
    assert down.vram.reason is Reason.LIMITS_LOWERED and down.vram.value < 16 * GI, down.vram.message


def test_the_replicas_target_is_half_of_what_a_limit_may_reach_and_cool_downs_count_from_any_scale_change() -> None:
    state = Autoscaler()
    w = workload(member("a"), member("b"))
    for i in range(3):
        state.feed([sample("a", T0 + i, 2_000), sample("b", T0 + i, 2_000)], [w])
    ev = state.evaluate(w, T0 + 2.5)
    assert ev.replica_target_tflops == 15_000  # 50 % of 3 × 10 TFLOPS
    assert ev.replicas is not None and ev.replicas.reason is Reason.SCALED_DOWN  # 2 TFLOPS each: 1 replica is enough
    # Someone (the HPA) scaled to 3 since: the scale-down cool-down (30 s) counts from that change.
    scaled = replace(w, replicas=3)
    state.evaluate(scaled, T0 + 5)
    for i in range(3, 8):
        state.feed([sample("a", T0 + i, 2_000), sample("b", T0 + i, 2_000)], [scaled])
    ev = state.evaluate(scaled, T0 + 7.5)
    assert ev.replicas is not None and ev.replicas.reason is Reason.COOLING_DOWN, ev.replicas


def test_requests_wait_for_history_then_recommend_and_a_checkpoint_carries_the_history_over() -> None:
    state, w = Autoscaler(), workload(member("a"))
    state.feed([sample("a", T0, 6_000)], [w])
    assert state.evaluate(w, T0 + 0.5).requests_tflops.reason is Reason.WAITING_FOR_HISTORY  # type: ignore[union-attr]
    for i in range(1, 12):
        state.feed([sample("a", T0 + i, 6_000)], [w])
    ready = state.evaluate(w, T0 + 11.5).requests_tflops
    # p90 of a steady 6 TFLOPS × (1 + 0.15), the percentile at most one bucket (5 %) high.
    assert ready is not None and ready.reason is Reason.REQUESTS_LOWERED
    assert 6_000 * 1.15 <= ready.value <= 6_000 * 1.05 * 1.15
    checkpoint = state.checkpoint(w.key)
    assert checkpoint is not None
    text = json.dumps(checkpoint)

    restarted = Autoscaler()
    assert restarted.restore(text, w)
    restarted.feed([sample("a", T0 + 12, 6_000)], [w])
    again = restarted.evaluate(w, T0 + 12.5).requests_tflops
    assert again is not None and (again.reason, again.value) == (ready.reason, ready.value)
    # Another workload's, another aggregation period's or a damaged checkpoint is not taken.
    assert not Autoscaler().restore(text, replace(w, name="other"))
    longer = replace(
        w, config=parse({**CONFIG, "autoSetRequests": {**CONFIG["autoSetRequests"], "aggregationPeriod": "1h"}})
    )
    assert not Autoscaler().restore(text, longer)
    assert not Autoscaler().restore(text.replace('"weights"', '"weigths"'), w)
    fresh = Autoscaler()
    fresh.feed([sample("a", T0 + 12, 6_000)], [w])
    assert fresh.evaluate(w, T0 + 12.5).requests_tflops.reason is Reason.WAITING_FOR_HISTORY  # type: ignore[union-attr]


def test_samples_of_adds_a_pods_containers_on_one_gpu_and_keeps_unmeasured_tflops_unmeasured() -> None:
    def c(container: str, gpu: str, tflops: int, measured: bool = True) -> ContainerUsage:
        return ContainerUsage(namespace="ns", pod="p", pod_uid="u", container=container, gpu=gpu, tflops_used=tflops,
                              vram_used=GI, tflops_measured=measured, tflops_request=1, tflops_limit=1,
                              vram_request=1, vram_limit=1)  # fmt: skip

    doc = NodeUsage(node="n", sampled_at="x", interval_s=5.0,
                    containers=(c("a", "G1", 3_000), c("b", "G1", 4_000), c("a", "G2", 0, measured=False)))  # fmt: skip
    got = sorted(samples_of([(doc, T0)]), key=lambda s: s.gpu)
    assert got == [
        Sample("u", "G1", 7_000, 2 * GI, True, T0, 5.0, 1, 1),
        Sample("u", "G2", 0, GI, False, T0, 5.0, 1, 1),
    ]
