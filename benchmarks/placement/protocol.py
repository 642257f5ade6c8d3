"""The openb protocol as the FGD paper's simulator ran it: order, inflate, rank, measure.

One run is (policy, trace, seed). Everything random in it comes from one ``random.Random(seed)``
drawn in a fixed order — shuffle the name-sorted pods, inflate (or trim) to 130 % of the cluster's
GPUs, then draw the node tie-break ranks — so a run is reproducible bit for bit and every policy
sees the same pod sequence and the same ranks. Metrics follow the paper: after every submitted pod
(dropped ones included) record arrived % and allocated %, bin by ``round(arrived %)`` and average
inside the bin; "unallocated GPU %" at a bin is 100 − that average.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import floor

from benchmarks.placement.traces import TracePod

SEEDS = tuple(range(42, 52))
INFLATION = 1.3


@dataclass(frozen=True, slots=True)
class Workload:
    """The pod sequence and node ranks of one (trace, seed)."""

    pods: tuple[TracePod, ...]
    ranks: tuple[int, ...]  # per node (input order): smaller wins ties
    capacity: int  # cluster GPU milli


def prepare(pods: Sequence[TracePod], node_count: int, capacity: int, seed: int) -> Workload:
    """Sort by name, shuffle, inflate/trim to 130 % of ``capacity`` and draw node ranks, all from ``seed``.

    Inflation appends uniform draws (with replacement) from the original list and stops at the first
    draw that would pass the target; a trace already above it loses pods at uniform random positions
    until it is not.
    """
    rng = random.Random(seed)
    original = sorted(pods, key=lambda p: p.name)
    ordered = list(original)
    rng.shuffle(ordered)
    target = INFLATION * capacity
    total = sum(p.gpu_request for p in ordered)
    if total < target:
        while True:
            pick = original[rng.randrange(len(original))]
            if total + pick.gpu_request > target:
                break
            ordered.append(pick)
            total += pick.gpu_request
    else:
        while total > target:
            total -= ordered.pop(rng.randrange(len(ordered))).gpu_request
    ranks = list(range(node_count))
    rng.shuffle(ranks)
    return Workload(tuple(ordered), tuple(ranks), capacity)


@dataclass(frozen=True, slots=True)
class Curve:
    """Allocated % averaged per arrived-% bin (``round(arrived %)``) for one run."""

    allocated: dict[int, float]
    placed: int
    dropped: int

    def unallocated(self, arrived: int) -> float | None:
        value = self.allocated.get(arrived)
        return None if value is None else 100.0 - value


def curve(requests: Iterable[int], placed: Iterable[bool], capacity: int) -> Curve:
    """Bin the events of one run: ``requests[i]`` GPU milli of pod i, ``placed[i]`` whether it landed."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    arrived = allocated = 0
    n_placed = n_dropped = 0
    for request, ok in zip(requests, placed, strict=True):
        arrived += request
        if ok:
            allocated += request
            n_placed += 1
        else:
            n_dropped += 1
        b = floor(100.0 * arrived / capacity + 0.5)  # round half up, like Go's math.Round
        sums[b] = sums.get(b, 0.0) + 100.0 * allocated / capacity
        counts[b] = counts.get(b, 0) + 1
    return Curve({b: sums[b] / counts[b] for b in sums}, n_placed, n_dropped)


@dataclass(frozen=True, slots=True)
class Stat:
    mean: float
    sd: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:5.2f} ± {self.sd:4.2f}"


def stat(values: Sequence[float]) -> Stat:
    """Mean and sample standard deviation (n − 1) over seeds."""
    return Stat(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values))
