"""The GPU-bin floor LP on instances whose optimum is known by hand."""

from __future__ import annotations

import pytest

from benchmarks.placement.floor import _knapsack, arrived_prefix, floor_unallocated, fractional_pack
from benchmarks.placement.traces import TracePod


@pytest.mark.parametrize(
    ("sizes", "bins", "best"),
    [
        ({500: 3}, 1, 1000.0),  # two halves fill the bin
        ({500: 3}, 2, 1500.0),  # all three fit
        ({600: 2, 400: 2}, 2, 2000.0),  # 600+400 twice: a perfect packing a first-fit by size misses
        ({700: 3}, 2, 1400.0),  # one per bin, the LP cannot split a pod across bins
        ({300: 10}, 1, 900.0),
        ({470: 2, 320: 1, 160: 1, 50: 1}, 1, 1000.0),  # 470+320+160+50 exactly
    ],
)
def test_fractional_pack_matches_the_known_optimum(sizes: dict[int, int], bins: int, best: float) -> None:
    assert fractional_pack(sizes, bins) == pytest.approx(best)


def test_knapsack_respects_bounds_and_capacity() -> None:
    counts = _knapsack([300, 450], [300.0, 450.0], [5, 1], 1000)
    assert 300 * counts[0] + 450 * counts[1] <= 1000
    assert counts[1] <= 1
    assert 300 * counts[0] + 450 * counts[1] == 900


def test_whole_gpus_fill_bins_exactly_and_fractions_share_the_rest() -> None:
    pods = [TracePod("w", 1000, 1, 2, 1000), TracePod("a", 1000, 1, 1, 700), TracePod("b", 1000, 1, 1, 700)]
    # 4 GPUs: 2 whole + two 700s in the 2 remaining bins → 3400 of 4000 allocated
    assert floor_unallocated(pods, 4) == pytest.approx(15.0)


def test_cpu_only_pods_do_not_count() -> None:
    assert floor_unallocated([TracePod("c", 8000, 1, 0, 0)], 2) == pytest.approx(100.0)


def test_arrived_prefix_stops_before_passing_the_share() -> None:
    pods = [TracePod(f"p{i}", 1, 1, 1, 400) for i in range(5)]
    assert len(arrived_prefix(pods, 1000, 100.0)) == 2
    assert len(arrived_prefix(pods, 1000, 200.0)) == 5
