"""Usage histograms in the style of the Kubernetes VPA recommender, with checkpoints a controller can store.

The requests layer needs a percentile of usage over a day to two weeks at a cost that does not grow
with the samples, so samples go into fixed, exponentially growing buckets and decay (recent use counts
more). :class:`DecayingHistogram` takes every TFLOPS sample, weighted (:func:`sample_weight`);
:class:`PeakHistogram` takes one VRAM sample per interval, its peak. Both keep their sample count and
first and last sample times (the confidence rule); ``to_checkpoint`` / ``from_checkpoint`` keep the
history across a controller restart. Values are in milli-TFLOPS and bytes.
Buckets, decay and weights: docs/autoscaling.md, section "The usage histograms".
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from vgpu.contract.strict import Reader
from vgpu.errors import DomainError
from vgpu.fields import shown

CHECKPOINT_VERSION: Final = "v1"
BUCKET_GROWTH: Final = 1.05  # VPA: each bucket 5 % larger than the one before
MIN_SAMPLE_WEIGHT: Final = 0.1  # VPA: the least weight of a sample
EPSILON: Final = 0.001 * MIN_SAMPLE_WEIGHT  # VPA: a bucket lighter than this is empty
MAX_DECAY_EXPONENT: Final = 100  # VPA: move the reference time on before weights grow past 2^100
PEAKS_PER_PERIOD: Final = 8  # VPA: memory peaks per 24 h over its 8-day window; here per aggregation period


@dataclass(frozen=True, slots=True)
class Buckets:
    """Exponential buckets: bucket 0 is [0, first); bucket i starts at first × (ratio^i − 1) / (ratio − 1)."""

    first: float
    ratio: float
    count: int

    @classmethod
    def exponential(cls, max_value: float, first: float, ratio: float = BUCKET_GROWTH) -> Buckets:
        """As many buckets as reach ``max_value`` (VPA's NewExponentialHistogramOptions)."""
        return cls(first, ratio, math.ceil(math.log(max_value * (ratio - 1) / first + 1, ratio)) + 1)

    def find(self, value: float) -> int:
        if value < self.first:
            return 0
        return min(int(math.log(value * (self.ratio - 1) / self.first + 1, self.ratio)), self.count - 1)

    def start(self, bucket: int) -> float:
        return 0.0 if bucket == 0 else self.first * (self.ratio**bucket - 1) / (self.ratio - 1)


# TensorFusion's recommender: 0.1 TFLOPS to 10,000 TFLOPS (here in milli); VPA's memory: 10 MB to 1 TB.
TFLOPS_BUCKETS: Final = Buckets.exponential(10_000_000.0, 100.0)
VRAM_BUCKETS: Final = Buckets.exponential(1e12, 1e7)


def sample_weight(tflops_request_milli: int) -> float:
    """A TFLOPS sample's weight: the pod's request in TFLOPS, at least 0.1 (VPA weights CPU by cores)."""
    return max(tflops_request_milli / 1000, MIN_SAMPLE_WEIGHT)


@dataclass(slots=True)
class SampleSpan:
    """How many samples a histogram took, and when its first and last were: the confidence rule's input."""

    samples: int = 0
    first_s: float | None = None
    last_s: float | None = None

    def note(self, time_s: float) -> None:
        self.samples += 1
        self.first_s = time_s if self.first_s is None else min(self.first_s, time_s)
        self.last_s = time_s if self.last_s is None else max(self.last_s, time_s)

    def merge(self, other: SampleSpan) -> None:
        self.samples += other.samples
        self.first_s = min((t for t in (self.first_s, other.first_s) if t is not None), default=None)
        self.last_s = max((t for t in (self.last_s, other.last_s) if t is not None), default=None)

    def to_checkpoint(self) -> dict[str, Any]:
        return {"samples": self.samples, "firstSampleTime": self.first_s, "lastSampleTime": self.last_s}

    @classmethod
    def read(cls, r: Reader) -> SampleSpan:
        return cls(r.integer("samples"), r.opt_number("firstSampleTime"), r.opt_number("lastSampleTime"))


class History(Protocol):
    """What the requests layer reads of a histogram."""

    span: SampleSpan

    def is_empty(self) -> bool: ...

    def percentile(self, p: float) -> float: ...


class DecayingHistogram:
    """Weighted samples in exponential buckets, each weight doubling every ``half_life_s`` (VPA's
    decayingHistogram): a sample one half-life older than another counts half as much."""

    __slots__ = (
        "_max",
        "_min",
        "_reference_s",
        "_total",
        "_weights",
        "buckets",
        "half_life_s",
        "span",
    )

    def __init__(self, buckets: Buckets, *, half_life_s: float) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be above 0, not {half_life_s!r}")
        self.buckets = buckets
        self.half_life_s = half_life_s
        self._weights = array("d", bytes(8 * buckets.count))
        self._total = 0.0
        self._min, self._max = buckets.count - 1, 0  # VPA's empty state: min above max
        self._reference_s: float | None = None
        self.span = SampleSpan()

    def add_sample(self, value: float, weight: float, time_s: float) -> None:
        """Count ``value`` (≥ 0) with ``weight`` (≥ 0) at ``time_s`` (Unix seconds); any order is fine."""
        self._add(value, weight, time_s)
        self.span.note(time_s)

    def is_empty(self) -> bool:
        return self._weights[self._min] < EPSILON

    def percentile(self, p: float) -> float:
        """The end of the bucket where the cumulative weight reaches ``p`` (0–1) of the total; 0 when empty."""
        if self.is_empty():
            return 0.0
        threshold, partial = p * self._total, 0.0
        bucket = self._min
        while bucket < self._max:
            partial += self._weights[bucket]
            if partial >= threshold:
                break
            bucket += 1
        return self.buckets.start(bucket + 1 if bucket < self.buckets.count - 1 else bucket)

    def total_weight(self, now_s: float) -> float:
        """The weight of every sample as it counts at ``now_s`` (a sample added then, with weight 1, adds 1)."""
        if self._reference_s is None:
            return 0.0
        return self._total * math.exp2((self._reference_s - now_s) / self.half_life_s)

    def merge(self, other: DecayingHistogram) -> None:
        """Add ``other``'s samples to this one (``other`` is not changed); both must share buckets and half-life."""
        if other.buckets != self.buckets or other.half_life_s != self.half_life_s:
            raise ValueError("only histograms with the same buckets and half-life merge")
        if other._reference_s is None:
            return
        if self._reference_s is None or self._reference_s < other._reference_s:
            self._shift(other._reference_s)
        assert self._reference_s is not None
        factor = math.exp2((other._reference_s - self._reference_s) / self.half_life_s)
        # Every bucket, not only other's [min, max]: a bucket lighter than EPSILON outside that range still
        # weighs in the total, and may fall inside this histogram's range.
        for bucket, weight in enumerate(other._weights):
            if weight:
                self._weights[bucket] += weight * factor
        self._total += other._total * factor
        self._min, self._max = min(self._min, other._min), max(self._max, other._max)
        self._narrow()
        self.span.merge(other.span)

    def to_checkpoint(self) -> dict[str, Any]:
        """A JSON-able dict that :meth:`from_checkpoint` reads back into an equal histogram (weights exact)."""
        return {
            "version": CHECKPOINT_VERSION,
            "firstBucket": self.buckets.first,
            "ratio": self.buckets.ratio,
            "buckets": self.buckets.count,
            "halfLifeSeconds": self.half_life_s,
            "referenceTime": self._reference_s,
            "totalWeight": self._total,
            "weights": {str(b): w for b, w in enumerate(self._weights) if w > 0},
            **self.span.to_checkpoint(),
        }

    @classmethod
    def from_checkpoint(cls, raw: Mapping[str, Any], *, path: str = "checkpoint") -> DecayingHistogram:
        """Read :meth:`to_checkpoint`'s form strictly: a wrong field raises DomainError naming its path."""
        r = _reader(raw, path)
        buckets = Buckets(r.positive_number("firstBucket"), r.number("ratio", low=1.0), r.integer("buckets", 1, 10_000))
        if buckets.ratio == 1.0:
            raise DomainError.one(f"{path}.ratio", shown(buckets.ratio), "must be above 1")
        h = cls(buckets, half_life_s=r.positive_number("halfLifeSeconds"))
        h._reference_s = r.opt_number("referenceTime")
        h._total = r.number("totalWeight")
        weights = r.obj("weights")
        assert weights is not None
        for key, weight in weights.items():
            where = f"{path}.weights.{key}"
            if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) < buckets.count):
                raise DomainError.one(where, None, f"must be a bucket from 0 to {buckets.count - 1}")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < math.inf:
                raise DomainError.one(where, shown(weight), "must be a number above 0")
            h._weights[int(key)] = float(weight)
        if weights:
            h._min, h._max = min(map(int, weights)), max(map(int, weights))
            h._narrow()
        h.span = SampleSpan.read(r)
        r.done()
        return h

    def _add(self, value: float, weight: float, time_s: float) -> None:
        _check(value, weight, time_s)
        bucket = self.buckets.find(value)
        decayed = weight * self._decay(time_s)
        self._weights[bucket] += decayed
        self._total += decayed
        self._min, self._max = min(self._min, bucket), max(self._max, bucket)
        self._narrow()  # a sample from long before the reference time may weigh nothing

    def _subtract(self, value: float, weight: float, time_s: float) -> None:
        bucket = self.buckets.find(value)
        decayed = weight * self._decay(time_s)
        self._weights[bucket] = max(0.0, self._weights[bucket] - decayed)
        self._total = max(0.0, self._total - decayed)
        self._narrow()

    def _decay(self, time_s: float) -> float:
        if self._reference_s is None:
            self._reference_s = self._rounded(time_s)
        elif time_s > self._reference_s + MAX_DECAY_EXPONENT * self.half_life_s:
            self._shift(self._rounded(time_s))
        return math.exp2((time_s - self._reference_s) / self.half_life_s)

    def _rounded(self, time_s: float) -> float:
        return math.floor(time_s / self.half_life_s) * self.half_life_s

    def _shift(self, reference_s: float) -> None:
        """Move the reference time, scaling every weight so that the samples keep their relative weights."""
        if self._reference_s is not None:
            factor = math.exp2((self._reference_s - reference_s) / self.half_life_s)
            for bucket in range(self._min, self._max + 1):
                self._weights[bucket] *= factor
            self._total *= factor
            self._narrow()
        self._reference_s = reference_s

    def _narrow(self) -> None:
        """Step [min, max] inwards past buckets lighter than EPSILON (VPA's updateMinAndMaxBucket)."""
        last = self.buckets.count - 1
        while self._weights[self._min] < EPSILON and self._min < last:
            self._min += 1
        while self._weights[self._max] < EPSILON and self._max > 0:
            self._max -= 1


