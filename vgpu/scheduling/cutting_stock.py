"""What a unit of GPU space is worth to the learned mix: the duals of the cutting-stock LP.

``worth[i]`` is the share of a GPU that one pod of size ``i`` costs in an optimal packing of the mix
(the Gilmore–Gomory LP's dual prices); ``fill[h]`` is the most a hole of ``h`` units can be worth,
jointly (an unbounded knapsack over the prices). Putting a pod of size ``s`` into a hole ``h`` loses
``fill[h] − fill[h − s] − worth(s) ≥ 0`` GPUs of LP value, which the fragmentation policy adds to its
growth of stranded capacity. Pure Python: revised simplex with the knapsack DP as the pricing step.
The LP, examples and costs: vgpu/scheduling/README.md, section "The fragmentation policy".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

CAPACITY: Final = 1000  # one GPU, in thousandths
MAX_PIVOTS: Final = 2000  # a guard: the LP has at most 64 rows and converges in far fewer
_EPS: Final = 1e-9


@dataclass(frozen=True, slots=True)
class Prices:
    """Dual price per size (GPUs per pod) and the best value of every hole 0..capacity."""

    worth: dict[int, float]
    fill: tuple[float, ...]

    def loss(self, size: int, hole: int) -> float:
        """LP value (GPUs) lost by putting a pod of ``size`` into a hole of ``hole`` (0 if it does not fit)."""
        if size <= 0 or size > hole or hole >= len(self.fill):
            return 0.0
        fill = self.fill
        own = self.worth.get(size, fill[size])  # a size the LP has not seen: worth what its room is
        return max(0.0, fill[hole] - fill[hole - size] - own)


def _knapsack(sizes: Sequence[int], values: Sequence[float], capacity: int) -> tuple[list[float], list[int]]:
    """Unbounded knapsack: best value of every capacity 0..capacity and the last item taken (-1: none)."""
    best = [0.0] * (capacity + 1)
    last = [-1] * (capacity + 1)
    items = [(s, v, i) for i, (s, v) in enumerate(zip(sizes, values, strict=True)) if v > _EPS and s <= capacity]
    for c in range(1, capacity + 1):
        b, k = best[c - 1], -1
        for s, v, i in items:
            if s <= c:
                x = best[c - s] + v
                if x > b + _EPS:
                    b, k = x, i
        best[c], last[c] = b, k
    return best, last


def prices(demand: Mapping[int, float], capacity: int = CAPACITY) -> Prices | None:
    """The LP duals for ``demand`` (size in 1/capacity of a GPU → pods; any positive scale), or None."""
    sizes = sorted(s for s, d in demand.items() if 0 < s < capacity and d > 0)
    if not sizes:
        return None
    n = len(sizes)
    d = [float(demand[s]) for s in sizes]
    # Basis: column j of B is a pattern (or a surplus column −e_i, cost 0); start with the singletons.
    inv = [[0.0] * n for _ in range(n)]  # B⁻¹
    cost = [1.0] * n
    for i, s in enumerate(sizes):
        inv[i][i] = 1.0 / (capacity // s)
    pi = [0.0] * n
    for _ in range(MAX_PIVOTS):
        pi = [sum(cost[r] * inv[r][j] for r in range(n)) for j in range(n)]  # π = c_B B⁻¹
        best, last = _knapsack(sizes, pi, capacity)
        entering: list[float] | None = None
        enter_cost = 1.0
        if best[capacity] > 1.0 + 1e-7:
            entering = [0.0] * n
            c = capacity
            while c > 0:
                k = last[c]
                if k < 0:
                    c -= 1
                    continue
                entering[k] += 1.0
                c -= sizes[k]
        else:
            low = min(range(n), key=pi.__getitem__)
            if pi[low] < -1e-7:  # a size priced below zero is over-covered: let its surplus enter
                entering = [0.0] * n
                entering[low] = -1.0
                enter_cost = 0.0
        if entering is None:
            break
        w = [sum(inv[r][j] * entering[j] for j in range(n)) for r in range(n)]
        x = [sum(inv[r][j] * d[j] for j in range(n)) for r in range(n)]
        ratios = [(x[r] / w[r], r) for r in range(n) if w[r] > _EPS]
        if not ratios:
            break  # unbounded direction: cannot happen with covering patterns; keep the last prices
        _, out = min(ratios)
        pivot = w[out]
        row = [v / pivot for v in inv[out]]
        for r in range(n):
            if r != out and w[r] != 0.0:
                f = w[r]
                inv[r] = [a - f * b for a, b in zip(inv[r], row, strict=True)]
        inv[out] = row
        cost[out] = enter_cost
    worth = [max(0.0, p) for p in pi]
    fill, _ = _knapsack(sizes, worth, capacity)
    return Prices(dict(zip(sizes, worth, strict=True)), tuple(fill))
