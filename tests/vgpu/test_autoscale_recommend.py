"""The three layers' decisions, case by case: caps, steps, the ignored range, cool-downs, confidence and missing samples.

Each table row is one situation a workload can be in, with the value and reason it must get; the messages users
read in events and the workload's status are checked where they carry numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu.autoscale.config import Resource, parse
from vgpu.autoscale.histogram import SampleSpan
from vgpu.autoscale.recommend import (
    Decision,
    Reason,
    limit_ceiling,
    recommend_limit,
    recommend_replicas,
    recommend_request,
)
from vgpu.autoscale.window import WindowStats

GI = 1024**3
DAY = 86400.0
NOW = 1_700_000_000.0
R = Reason


def usage(peak: float = 0.0, *, mean: float | None = None, coverage: float = 1.0, fresh: bool = True) -> WindowStats:
    return WindowStats(samples=12, mean=peak if mean is None else mean, peak=peak, coverage=coverage, fresh=fresh)


NOTHING = WindowStats(samples=0, mean=0.0, peak=0.0, coverage=0.0, fresh=False)


def limits(**fields: Any) -> Any:
    return parse({"autoSetLimits": {"enable": True, **fields}}).limits


# A row: its id, the layer's config fields, what differs from the table's usual situation, the usage seen,
# and the value, reason and (where it carries numbers) message the decision must have.
Case = tuple[str, dict[str, Any], dict[str, Any], Any, int, Reason, str | None]


def cases(rows: list[Case]) -> Any:
    return pytest.mark.parametrize("case", rows, ids=[row[0] for row in rows])


def expect(got: Decision, current: int, case: Case) -> None:
    _, _, _, _, value, reason, message = case
    assert (got.current, got.value, got.reason) == (current, value, reason)
    if message is not None:
        assert got.message == message


HOG: dict[str, Any] = {"request": GI, "admitted_limit": GI, "capacity": 80 * GI, "resource": Resource.VRAM}
# request 10 TFLOPS, admitted limit 10, GPU 312 TFLOPS unless a row says otherwise; defaults: buffer 0.15,
# ignored range 0.05, scaleUpStep 100 %, maxRatioToRequests 5 (a 50 TFLOPS ceiling).
LIMIT_CASES: list[Case] = [
    ("off", {"enable": False}, {}, usage(10_000), 10_000, R.DISABLED, "tflops limit is not auto-set"),
    ("another resource", {"targetResource": "vram"}, {}, usage(10_000), 10_000, R.DISABLED, None),
    ("no sample", {}, {}, NOTHING, 10_000, R.NO_SAMPLES, "tflops limit stays 10 TFLOPS: no recent usage sample"),
    ("stale samples change nothing", {}, {"limit": 40_000}, usage(1_000, fresh=False), 40_000, R.NO_SAMPLES, None),
    ("pressing: the full step", {}, {}, usage(10_000), 20_000, R.LIMITS_RAISED,
     "tflops limit raised to 20 TFLOPS: usage pressed on it (peak 10 TFLOPS)"),
    ("pressing within the ignored range of the limit", {}, {}, usage(9_600), 20_000, R.LIMITS_RAISED, None),
    ("pressing, a smaller step", {"scaleUpStep": "20%"}, {}, usage(10_000), 12_000, R.LIMITS_RAISED, None),
    ("pressing raises on partial samples", {}, {}, usage(10_000, coverage=0.2), 20_000, R.LIMITS_RAISED, None),
    ("towards peak × 1.15", {}, {"limit": 20_000}, usage(18_900), 21_735, R.LIMITS_RAISED,
     "tflops limit raised to 21.735 TFLOPS: peak 18.9 TFLOPS × (1 + 0.15)"),
    ("a raise inside the ignored range", {}, {"limit": 20_000}, usage(18_000), 20_000, R.INSIDE_IGNORED_RANGE,
     "tflops limit stays 20 TFLOPS: peak 18 TFLOPS × (1 + 0.15) is within ignoredDeltaRange 0.05"),
    ("the step limits a raise", {}, {}, usage(30_000), 20_000, R.LIMITS_RAISED,
     "tflops limit raised to 20 TFLOPS (scaleUpStep; usage pressed on it (peak 30 TFLOPS) wants 34.5 TFLOPS)"),
    ("a raise capped at the ratio", {}, {"limit": 40_000}, usage(40_000), 50_000, R.AT_MAX_RATIO,
     "tflops limit raised to 50 TFLOPS, capped at maxRatioToRequests 5 × the request, 50 TFLOPS; "
     "usage pressed on it (peak 40 TFLOPS)"),
    ("already at the ratio", {}, {"limit": 50_000}, usage(50_000), 50_000, R.AT_MAX_RATIO,
     "tflops limit stays 50 TFLOPS: at maxRatioToRequests 5 × the request, 50 TFLOPS, usage pressed on it "
     "(peak 50 TFLOPS) wants more"),
    ("a raise the GPU cannot hold", {}, {"limit": 20_000, "capacity": 30_000}, usage(20_000), 30_000,
     R.CAPPED_BY_GPU, "tflops limit raised to 30 TFLOPS, capped at what the GPU can hold, 30 TFLOPS; "
     "usage pressed on it (peak 20 TFLOPS)"),
    ("at what the GPU holds", {}, {"limit": 30_000, "capacity": 30_000}, usage(30_000), 30_000, R.CAPPED_BY_GPU,
     None),
    ("a higher ratio", {"maxRatioToRequests": "800%"}, {"limit": 50_000}, usage(50_000), 80_000, R.AT_MAX_RATIO,
     None),
    ("down when usage falls", {}, {"limit": 40_000}, usage(15_000), 17_250, R.LIMITS_LOWERED,
     "tflops limit lowered to 17.25 TFLOPS: peak 15 TFLOPS × (1 + 0.15)"),
    ("down no lower than admitted", {}, {"limit": 40_000}, usage(2_000), 10_000, R.LIMITS_LOWERED,
     "tflops limit lowered to 10 TFLOPS, the admitted limit: peak 2 TFLOPS × (1 + 0.15)"),
    ("down within the ignored range", {}, {"limit": 20_000}, usage(17_000), 20_000, R.INSIDE_IGNORED_RANGE, None),
    ("a wider ignored range", {"ignoredDeltaRange": "60%"}, {"limit": 40_000}, usage(15_000), 40_000,
     R.INSIDE_IGNORED_RANGE, None),
    ("not down on missing samples", {}, {"limit": 40_000}, usage(2_000, coverage=0.5), 40_000, R.NO_SAMPLES,
     "tflops limit stays 40 TFLOPS: only 50% of the window's samples are there; missing samples never lower "
     "anything"),
    ("down with one sample in ten missing", {}, {"limit": 40_000}, usage(2_000, coverage=0.9), 10_000,
     R.LIMITS_LOWERED, None),
    ("idle at the admitted limit", {}, {}, usage(5_000), 10_000, R.UNCHANGED, None),
    ("vram pressing", {}, {"request": 4 * GI, "limit": 4 * GI, "admitted_limit": 4 * GI, "capacity": 80 * GI,
                           "resource": Resource.VRAM}, usage(4 * GI), 8 * GI, R.LIMITS_RAISED,
     "vram limit raised to 8Gi: usage pressed on it (peak 4Gi)"),
    ("vram only in the target", {"targetResource": "vram"}, {"request": 4 * GI, "limit": 8 * GI,
     "admitted_limit": 4 * GI, "capacity": 80 * GI, "resource": Resource.VRAM}, usage(2 * GI), 4 * GI,
     R.LIMITS_LOWERED, None),
    ("no request, no limit to raise", {}, {"request": 0, "limit": 0, "admitted_limit": 0}, usage(500), 0,
     R.AT_MAX_RATIO, None),
    # VRAM is held: a limit is never raised past what the GPU's other pods hold (each its larger of request and
    # limit), so a neighbour's request stays guaranteed. The hog: request 1Gi, maxRatioToRequests 100.
    ("vram capped by what the other pods hold", {"maxRatioToRequests": "100"}, {**HOG, "limit": 32 * GI,
     "others": 30 * GI}, usage(32 * GI), 50 * GI, R.CAPPED_BY_OTHER_PODS,
     "vram limit raised to 50Gi, capped at what the GPU's other pods leave free, 50Gi (80Gi less the 30Gi they "
     "hold); usage pressed on it (peak 32Gi)"),
    ("vram at what the other pods leave", {"maxRatioToRequests": "100"}, {**HOG, "limit": 50 * GI,
     "others": 30 * GI}, usage(50 * GI), 50 * GI, R.CAPPED_BY_OTHER_PODS,
     "vram limit stays 50Gi: at what the GPU's other pods leave free, 50Gi (80Gi less the 30Gi they hold), usage "
     "pressed on it (peak 50Gi) wants more"),
    ("vram others over-committed: no raise, no forced lowering", {"maxRatioToRequests": "100"}, {**HOG,
     "limit": 50 * GI, "others": 40 * GI}, usage(50 * GI), 50 * GI, R.CAPPED_BY_OTHER_PODS, None),
    ("vram with the GPU to itself", {"maxRatioToRequests": "100"}, {**HOG, "limit": 64 * GI}, usage(64 * GI),
     80 * GI, R.CAPPED_BY_GPU, None),
    ("vram: the ratio binds before the other pods", {"maxRatioToRequests": "20"}, {**HOG, "limit": 16 * GI,
     "others": 30 * GI}, usage(16 * GI), 20 * GI, R.AT_MAX_RATIO, None),
]  # fmt: skip


@cases(LIMIT_CASES)
def test_limits(case: Case) -> None:
    _, fields, situation, seen, *_ = case
    at = {"request": 10_000, "limit": 10_000, "admitted_limit": 10_000, "capacity": 312_000, **situation}
    resource = at.pop("resource", Resource.TFLOPS)
    expect(recommend_limit(limits(**fields), resource, seen, **at), at["limit"], case)


def test_the_ceiling_the_replicas_layer_measures_against() -> None:
    assert limit_ceiling(limits(), request=10_000, capacity=312_000) == 50_000
    assert limit_ceiling(limits(), request=10_000, capacity=30_000) == 30_000
    assert limit_ceiling(limits(maxRatioToRequests="1.5"), request=333, capacity=312_000) == 500  # rounded up
    # What the GPU's other pods hold (VRAM) comes off its capacity; never below nothing.
    assert limit_ceiling(limits(maxRatioToRequests="100"), request=GI, capacity=80 * GI, others=30 * GI) == 50 * GI
    assert limit_ceiling(limits(maxRatioToRequests="100"), request=GI, capacity=80 * GI, others=90 * GI) == 0


@dataclass
class History:
    """A histogram as the requests layer sees it: its percentile fixed, the p asked for recorded."""

    value: float = 0.0
    span: SampleSpan = field(default_factory=lambda: SampleSpan(17_280, NOW - DAY, NOW))  # a day at 5 s
    empty: bool = False
    asked: float | None = None

    def is_empty(self) -> bool:
        return self.empty

    def percentile(self, p: float) -> float:
        self.asked = p
        return self.value


EMPTY = History(span=SampleSpan(), empty=True)

# request 10 TFLOPS, limit 40, GPU 312, 5-s samples; defaults: p90 × 1.15 over a 24 h aggregation period.
REQUEST_CASES: list[Case] = [
    ("off", {"enable": False}, {}, History(20_000), 10_000, R.DISABLED, "tflops request is not auto-set"),
    ("another resource", {"targetResource": "vram"}, {}, History(20_000), 10_000, R.DISABLED, None),
    ("no history", {}, {}, EMPTY, 10_000, R.NO_SAMPLES, "tflops request stays 10 TFLOPS: no recent usage sample"),
    ("samples stopped", {}, {}, History(2_000, SampleSpan(17_280, NOW - DAY, NOW - 11)), 10_000, R.NO_SAMPLES, None),
    ("too short a history", {}, {}, History(2_000, SampleSpan(8_640, NOW - DAY / 2, NOW)), 10_000, R.WAITING_FOR_HISTORY,
     "tflops request stays 10 TFLOPS: 12h of history, 1d (aggregationPeriod) needed"),
    ("too few samples over the day", {}, {}, History(2_000, SampleSpan(8_640, NOW - DAY, NOW)), 10_000, R.WAITING_FOR_HISTORY,
     "tflops request stays 10 TFLOPS: 12h of history, 1d (aggregationPeriod) needed"),
    ("a shorter aggregation period", {"aggregationPeriod": "12h"}, {}, History(2_000, SampleSpan(8_640, NOW - DAY, NOW)), 2_300,
     R.REQUESTS_LOWERED, None),
    ("up to p90 × 1.15", {}, {}, History(20_000), 23_000, R.REQUESTS_RAISED,
     "tflops request raised to 23 TFLOPS: p90 20 TFLOPS × (1 + 0.15)"),
    ("down to p90 × 1.15", {}, {}, History(2_000), 2_300, R.REQUESTS_LOWERED, None),
    ("another percentile and buffer", {"percentileForAutoRequests": "99%", "extraBufferRatio": "0"}, {},
     History(12_000), 12_000, R.REQUESTS_RAISED, "tflops request raised to 12 TFLOPS: p99 12 TFLOPS × (1 + 0)"),
    ("within 10 %", {}, {}, History(9_000), 10_000, R.INSIDE_IGNORED_RANGE,
     "tflops request stays 10 TFLOPS: p90 9 TFLOPS × (1 + 0.15), within 10 %"),
    ("capped by the limit", {}, {}, History(40_000), 40_000, R.CAPPED_BY_LIMIT,
     "tflops request raised to 40 TFLOPS, capped there; p90 40 TFLOPS × (1 + 0.15)"),
    ("already at the limit", {}, {"request": 40_000}, History(40_000), 40_000, R.CAPPED_BY_LIMIT, None),
    ("capped by the GPU", {}, {"capacity": 30_000}, History(40_000), 30_000, R.CAPPED_BY_GPU, None),
    ("vram", {}, {"resource": Resource.VRAM, "request": 8 * GI, "limit": 16 * GI, "capacity": 80 * GI},
     History(2 * GI), 2_469_606_196, R.REQUESTS_LOWERED, "vram request lowered to 2.3Gi: p90 2Gi × (1 + 0.15)"),
]  # fmt: skip


@cases(REQUEST_CASES)
def test_requests(case: Case) -> None:
    _, fields, situation, history, _, reason, _ = case
    config = parse({"autoSetRequests": {"enable": True, **fields}}).requests
    at = {"request": 10_000, "limit": 40_000, "capacity": 312_000, **situation}
    resource = at.pop("resource", Resource.TFLOPS)
    history = replace(history)
    expect(recommend_request(config, resource, history, **at, now_s=NOW, sample_interval_s=5.0), at["request"], case)
    if reason in (R.REQUESTS_RAISED, R.REQUESTS_LOWERED):
        assert history.asked == float(config.percentile)


# 2 replicas, each limit may reach 20 TFLOPS (target 80 %: 16 TFLOPS per replica); defaults: steps 100 %,
# cool-downs 0 s up and 5 m down; never scaled before unless a row says when.
REPLICA_CASES: list[Case] = [
    ("off", {"enable": False}, {}, usage(mean=30_000), 2, R.DISABLED, "replicas are not auto-set"),
    ("no sample", {}, {}, NOTHING, 2, R.NO_SAMPLES, "replicas stay 2: no recent usage sample"),
    ("stale", {}, {}, usage(mean=1_000, fresh=False), 2, R.NO_SAMPLES, None),
    ("no limit to measure against", {}, {"max_limit": 0}, usage(mean=1_000), 2, R.UNCHANGED, None),
    ("within HPA's tolerance", {}, {}, usage(mean=17_000), 2, R.INSIDE_IGNORED_RANGE,
     "replicas stay 2: 17 TFLOPS per replica against a target of 80 % of 20 TFLOPS, within 10 %"),
    ("up to what the usage needs", {}, {}, usage(mean=24_000), 3, R.SCALED_UP,
     "replicas scaled up to 3: 24 TFLOPS per replica against a target of 80 % of 20 TFLOPS"),
    ("up by at most the step", {"scaleUpStep": "1"}, {}, usage(mean=40_000), 3, R.SCALED_UP, None),
    ("up by a percentage step", {"scaleUpStep": "50%"}, {"replicas": 4}, usage(mean=48_000), 6, R.SCALED_UP, None),
    ("up on partial samples", {}, {}, usage(mean=24_000, coverage=0.3), 3, R.SCALED_UP, None),
    ("up to at most max", {}, {"replicas": 3, "max_replicas": 3}, usage(mean=32_000), 3, R.UNCHANGED,
     "replicas stay 3 (between 1 and 3): 32 TFLOPS per replica against a target of 80 % of 20 TFLOPS"),
    ("cooling down before going up", {"scaleUpCoolDownTime": "5m"}, {"last_scaled_s": NOW - 60},
     usage(mean=24_000), 2, R.COOLING_DOWN, "replicas stay 2 for 4m (scaleUpCoolDownTime); 24 TFLOPS per replica "
     "against a target of 80 % of 20 TFLOPS"),
    ("the cool-down over", {"scaleUpCoolDownTime": "5m"}, {"last_scaled_s": NOW - 300}, usage(mean=24_000), 3,
     R.SCALED_UP, None),
    ("down to what the usage needs", {}, {"replicas": 4}, usage(mean=4_000), 1, R.SCALED_DOWN,
     "replicas scaled down to 1: 4 TFLOPS per replica against a target of 80 % of 20 TFLOPS"),
    ("down by at most the step", {"scaleDownStep": "1"}, {"replicas": 4}, usage(mean=4_000), 3, R.SCALED_DOWN, None),
    ("down no lower than min", {}, {"replicas": 4, "min_replicas": 2}, usage(mean=4_000), 2, R.SCALED_DOWN, None),
    ("cooling down before going down", {}, {"replicas": 4, "last_scaled_s": NOW - 100}, usage(mean=4_000), 4,
     R.COOLING_DOWN, "replicas stay 4 for 3m20s (scaleDownCoolDownTime); 4 TFLOPS per replica against a target of "
     "80 % of 20 TFLOPS"),
    ("not down on missing samples", {}, {"replicas": 4}, usage(mean=4_000, coverage=0.5), 4, R.NO_SAMPLES,
     "replicas stay 4: only 50% of the window's samples are there; missing samples never lower anything"),
    ("up to min", {}, {"replicas": 1, "min_replicas": 3}, usage(mean=1_000), 2, R.SCALED_UP, None),
]  # fmt: skip


@cases(REPLICA_CASES)
def test_replicas(case: Case) -> None:
    _, fields, situation, seen, *_ = case
    config = parse({"autoSetReplicas": {"enable": True, **fields}}).replicas
    at = {"replicas": 2, "max_limit": 20_000, "last_scaled_s": None, **situation}
    expect(recommend_replicas(config, seen, **at, now_s=NOW), at["replicas"], case)


def test_a_decision_says_whether_it_changes_anything() -> None:
    assert Decision(2, 3, R.SCALED_UP, "").changed and not Decision(2, 2, R.COOLING_DOWN, "").changed


AMOUNT = st.integers(0, 400_000)
INCOMPLETE = st.builds(
    WindowStats, samples=st.integers(0, 100), mean=st.floats(0, 1e6), peak=st.floats(0, 1e6),
    coverage=st.floats(0, 0.89), fresh=st.booleans(),
) | st.builds(
    WindowStats, samples=st.integers(0, 100), mean=st.floats(0, 1e6), peak=st.floats(0, 1e6),
    coverage=st.floats(0, 1), fresh=st.just(False),
)  # fmt: skip


@given(INCOMPLETE, AMOUNT, AMOUNT, AMOUNT, st.integers(1, 50), st.integers(1, 100))
def test_missing_samples_never_lower_anything(
    seen: WindowStats, request: int, extra: int, capacity: int, replicas: int, max_limit: int
) -> None:
    limit = request + extra
    got = recommend_limit(limits(), Resource.TFLOPS, seen, request=request, limit=limit, admitted_limit=request,
                          capacity=capacity)  # fmt: skip
    assert got.value >= limit
    config = parse({"autoSetReplicas": {"enable": True}}).replicas
    scaled = recommend_replicas(config, seen, replicas=replicas, max_limit=max_limit * 1000, last_scaled_s=None,
                                now_s=NOW)  # fmt: skip
    assert scaled.value >= replicas
    stale = History(0.0, SampleSpan(17_280, NOW - DAY, NOW - 60))
    requests = parse({"autoSetRequests": {"enable": True}}).requests
    kept = recommend_request(requests, Resource.TFLOPS, stale, request=request, limit=limit, capacity=capacity,
                             now_s=NOW, sample_interval_s=5.0)  # fmt: skip
    assert kept.value == request


@given(
    st.builds(WindowStats, samples=st.integers(1, 100), mean=st.floats(0, 1e6), peak=st.floats(0, 1e6),
              coverage=st.floats(0, 1), fresh=st.just(True)),
    AMOUNT, AMOUNT, AMOUNT, st.sampled_from([Resource.TFLOPS, Resource.VRAM]),
)  # fmt: skip
def test_a_window_not_all_under_the_limit_in_force_never_lowers_it_and_may_still_raise_it(
    seen: WindowStats, request: int, extra: int, capacity: int, resource: Resource
) -> None:
    """Samples from under another limit (or the first under this one) say nothing of the use under it: they
    never lower it, and the same decision is made on them where it is not a lowering."""
    limit = request + extra
    config = limits(targetResource="all")

    def decided(settled: bool) -> Decision:
        return recommend_limit(config, resource, seen, request=request, limit=limit, admitted_limit=request,
                               capacity=capacity, settled=settled)  # fmt: skip

    got, free = decided(False), decided(True)
    assert got.value == max(free.value, limit)
    if free.value < limit:
        assert got.reason is R.WAITING_FOR_HISTORY
        assert "lowering waits for a window of samples all taken under it" in got.message
    if free.value > limit:
        assert got == free


@given(
    st.builds(WindowStats, samples=st.integers(1, 100), mean=st.floats(0, 1e6), peak=st.floats(0, 1e6),
              coverage=st.floats(0, 1), fresh=st.just(True)),
    AMOUNT, AMOUNT, AMOUNT, AMOUNT, AMOUNT, st.sampled_from(["100%", "3.0", "100"]),
)  # fmt: skip
def test_a_vram_limit_is_never_raised_past_what_the_other_pods_leave_free(
    seen: WindowStats, request: int, over: int, capacity: int, others: int, admitted_over: int, ratio: str
) -> None:
    """The guarantee of a VRAM request: a raise never takes the pod's limit above the GPU's memory less what its
    other pods hold (each its larger of request and limit), whatever the usage, ratio or step."""
    config = limits(maxRatioToRequests=ratio, scaleUpStep="1000%")
    limit = request + over
    got = recommend_limit(config, Resource.VRAM, seen, request=request, limit=limit,
                          admitted_limit=min(request + admitted_over, limit), capacity=capacity, others=others)  # fmt: skip
    if got.value > limit:
        assert got.value + others <= capacity
        assert got.reason in (R.LIMITS_RAISED, R.AT_MAX_RATIO, R.CAPPED_BY_OTHER_PODS, R.CAPPED_BY_GPU)
        if got.value + others == capacity < request * config.max_ratio_to_requests and others:
            assert got.reason is R.CAPPED_BY_OTHER_PODS


@given(
    st.builds(WindowStats, samples=st.integers(1, 100), mean=st.floats(0, 1e6), peak=st.floats(0, 1e6),
              coverage=st.floats(0, 1), fresh=st.just(True)),
    AMOUNT, AMOUNT, AMOUNT, AMOUNT, st.sampled_from(["5%", "100%", "3.0"]),
)  # fmt: skip
def test_a_limit_moves_within_its_bounds(
    seen: WindowStats, request: int, over: int, admitted_over: int, capacity: int, step: str
) -> None:
    config = limits(scaleUpStep=step)
    limit, admitted = request + over, request + admitted_over
    got = recommend_limit(config, Resource.TFLOPS, seen, request=request, limit=limit, admitted_limit=admitted,
                          capacity=capacity)  # fmt: skip
    if got.value > limit:  # a raise: by at most the step (or one unit), never past the ceiling
        assert got.value <= max(int(limit * (1 + config.scale_up_step)), limit + 1)
        assert got.value <= limit_ceiling(config, request=request, capacity=capacity)
    if got.value < limit:  # a fall: on complete samples, never below what the pod was admitted with
        assert seen.coverage >= 0.9 and got.value >= max(admitted, request)