class PeakHistogram:
    """One sample per ``interval_s``: the interval's peak, with weight 1 (VPA's memory aggregation). A sample
    older than the last one is ignored, as VPA ignores it."""

    __slots__ = ("_peak", "_window_end_s", "histogram", "interval_s", "span")

    def __init__(self, buckets: Buckets, *, half_life_s: float, interval_s: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be above 0, not {interval_s!r}")
        self.histogram = DecayingHistogram(buckets, half_life_s=half_life_s)
        self.interval_s = interval_s
        self._window_end_s: float | None = None
        self._peak = 0.0
        self.span = SampleSpan()  # the histogram's own counts only its peaks

    def add_sample(self, value: float, time_s: float) -> None:
        _check(value, 1.0, time_s)
        if self.span.last_s is not None and time_s < self.span.last_s:
            return
        if self._window_end_s is None or time_s >= self._window_end_s:
            start = time_s if self._window_end_s is None else self._window_end_s
            self._window_end_s = start + (math.floor((time_s - start) / self.interval_s) + 1) * self.interval_s
            self._peak = value
            self.histogram._add(value, 1.0, self._window_end_s)
        elif value > self._peak:
            self.histogram._subtract(self._peak, 1.0, self._window_end_s)
            self.histogram._add(value, 1.0, self._window_end_s)
            self._peak = value
        self.span.note(time_s)

    def is_empty(self) -> bool:
        return self.histogram.is_empty()

    def percentile(self, p: float) -> float:
        return self.histogram.percentile(p)

    def merge(self, other: PeakHistogram) -> None:
        """Add ``other``'s peaks (its current interval's included); this one's current interval goes on."""
        self.histogram.merge(other.histogram)
        self.span.merge(other.span)

    def to_checkpoint(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION,
            "intervalSeconds": self.interval_s,
            "windowEnd": self._window_end_s,
            "peak": self._peak,
            "histogram": self.histogram.to_checkpoint(),
            **self.span.to_checkpoint(),
        }

    @classmethod
    def from_checkpoint(cls, raw: Mapping[str, Any], *, path: str = "checkpoint") -> PeakHistogram:
        r = _reader(raw, path)
        inner = r.obj("histogram")
        assert inner is not None
        histogram = DecayingHistogram.from_checkpoint(inner, path=f"{path}.histogram")
        h = cls(histogram.buckets, half_life_s=histogram.half_life_s, interval_s=r.positive_number("intervalSeconds"))
        h.histogram = histogram
        h._window_end_s = r.opt_number("windowEnd")
        h._peak = r.number("peak")
        h.span = SampleSpan.read(r)
        r.done()
        return h


def tflops_history(aggregation_period_s: float) -> DecayingHistogram:
    """The requests layer's TFLOPS history: half-life = the aggregation period (see docs/autoscaling.md)."""
    return DecayingHistogram(TFLOPS_BUCKETS, half_life_s=aggregation_period_s)


def vram_history(aggregation_period_s: float) -> PeakHistogram:
    """The requests layer's VRAM history: PEAKS_PER_PERIOD peaks per aggregation period, same half-life."""
    return PeakHistogram(
        VRAM_BUCKETS, half_life_s=aggregation_period_s, interval_s=aggregation_period_s / PEAKS_PER_PERIOD
    )


def _check(value: float, weight: float, time_s: float) -> None:
    if not (0 <= value < math.inf and 0 <= weight < math.inf and 0 <= time_s < math.inf):
        raise ValueError(f"a sample needs a value, weight and Unix time ≥ 0, not {value!r}, {weight!r}, {time_s!r}")


def _reader(raw: Mapping[str, Any], path: str) -> Reader:
    """A checkpoint's reader, once its version is one this build reads."""
    r = Reader(raw, path)
    version = r.text("version")
    if version != CHECKPOINT_VERSION:
        raise DomainError.one(f"{path}.version", version, f"unsupported; this build reads {CHECKPOINT_VERSION}")
    return r
