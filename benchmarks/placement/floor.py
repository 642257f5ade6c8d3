"""The GPU-bin floor: an upper bound on the GPU capacity any scheduler could allocate.

Pack the arrived pods into the cluster's GPUs seen as bins of 1000 milli, ignoring CPU, memory,
nodes, models and arrival order (the FGD paper's bound). Whole-GPU pods fill bins exactly, so
they take ``W`` bins outright (or all of them); the fractional pods then go into the ``B``
remaining bins. That is a cutting-stock problem; its LP relaxation, solved by column generation,
bounds the integer optimum from above, which is what a floor on *unallocated* GPU % needs:

    max Σ_p v_p·y_p   s.t.  Σ_p y_p ≤ B,   Σ_p a_ip·y_p ≤ d_i  (each size i),   y ≥ 0

where a pattern p packs ``a_ip`` pods of size ``s_i`` into one bin (Σ a_ip·s_i ≤ 1000) and
``v_p = Σ a_ip·s_i``. Pricing a new pattern is a bounded knapsack over the duals (π₀ for the bin
row, π_i for the size rows): maximise Σ a_i·(s_i − π_i) subject to Σ a_i·s_i ≤ 1000, a_i ≤ d_i; a
column enters while its reduced value exceeds π₀. HiGHS (scipy's ``linprog``) solves each master.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
from scipy.optimize import linprog

from benchmarks.placement.traces import MILLI, TracePod

EPSILON = 1e-7


def _knapsack(sizes: Sequence[int], values: Sequence[float], bounds: Sequence[int], capacity: int) -> list[int]:
    """Bounded knapsack by DP over capacity (items split into powers of two); returns counts per size."""
    best = np.zeros(capacity + 1)
    choice: list[tuple[int, int, np.ndarray]] = []
    for i, (s, v, d) in enumerate(zip(sizes, values, bounds, strict=True)):
        if v <= EPSILON:
            continue
        k = 1
        left = min(d, capacity // s)
        while left > 0:
            take = min(k, left)
            w, val = take * s, take * v
            shifted = np.full(capacity + 1, -np.inf)
            shifted[w:] = best[:-w] + val
            better = shifted > best + EPSILON
            best = np.where(better, shifted, best)
            choice.append((i, take, better))
            left -= take
            k *= 2
    counts = [0] * len(sizes)
    c = int(np.argmax(best))
    for i, take, better in reversed(choice):
        if better[c]:
            counts[i] += take
            c -= take * sizes[i]
    return counts


def fractional_pack(sizes_count: dict[int, int], bins: int, max_rounds: int = 500) -> float:
    """LP bound on the milli of fractional pods (``{size: count}``) that fit in ``bins`` bins."""
    if bins <= 0 or not sizes_count:
        return 0.0
    sizes = sorted(sizes_count)
    demand = [sizes_count[s] for s in sizes]
    total = sum(s * d for s, d in zip(sizes, demand, strict=True))
    if total <= 0:
        return 0.0
    # Start with single-size patterns (as many of that size as fit in a bin).
    patterns: list[list[int]] = []
    for i, s in enumerate(sizes):
        col = [0] * len(sizes)
        col[i] = min(MILLI // s, demand[i])
        patterns.append(col)
    value = 0.0
    for _ in range(max_rounds):
        a = np.array(patterns, dtype=float).T  # sizes × patterns
        v = np.array([sum(c * s for c, s in zip(p, sizes, strict=True)) for p in patterns], dtype=float)
        a_ub = np.vstack([np.ones(len(patterns)), a])
        b_ub = np.array([bins, *demand], dtype=float)
        res = linprog(-v, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"floor LP failed: {res.message}")
        value = -float(res.fun)
        duals = -np.asarray(res.ineqlin.marginals)  # ≥ 0 for a maximisation
        pi0, pis = float(duals[0]), duals[1:]
        counts = _knapsack(sizes, [s - float(p) for s, p in zip(sizes, pis, strict=True)], demand, MILLI)
        reduced = sum(c * (s - float(p)) for c, s, p in zip(counts, sizes, pis, strict=True)) - pi0
        if reduced <= 1e-6 or counts in patterns:
            return min(value, float(total))
        patterns.append(counts)
    return min(value, float(total))


def floor_unallocated(pods: Iterable[TracePod], gpus: int) -> float:
    """Lowest possible unallocated GPU % (of ``gpus``) after these pods arrived."""
    whole = 0
    fractional: Counter[int] = Counter()
    for p in pods:
        if p.num_gpu <= 0 or p.gpu_milli <= 0:
            continue
        if p.gpu_milli >= MILLI:
            whole += p.num_gpu
        else:
            fractional[p.gpu_milli] += p.num_gpu
    used_bins = min(whole, gpus)
    packed = used_bins * MILLI + fractional_pack(dict(fractional), gpus - used_bins)
    return 100.0 - 100.0 * packed / (gpus * MILLI)


def arrived_prefix(pods: Sequence[TracePod], capacity: int, arrived_pct: float) -> Sequence[TracePod]:
    """The longest prefix whose cumulative GPU request is at most ``arrived_pct`` % of ``capacity``."""
    limit = arrived_pct / 100.0 * capacity
    total = 0
    for i, p in enumerate(pods):
        total += p.gpu_request
        if total > limit:
            return pods[:i]
    return pods
