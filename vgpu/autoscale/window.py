"""Recent usage over one evaluation period: its peak and mean, and whether any samples are missing.

The limits layer bursts on what happened in the last evaluation period (VPA-like, under a minute by
default) and the replicas layer on what stayed true over it (HPA-like); neither wants a long history's
decay. A window is a ring of equal slots (per slot the peak, the sum, the count and the newest sample
time), so memory is fixed whatever the sampling rate, and old slots are simply overwritten.

It also says how complete its evidence is, because missing samples (a node down, a device plugin
restarting) must never scale anything down: ``coverage`` is the share of the samples the sampling
interval promises that are there, ``fresh`` whether the newest one is recent.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Final

DEFAULT_SLOTS: Final = 30
STALE_AFTER_INTERVALS: Final = 2  # as the custom-metrics API: a figure lives for two sampling intervals
_NO_SLOT: Final = -(2**63)


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Usage over a window as :meth:`UsageWindow.stats` saw it at one moment."""

    samples: int
    mean: float
    peak: float
    coverage: float  # samples present ÷ samples the sampling interval promises, 0–1
    fresh: bool  # the newest sample is at most STALE_AFTER_INTERVALS sampling intervals old


def is_fresh(last_sample_s: float | None, now_s: float, interval_s: float) -> bool:
    """Whether a sample taken at ``last_sample_s`` still counts at ``now_s``."""
    return last_sample_s is not None and now_s - last_sample_s <= STALE_AFTER_INTERVALS * interval_s


class UsageWindow:
    """The last ``length_s`` seconds of usage samples, in ``slots`` slots; a slot's samples leave together."""

    __slots__ = ("_count", "_index", "_newest", "_peak", "_slot_s", "_sum", "length_s", "slots")

    def __init__(self, length_s: float, *, slots: int = DEFAULT_SLOTS) -> None:
        if not (length_s > 0 and slots >= 1):
            raise ValueError(f"a window needs a length above 0 and at least one slot, not {length_s!r}, {slots!r}")
        self.length_s, self.slots = length_s, slots
        self._slot_s = length_s / slots
        self._index = array("q", [_NO_SLOT]) * slots  # which slot number each ring position holds
        self._peak = array("d", bytes(8 * slots))
        self._sum = array("d", bytes(8 * slots))
        self._count = array("q", bytes(8 * slots))
        self._newest = array("d", bytes(8 * slots))

    def add_sample(self, value: float, time_s: float) -> None:
        """Count ``value`` at ``time_s``; a sample older than the slot now in its ring position is dropped."""
        if not (0 <= value < math.inf and 0 <= time_s < math.inf):
            raise ValueError(f"a sample needs a value and a Unix time ≥ 0, not {value!r}, {time_s!r}")
        number = math.floor(time_s / self._slot_s)
        i = number % self.slots
        if self._index[i] > number:
            return
        if self._index[i] < number:  # the ring position still holds an old slot: start it afresh
            self._index[i], self._peak[i], self._sum[i], self._count[i], self._newest[i] = number, 0.0, 0.0, 0, 0.0
        self._peak[i] = max(self._peak[i], value)
        self._sum[i] += value
        self._count[i] += 1
        self._newest[i] = max(self._newest[i], time_s)

    def begins_after(self, time_s: float, now_s: float) -> bool:
        """Whether the window ending at ``now_s`` holds nothing from ``time_s`` or before (its oldest slot
        starts after the slot of ``time_s``)."""
        return math.floor(time_s / self._slot_s) < math.floor(now_s / self._slot_s) - self.slots + 1

    def stats(self, now_s: float, *, interval_s: float, streams: int = 1) -> WindowStats:
        """The window ending at ``now_s``; ``streams`` sources (pods × GPUs) each sampled every ``interval_s``."""
        current = math.floor(now_s / self._slot_s)
        oldest = current - self.slots + 1
        samples, total, peak, newest = 0, 0.0, 0.0, None
        for i in range(self.slots):
            if oldest <= self._index[i] <= current:
                samples += self._count[i]
                total += self._sum[i]
                peak = max(peak, self._peak[i])
                newest = self._newest[i] if newest is None else max(newest, self._newest[i])
        # Samples every interval_s land at least floor(span / interval_s) times in any span of that length.
        promised = math.floor((now_s - oldest * self._slot_s) / interval_s) * streams
        coverage = 1.0 if samples >= promised else samples / promised
        return WindowStats(
            samples=samples,
            mean=total / samples if samples else 0.0,
            peak=peak,
            coverage=coverage,
            fresh=is_fresh(newest, now_s, interval_s),
        )
