"""The usage histograms: VPA's buckets, percentiles, decay, peaks per interval, merging and checkpoints."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu.autoscale.histogram import (
    TFLOPS_BUCKETS,
    VRAM_BUCKETS,
    DecayingHistogram,
    PeakHistogram,
    SampleSpan,
    sample_weight,
    tflops_history,
    vram_history,
)
from vgpu.errors import DomainError

HOUR = 3600.0
B = TFLOPS_BUCKETS


def end_of(value: float) -> float:
    """What a percentile landing on ``value``'s bucket reports: the bucket's end."""
    return B.start(B.find(value) + 1)


def filled(samples: list[tuple[float, float, float]], half_life_s: float = HOUR) -> DecayingHistogram:
    h = DecayingHistogram(B, half_life_s=half_life_s)
    for value, weight, time_s in samples:
        h.add_sample(value, weight, time_s)
    return h


def test_bucket_counts_and_bounds_are_vpas() -> None:
    assert (B.count, VRAM_BUCKETS.count) == (176, 176)  # 5 % growth from 0.1 TFLOPS / 10 MB to 10,000 TFLOPS / 1 TB
    assert (B.start(1), VRAM_BUCKETS.start(1)) == (100.0, 1e7)
    assert B.start(B.count - 2) < 10_000_000 <= B.start(B.count - 1)  # the last bucket, open-ended, holds the max
    for bucket in range(2, B.count):
        width, before = B.start(bucket + 1) - B.start(bucket), B.start(bucket) - B.start(bucket - 1)
        assert math.isclose(width / before, 1.05)


@given(st.floats(0, 1e9, allow_nan=False))
def test_a_value_falls_in_the_bucket_that_holds_it(value: float) -> None:
    bucket = B.find(value)
    assert B.start(bucket) <= value * (1 + 1e-12)
    if bucket < B.count - 1:
        assert value < B.start(bucket + 1) * (1 + 1e-12)


def test_an_empty_histogram_has_percentile_zero() -> None:
    h = tflops_history(HOUR)
    assert h.is_empty() and h.percentile(0.9) == 0.0 and h.total_weight(0) == 0.0
    assert h.span == SampleSpan(0, None, None)


@pytest.mark.parametrize(
    ("samples", "p", "expected"),
    [
        ([(12_000, 1, 0)], 0.01, end_of(12_000)),
        ([(12_000, 1, 0)], 1.0, end_of(12_000)),
        ([(0, 1, 0)], 0.5, 100.0),  # idle: the first bucket's end, 0.1 TFLOPS
        ([(1_000, 1, 0)] * 10 + [(5_000, 1, 0)] * 10, 0.5, end_of(1_000)),
        ([(1_000, 1, 0)] * 10 + [(5_000, 1, 0)] * 10, 0.51, end_of(5_000)),
        ([(1_000, 9, 0), (5_000, 1, 0)], 0.9, end_of(1_000)),  # weights count, not sample numbers
        ([(1_000, 9, 0), (5_000, 1, 0)], 0.91, end_of(5_000)),
        ([(1_000, 1, 0), (5_000, 1, 2 * HOUR)], 0.5, end_of(5_000)),  # two half-lives later: 4 × the weight
        ([(1_000, 1, 0), (5_000, 1, 0)], 0.5, end_of(1_000)),  # the same pair at one time: even
        ([(20_000_000, 1, 0)], 0.5, B.start(B.count - 1)),  # past the last bucket: its start
    ],
)
def test_percentile(samples: list[tuple[float, float, float]], p: float, expected: float) -> None:
    assert filled(samples).percentile(p) == expected


SAMPLES = st.lists(
    st.tuples(st.floats(0, 1e7), st.floats(0.1, 100), st.floats(0, 1e6)), min_size=1, max_size=40
)  # (value, weight, time)


@given(SAMPLES, st.lists(st.floats(0, 1), min_size=2, max_size=10))
def test_percentile_is_monotone_and_bounded_by_the_samples(samples: list[Any], ps: list[float]) -> None:
    h = filled(samples)
    got = [h.percentile(p) for p in sorted(ps)]
    assert got == sorted(got)
    assert h.percentile(1.0) <= max(end_of(v) for v, _, _ in samples)


@pytest.mark.parametrize(("later", "weight"), [(0, 1.0), (HOUR, 0.5), (3 * HOUR, 0.125), (-HOUR, 2.0)])
def test_decay_halves_a_samples_weight_every_half_life(later: float, weight: float) -> None:
    h = filled([(5_000, 1.0, 10 * HOUR)])
    assert math.isclose(h.total_weight(10 * HOUR + later), weight)


def test_moving_the_reference_time_keeps_the_samples_relative_weights() -> None:
    h = filled([(1_000, 1.0, 0), (5_000, 1.0, 99 * HOUR)])
    h.add_sample(5_000, 1.0, 101 * HOUR)  # past 100 half-lives: the weights are rescaled
    assert math.isclose(h.total_weight(101 * HOUR), 1 + 2**-2 + 2**-101)
    h.add_sample(1_000, 1.0, 300 * HOUR)  # 199 half-lives on: the older samples weigh nothing now
    assert math.isclose(h.total_weight(300 * HOUR), 1.0)
    assert h.percentile(0.01) == end_of(1_000) and h.percentile(1.0) == end_of(1_000)


def test_sample_counts_and_times_are_kept_whatever_the_order() -> None:
    h = filled([(1, 1, 50), (1, 1, 10), (1, 1, 30)])
    assert (h.span.samples, h.span.first_s, h.span.last_s) == (3, 10, 50)


@pytest.mark.parametrize(
    ("value", "weight", "time_s"), [(-1, 1, 0), (1, -1, 0), (1, 1, -1), (math.nan, 1, 0), (1, math.inf, 0)]
)
def test_a_sample_must_be_finite_and_not_negative(value: float, weight: float, time_s: float) -> None:
    with pytest.raises(ValueError, match="a sample needs"):
        tflops_history(HOUR).add_sample(value, weight, time_s)


@given(SAMPLES, SAMPLES)
def test_merging_is_adding_every_sample_to_one_histogram(a: list[Any], b: list[Any]) -> None:
    merged, other = filled(a), filled(b)
    untouched = other.to_checkpoint()
    merged.merge(other)
    together = filled(a + b)
    assert other.to_checkpoint() == untouched
    assert merged.span == together.span
    last = max(t for _, _, t in a + b)
    assert math.isclose(merged.total_weight(last), together.total_weight(last), rel_tol=1e-9)
    # Rounding alone may tip a percentile that lies on a boundary: to the next bucket, or, where the weights
    # below and above it are exactly equal, across to the next bucket that holds weight (Hypothesis' example:
    # samples of 0 and 316 at one time, p50). So the merged percentile lies between the exact histogram's
    # percentiles a hair below and above p, give or take a bucket.
    eps = 1e-9
    for p in (0.1, 0.5, 0.9, 0.99):
        low, high = B.find(together.percentile(p - eps)), B.find(together.percentile(p + eps))
        assert low - 1 <= B.find(merged.percentile(p)) <= high + 1


def test_a_percentile_on_a_tie_between_distant_buckets_may_land_on_either() -> None:
    # Hypothesis' example: 0 and 316 weigh exactly alike at the last time, the p50 sits on the tie, and the
    # merged weights (rescaled from another reference time) differ from the direct ones in their last bits.
    a, b = [(0.0, 1.0, 630000.0), (316.0, 1.0, 986616.0)], [(0.0, 1.0, 986616.0)]
    merged = filled(a)
    merged.merge(filled(b))
    together = filled(a + b)
    tie = {B.find(together.percentile(0.5 - 1e-9)), B.find(together.percentile(0.5 + 1e-9))}
    assert B.find(merged.percentile(0.5)) in tie and len(tie) == 2


def test_merging_keeps_a_weight_too_light_to_widen_the_others_range() -> None:
    # Hypothesis' example: in ``b`` the old sample (14 half-lives back) is lighter than EPSILON, so b's range
    # ends before its bucket; in the merged histogram that bucket lies inside the range and must weigh in.
    a, b = [(316.0, 1.0, 50400.0)], [(0.0, 1.0, 50400.0), (100.0, 1.0, 0.0)]
    merged = filled(a)
    merged.merge(filled(b))
    assert merged.percentile(0.5) == filled(a + b).percentile(0.5) == B.start(2)


def test_only_histograms_of_one_kind_merge() -> None:
    with pytest.raises(ValueError, match="same buckets and half-life"):
        tflops_history(HOUR).merge(tflops_history(2 * HOUR))
    with pytest.raises(ValueError, match="same buckets and half-life"):
        DecayingHistogram(VRAM_BUCKETS, half_life_s=HOUR).merge(tflops_history(HOUR))


@given(SAMPLES)
def test_a_checkpoint_round_trips_through_json_exactly(samples: list[Any]) -> None:
    h = filled(samples)
    back = DecayingHistogram.from_checkpoint(json.loads(json.dumps(h.to_checkpoint())))
    assert back.to_checkpoint() == h.to_checkpoint()
    assert [back.percentile(p / 20) for p in range(21)] == [h.percentile(p / 20) for p in range(21)]
    h.add_sample(7_000, 1.0, 2e6)
    back.add_sample(7_000, 1.0, 2e6)
    assert back.to_checkpoint() == h.to_checkpoint()  # and both go on alike


def test_an_empty_checkpoint_round_trips() -> None:
    h = tflops_history(HOUR)
    assert DecayingHistogram.from_checkpoint(h.to_checkpoint()).to_checkpoint() == h.to_checkpoint()


def broken(**changes: Any) -> dict[str, Any]:
    doc = filled([(1_000, 1.0, 0)]).to_checkpoint()
    return {**doc, **changes}


CHECKPOINT_ERRORS: list[tuple[dict[str, Any], str]] = [
    (broken(version="v2"), "checkpoint.version 'v2': unsupported; this build reads v1"),
    (broken(weights={"176": 1.0}), "checkpoint.weights.176: must be a bucket from 0 to 175"),
    (broken(weights={"x": 1.0}), "checkpoint.weights.x: must be a bucket from 0 to 175"),
    (broken(weights={"3": -1.0}), "checkpoint.weights.3 '-1.0': must be a number above 0"),
    (broken(weights={"3": math.nan}), "checkpoint.weights.3 'nan': must be a number above 0"),
    (broken(weights={"3": "1"}), "checkpoint.weights.3 '1': must be a number above 0"),
    (broken(halfLifeSeconds=0), "checkpoint.halfLifeSeconds '0': must be a number above 0"),
    (broken(halfLifeSeconds=math.inf), "checkpoint.halfLifeSeconds 'inf': must be a number above 0"),
    (broken(totalWeight=-2), "checkpoint.totalWeight '-2': must be a number ≥ 0"),
    (broken(ratio=1), "checkpoint.ratio '1.0': must be above 1"),
    (broken(firstSampleTime="today"), "checkpoint.firstSampleTime 'today': must be a number ≥ 0 or null"),
    (broken(samples=-1), "checkpoint.samples '-1': must be ≥ 0"),
    (broken(colour="red"), "checkpoint.colour: unknown field"),
    ({k: v for k, v in broken().items() if k != "samples"}, "checkpoint.samples: missing"),
]


@pytest.mark.parametrize(("doc", "message"), CHECKPOINT_ERRORS)
def test_a_broken_checkpoint_is_refused_naming_the_field(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(DomainError) as caught:
        DecayingHistogram.from_checkpoint(doc)
    assert str(caught.value) == message


GB = 1e9


def peaks(samples: list[tuple[float, float]], interval_s: float = 10.0) -> PeakHistogram:
    h = PeakHistogram(VRAM_BUCKETS, half_life_s=1e9, interval_s=interval_s)
    for value, time_s in samples:
        h.add_sample(value, time_s)
    return h


def vram_end(value: float) -> float:
    return VRAM_BUCKETS.start(VRAM_BUCKETS.find(value) + 1)


@pytest.mark.parametrize(
    ("samples", "p", "expected"),
    [
        ([(5 * GB, 0), (9 * GB, 3), (7 * GB, 6)], 0.01, vram_end(9 * GB)),  # one interval: only its peak counts
        ([(5 * GB, 0), (9 * GB, 3), (7 * GB, 6), (4 * GB, 12)], 0.5, vram_end(4 * GB)),  # two peaks, even
        ([(5 * GB, 0), (9 * GB, 3), (7 * GB, 6), (4 * GB, 12)], 0.51, vram_end(9 * GB)),
        ([(5 * GB, 0), (4 * GB, 12), (3 * GB, 25), (2 * GB, 39)], 0.25, vram_end(2 * GB)),  # a peak per interval
        ([(5 * GB, 0), (9 * GB, 3), (7 * GB, 6), (4 * GB, 12), (8 * GB, 11)], 0.5, vram_end(4 * GB)),  # late: ignored
    ],
)
def test_vram_counts_one_peak_per_interval(samples: list[tuple[float, float]], p: float, expected: float) -> None:
    assert peaks(samples).percentile(p) == expected


def test_a_peak_histogram_counts_its_samples_and_ignores_late_ones() -> None:
    h = peaks([(5 * GB, 0), (9 * GB, 3), (4 * GB, 12), (8 * GB, 11)])
    assert (h.span.samples, h.span.first_s, h.span.last_s) == (3, 0, 12)


def test_a_peak_checkpoint_round_trips_and_goes_on_alike() -> None:
    h = peaks([(5 * GB, 0), (9 * GB, 3), (4 * GB, 12)])
    back = PeakHistogram.from_checkpoint(json.loads(json.dumps(h.to_checkpoint())))
    assert back.to_checkpoint() == h.to_checkpoint()
    for value, time_s in ((6 * GB, 14), (3 * GB, 31)):  # one raises the current interval's peak, one starts another
        h.add_sample(value, time_s)
        back.add_sample(value, time_s)
    assert back.to_checkpoint() == h.to_checkpoint()
    assert [back.percentile(p) for p in (0.3, 0.5, 1.0)] == [vram_end(3 * GB), vram_end(6 * GB), vram_end(9 * GB)]


def test_a_broken_peak_checkpoint_names_the_inner_field() -> None:
    doc = peaks([(5 * GB, 0)]).to_checkpoint()
    doc["histogram"]["version"] = "v0"
    with pytest.raises(DomainError, match=r"^checkpoint.histogram.version 'v0': unsupported"):
        PeakHistogram.from_checkpoint(doc)


def test_merged_peak_histograms_hold_both_peaks() -> None:
    a, b = peaks([(2 * GB, 0)]), peaks([(8 * GB, 0), (6 * GB, 15)])
    a.merge(b)
    assert (a.span.samples, a.span.first_s, a.span.last_s) == (3, 0, 15)
    assert a.percentile(0.3) == vram_end(2 * GB) and a.percentile(0.9) == vram_end(8 * GB)


def test_the_requests_layers_histograms_are_tied_to_the_aggregation_period() -> None:
    day = 86400.0
    assert tflops_history(day).half_life_s == day and tflops_history(day).buckets == TFLOPS_BUCKETS
    v = vram_history(day)
    assert (v.histogram.half_life_s, v.interval_s, v.histogram.buckets) == (day, day / 8, VRAM_BUCKETS)


@pytest.mark.parametrize(("request_milli", "weight"), [(10_000, 10.0), (500, 0.5), (50, 0.1), (0, 0.1)])
def test_a_tflops_sample_weighs_its_request_in_tflops_at_least_a_tenth(request_milli: int, weight: float) -> None:
    assert sample_weight(request_milli) == weight
