"""The openb protocol's mechanics on tiny synthetic traces: order, inflation/trim, ranks, binning."""

from __future__ import annotations

from benchmarks.placement.protocol import INFLATION, curve, prepare, stat
from benchmarks.placement.traces import TracePod


def pod(name: str, milli: int = 500, count: int = 1, cpu: int = 1000) -> TracePod:
    return TracePod(name, cpu, 1024, count, milli)


PODS = [pod(f"p{i:02d}", milli=100 * (1 + i % 9)) for i in range(20)]


def test_same_seed_same_sequence_and_input_order_does_not_matter() -> None:
    a = prepare(PODS, 5, 10_000, 42)
    b = prepare(list(reversed(PODS)), 5, 10_000, 42)
    assert a == b
    c = prepare(PODS, 5, 10_000, 43)
    assert c.pods != a.pods


def test_shuffle_keeps_every_original_pod_first() -> None:
    w = prepare(PODS, 5, 10_000, 7)
    assert sorted(p.name for p in w.pods[: len(PODS)]) == sorted(p.name for p in PODS)


def test_inflation_stops_at_the_first_draw_that_would_pass_the_target() -> None:
    capacity = 10_000
    w = prepare(PODS, 5, capacity, 42)
    total = sum(p.gpu_request for p in w.pods)
    target = INFLATION * capacity
    assert total <= target
    assert total > target - max(p.gpu_request for p in PODS)
    assert all(p in PODS for p in w.pods)  # copies drawn from the original list


def test_cpu_only_pods_never_stop_inflation() -> None:
    pods = [pod("a", milli=1000), TracePod("cpu", 4000, 1024, 0, 0)]
    w = prepare(pods, 2, 5_000, 1)
    assert sum(p.gpu_request for p in w.pods) == 6_000  # 6 × 1000 ≤ 6500 < 7 × 1000


def test_a_trace_above_the_target_loses_pods_until_it_is_not() -> None:
    pods = [pod(f"p{i}", milli=1000) for i in range(30)]  # 30 GPUs of demand for a 10-GPU cluster
    w = prepare(pods, 3, 10_000, 5)
    assert sum(p.gpu_request for p in w.pods) == 13_000
    assert len(w.pods) == 13


def test_ranks_are_a_seeded_permutation_of_the_nodes() -> None:
    a, b = prepare(PODS, 50, 10_000, 42), prepare(PODS, 50, 10_000, 42)
    assert sorted(a.ranks) == list(range(50))
    assert a.ranks == b.ranks
    assert prepare(PODS, 50, 10_000, 44).ranks != a.ranks


def test_dropped_pods_count_as_arrived_and_events_are_averaged_per_bin() -> None:
    c = curve([500, 500, 300], [True, False, True], capacity=1000)
    assert c.allocated == {50: 50.0, 100: 50.0, 130: 80.0}
    assert c.unallocated(100) == 50.0
    assert c.unallocated(120) is None
    assert (c.placed, c.dropped) == (2, 1)


def test_bins_round_half_up_and_average_every_event_in_them() -> None:
    # arrived 0.5 % → bin 1; arrived 1.0 % and 1.4 % → bin 1 too; CPU-only pods (0) are events too
    c = curve([5, 5, 0, 4], [True, False, True, True], capacity=1000)
    assert set(c.allocated) == {1}
    assert c.allocated[1] == (0.5 + 0.5 + 0.5 + 0.9) / 4


def test_stat_is_mean_and_sample_sd() -> None:
    s = stat([1.0, 2.0, 3.0])
    assert (s.mean, s.sd, s.n) == (2.0, 1.0, 3)
    assert stat([4.0]).sd == 0.0
