"""The isolation benchmark's arithmetic, apart from the GPU: a tenant's rate from its per-second rows, the
seconds two tenants ran together, shares of the uncapped rate, a split's distance from its target in
percentage points, and a run's seconds on either side of a moment (a pause, a limit changed). The rows are
tenant_load's: ``{"step": "second", "from": wall, "to": wall, "rate": r}``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SETTLE_S = 1.0  # a tenant's first second is left out: limiters (HAMi-core's watcher) take hold after it
LIVE_SETTLE_S = 2.0  # after a limit is changed, the seconds a limiter is given to follow it


def seconds_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("step") == "second"]


def mean_rate(rows: Sequence[dict[str, Any]], lo: float | None = None, hi: float | None = None) -> float | None:
    """The time-weighted mean rate of the per-second rows wholly inside [lo, hi] (default: from the first
    row's start plus :data:`SETTLE_S` to the last row's end); None without any."""
    each = seconds_rows(rows)
    if not each:
        return None
    lo = each[0]["from"] + SETTLE_S if lo is None else lo
    hi = each[-1]["to"] if hi is None else hi
    inside = [r for r in each if r["from"] >= lo - 1e-6 and r["to"] <= hi + 1e-6]
    spent = sum(r["to"] - r["from"] for r in inside)
    return sum(r["rate"] * (r["to"] - r["from"]) for r in inside) / spent if spent > 0 else None


def together(*tenants: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """The window in which every tenant was measuring, after each one's settling second; None if none."""
    each = [seconds_rows(rows) for rows in tenants]
    if not all(each):
        return None
    lo = max(rows[0]["from"] for rows in each) + SETTLE_S
    hi = min(rows[-1]["to"] for rows in each)
    return (lo, hi) if hi > lo else None


def share(rate: float | None, uncapped: float | None) -> float | None:
    """``rate`` in percent of ``uncapped`` (the same load alone, with no limit)."""
    if rate is None or not uncapped:
        return None
    return 100.0 * rate / uncapped


@dataclass(frozen=True, slots=True)
class Split:
    """Two or more tenants at once: each one's share of the uncapped rate, its distance from its limit in
    percentage points, and their total (about 100: the GPU's time was all used: work-conserving)."""

    targets: tuple[int, ...]
    shares: tuple[float, ...]

    @property
    def points(self) -> tuple[float, ...]:
        return tuple(s - t for s, t in zip(self.shares, self.targets, strict=True))

    @property
    def total(self) -> float:
        return sum(self.shares)

    @property
    def worst(self) -> float:
        """The largest distance from a target, in points."""
        return max(abs(p) for p in self.points)


def split(targets: tuple[int, ...], rates: Sequence[float | None], uncapped: float | None) -> Split | None:
    """The split of ``rates`` against ``targets``; None where a rate or the uncapped rate is missing."""
    shares = [share(r, uncapped) for r in rates]
    if any(s is None for s in shares):
        return None
    return Split(targets, tuple(s for s in shares if s is not None))


def shares_after(rows: Sequence[dict[str, Any]], at: float, uncapped: float | None) -> list[float]:
    """The share of each per-second row that starts at or after ``at``, in order."""
    after = [share(r["rate"], uncapped) for r in seconds_rows(rows) if r["from"] >= at - 1e-6]
    return [s for s in after if s is not None]


@dataclass(frozen=True, slots=True)
class Around:
    """A run on either side of a moment: its settled share before, and after it (each None without a whole
    second there)."""

    before: float | None
    after: float | None


def around(
    rows: Sequence[dict[str, Any]], at: float, uncapped: float | None, settle_after: float = LIVE_SETTLE_S
) -> Around:
    """The share before ``at`` (after the run's settling second) and after ``at`` plus ``settle_after``."""
    each = seconds_rows(rows)
    if not each:
        return Around(None, None)
    before = mean_rate(rows, None, at) if at - each[0]["from"] > SETTLE_S else None
    return Around(share(before, uncapped), share(mean_rate(rows, at + settle_after, None), uncapped))
