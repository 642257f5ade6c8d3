"""The recent-usage window: peak and mean over one evaluation period, and how complete its samples are."""

from __future__ import annotations

import pytest

from vgpu.autoscale.window import UsageWindow, WindowStats, is_fresh

T0 = 1_700_000_000.0


def window_of(times: list[float], value: float = 1_000.0, length_s: float = 60.0) -> UsageWindow:
    w = UsageWindow(length_s)
    for t in times:
        w.add_sample(value, T0 + t)
    return w


EVERY_5S = [float(t) for t in range(0, 61, 5)]


def test_peak_and_mean_over_the_window() -> None:
    w = UsageWindow(60.0)
    for t, value in ((10, 2_000.0), (15, 8_000.0), (20, 5_000.0)):
        w.add_sample(value, T0 + t)
    got = w.stats(T0 + 20, interval_s=5)
    assert (got.samples, got.mean, got.peak, got.fresh) == (3, 5_000.0, 8_000.0, True)
    assert got.coverage == pytest.approx(3 / 11)  # sampling began 10 s ago: the rest of the window is missing


def test_old_samples_leave_the_window() -> None:
    w = UsageWindow(60.0)
    w.add_sample(9_000.0, T0)
    for t in range(62, 121, 5):
        w.add_sample(1_000.0, T0 + t)
    got = w.stats(T0 + 120, interval_s=5)
    assert (got.samples, got.peak, got.mean) == (12, 1_000.0, 1_000.0)
    assert w.stats(T0 + 500, interval_s=5) == WindowStats(samples=0, mean=0.0, peak=0.0, coverage=0.0, fresh=False)


@pytest.mark.parametrize("phase", [0.0, 0.5, 1.9, 2.0, 2.1, 3.3, 4.99])
def test_a_complete_window_is_fully_covered_whatever_the_phase(phase: float) -> None:
    for since_last in (0.0, 2.5, 4.9):
        w = window_of([phase + t for t in range(0, 200, 5)])
        assert w.stats(T0 + phase + 195 + since_last, interval_s=5).coverage == 1.0


# At T0 + 60 the window's 30 slots of 2 s span the last 58 s, which promise 11 samples at 5 s.
@pytest.mark.parametrize(
    ("times", "streams", "coverage"),
    [
        (EVERY_5S, 1, 1.0),
        (EVERY_5S[::2], 1, 6 / 11),  # every other sample lost
        (EVERY_5S[-3:], 1, 3 / 11),  # the plugin came back 10 s ago
        (EVERY_5S, 2, 12 / 22),  # two replicas were promised, one reported
    ],
)
def test_coverage_counts_missing_samples(times: list[float], streams: int, coverage: float) -> None:
    assert window_of(times).stats(T0 + 60, interval_s=5, streams=streams).coverage == pytest.approx(coverage)


@pytest.mark.parametrize(("age", "fresh"), [(0, True), (10, True), (10.01, False), (300, False)])
def test_a_window_is_fresh_while_its_newest_sample_is_at_most_two_intervals_old(age: float, fresh: bool) -> None:
    assert window_of([30.0]).stats(T0 + 30 + age, interval_s=5).fresh is fresh
    assert is_fresh(T0, T0 + age, 5) is fresh


def test_is_fresh_without_a_sample() -> None:
    assert is_fresh(None, T0, 5) is False


def test_a_sample_older_than_its_ring_position_is_dropped() -> None:
    w = window_of([100.0], value=1_000.0)
    w.add_sample(50_000.0, T0 + 40.0)  # the same ring position, one lap earlier
    got = w.stats(T0 + 100, interval_s=5)
    assert (got.samples, got.peak) == (1, 1_000.0)


@pytest.mark.parametrize(("value", "time_s"), [(-1.0, T0), (1.0, -1.0), (float("nan"), T0), (1.0, float("inf"))])
def test_a_sample_must_be_finite_and_not_negative(value: float, time_s: float) -> None:
    with pytest.raises(ValueError, match="a sample needs"):
        UsageWindow(60.0).add_sample(value, time_s)


@pytest.mark.parametrize(("length_s", "slots"), [(0.0, 30), (60.0, 0)])
def test_a_window_needs_a_length_and_slots(length_s: float, slots: int) -> None:
    with pytest.raises(ValueError, match="a window needs"):
        UsageWindow(length_s, slots=slots)


def test_a_window_begins_after_a_time_once_that_times_slot_has_left_it() -> None:
    w = UsageWindow(60.0)  # 30 slots of 2 s
    assert not w.begins_after(T0 + 10, T0 + 10)
    assert not w.begins_after(T0 + 10, T0 + 69.9)  # the slot of T0 + 10 ([10, 12)) is still the oldest
    assert w.begins_after(T0 + 10, T0 + 72)  # the oldest slot is [12, 14)
    assert not w.begins_after(T0 + 12.0, T0 + 71.9)  # [12, 14) is the oldest slot now
