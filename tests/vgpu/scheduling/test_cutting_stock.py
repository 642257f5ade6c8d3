"""The cutting-stock duals that price GPU space for the fragmentation policy."""

from __future__ import annotations

import itertools
import random

import pytest

from vgpu.scheduling.cutting_stock import CAPACITY, prices


def patterns(sizes: list[int]) -> list[tuple[int, ...]]:
    """Every maximal-or-not multiset of sizes that fits one GPU (small instances only)."""
    bounds = [range(CAPACITY // s + 1) for s in sizes]
    return [a for a in itertools.product(*bounds) if 0 < sum(k * s for k, s in zip(a, sizes, strict=True)) <= CAPACITY]


def lp_optimum(demand: dict[int, float]) -> float:
    """Fewest GPUs (fractional) that cover the demand, by an LP over all patterns (scipy as reference)."""
    linprog = pytest.importorskip("scipy.optimize").linprog
    sizes = sorted(demand)
    cols = patterns(sizes)
    a_ub = [[-a[i] for a in cols] for i in range(len(sizes))]
    res = linprog([1.0] * len(cols), A_ub=a_ub, b_ub=[-demand[s] for s in sizes], bounds=(0, None), method="highs")
    return float(res.fun)


def test_one_size_costs_its_share_of_the_gpus_it_packs_into() -> None:
    p = prices({500: 4})
    assert p is not None
    assert p.worth[500] == pytest.approx(0.5)
    assert p.fill[CAPACITY] == pytest.approx(1.0)
    p = prices({400: 6})  # two per GPU, 200 left that nothing fills
    assert p is not None and p.worth[400] == pytest.approx(0.5)


def test_nothing_to_price() -> None:
    assert prices({}) is None
    assert prices({1000: 3, 0: 2}) is None


@pytest.mark.parametrize("seed", range(8))
def test_duals_are_feasible_and_optimal_against_a_full_pattern_lp(seed: int) -> None:
    rng = random.Random(seed)
    sizes = rng.sample(range(200, 900, 10), rng.randint(2, 5))
    demand = {s: float(rng.randint(1, 50)) for s in sizes}
    p = prices(demand)
    assert p is not None
    assert p.fill[CAPACITY] <= 1.0 + 1e-6  # no pattern is worth more than one GPU
    assert all(w >= 0.0 for w in p.worth.values())
    assert sum(demand[s] * p.worth[s] for s in sizes) == pytest.approx(lp_optimum(demand), rel=1e-6)


def test_a_pod_that_takes_the_room_a_scarcer_size_needs_loses_value() -> None:
    # Many 810s and 650s that nothing but a 160 can join; 160s are plentiful enough to be free.
    p = prices({810: 50, 470: 30, 650: 12, 320: 9, 160: 40})
    assert p is not None
    assert p.worth[810] == pytest.approx(1.0) and p.worth[160] == pytest.approx(0.0)
    assert p.loss(470, CAPACITY) == pytest.approx(0.0)  # opening a GPU for it loses nothing
    assert p.loss(470, 840) == pytest.approx(0.5)  # taking an 810's GPU loses what the 810 was worth
    assert p.loss(160, 190) == pytest.approx(0.0)  # the 160 in the 810's leftover: the LP's own pattern
    assert p.loss(160, 530) == pytest.approx(0.5)  # the 160 in a 470's room strands that 470's half
    assert p.loss(900, 530) == 0.0  # does not fit: not this function's business


def test_losses_are_never_negative_and_fills_are_monotone() -> None:
    p = prices({810: 50, 470: 30, 650: 12, 320: 9, 230: 3, 160: 1, 50: 1})
    assert p is not None
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(p.fill))
    for size in (50, 160, 230, 320, 333, 470, 650, 810):
        for hole in range(0, CAPACITY + 1, 10):
            assert p.loss(size, hole) >= 0.0
