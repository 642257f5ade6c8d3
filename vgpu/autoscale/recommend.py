"""One decision function per autoscaling layer: usage, the current values and the config in, a Decision out.

Each returns the value to set (TFLOPS in milli, VRAM in bytes, or replicas), a reason code for the
workload's status conditions and events (``LimitsRaised``, ``AtMaxRatio``, ``WaitingForHistory``, …)
and a message that says why in numbers. Nothing here reads a clock: ``now_s`` is passed in, as are the
last change times, so a decision can be replayed. Missing samples never lower anything.
The rules of each layer (MIN_COVERAGE, REQUEST_CHANGE_THRESHOLD, HPA's rule and tolerance):
docs/autoscaling.md, section "How each layer decides".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from math import ceil, floor
from typing import Final

from vgpu.autoscale.config import LimitsConfig, ReplicasConfig, RequestsConfig, Resource
from vgpu.autoscale.histogram import History
from vgpu.autoscale.window import WindowStats, is_fresh
from vgpu.fields import MAX_REPLICAS
from vgpu.quantity import humanize_bytes, humanize_tflops

MIN_COVERAGE: Final = Fraction(9, 10)  # lowering needs 90 % of the window's promised samples
REQUEST_CHANGE_THRESHOLD: Final = Fraction(1, 10)  # VPA updater: a request moves by 10 % or not at all
REPLICAS_TOLERANCE: Final = Fraction(1, 10)  # HPA: --horizontal-pod-autoscaler-tolerance


class Reason(StrEnum):
    LIMITS_RAISED = "LimitsRaised"
    LIMITS_LOWERED = "LimitsLowered"
    REQUESTS_RAISED = "RequestsRaised"
    REQUESTS_LOWERED = "RequestsLowered"
    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"
    INSIDE_IGNORED_RANGE = "InsideIgnoredRange"
    AT_MAX_RATIO = "AtMaxRatio"
    CAPPED_BY_GPU = "CappedByGpu"
    CAPPED_BY_OTHER_PODS = "CappedByOtherPods"
    CAPPED_BY_LIMIT = "CappedByLimit"
    WAITING_FOR_HISTORY = "WaitingForHistory"
    NO_SAMPLES = "NoSamples"
    COOLING_DOWN = "CoolingDown"
    UNCHANGED = "Unchanged"
    DISABLED = "Disabled"


@dataclass(frozen=True, slots=True)
class Decision:
    """What a layer decided: ``value`` replaces ``current`` (equal: nothing to do), and why."""

    current: int
    value: int
    reason: Reason
    message: str

    @property
    def changed(self) -> bool:
        return self.value != self.current


def _show(resource: Resource, amount: int) -> str:
    return f"{humanize_tflops(amount)} TFLOPS" if resource is Resource.TFLOPS else humanize_bytes(amount)


def limit_ceiling(config: LimitsConfig, *, request: int, capacity: int, others: int = 0) -> int:
    """The most the limits layer may raise a limit to: maxRatioToRequests × request, within the GPU — its
    ``capacity`` less what ``others`` (the GPU's other pods) hold there (VRAM: each the larger of its request
    and limit; TFLOPS: 0, compute is shared by time)."""
    return min(ceil(request * config.max_ratio_to_requests), max(capacity - others, 0))


def recommend_limit(
    config: LimitsConfig,
    resource: Resource,
    usage: WindowStats,
    *,
    request: int,
    limit: int,
    admitted_limit: int,
    capacity: int,
    others: int = 0,
    settled: bool = True,
) -> Decision:
    """The limit for the next evaluation period of one pod on one GPU.

    ``usage``: the pod's use of the GPU over the last evaluation period; ``admitted_limit``: the limit the
    pod was admitted with, the floor when usage falls; ``capacity``: the GPU's (TFLOPS or memory);
    ``others``: what the GPU's other pods hold there — for VRAM the sum of each one's larger of request and
    limit (memory cannot be taken back, so the limit never exceeds what they leave free: ``CappedByOtherPods``),
    for TFLOPS 0 (compute is shared by time: limits may over-subscribe it); ``settled``: the window holds only
    samples taken under ``limit``, the first excepted — else it is not lowered (``WaitingForHistory``): what a
    pod used under another limit, or in the moment its use had not yet followed a change, says nothing of
    what it uses under this one.
    """

    def decide(value: int, reason: Reason, message: str) -> Decision:
        return Decision(limit, value, reason, f"{resource.value} limit {message}")

    if not config.enable or not config.target.covers(resource):
        return decide(limit, Reason.DISABLED, "is not auto-set")
    if not usage.samples or not usage.fresh:
        return decide(limit, Reason.NO_SAMPLES, f"stays {_show(resource, limit)}: no recent usage sample")
    peak = Fraction(usage.peak)
    ceiling = limit_ceiling(config, request=request, capacity=capacity, others=others)
    if ceiling >= request * config.max_ratio_to_requests:
        cap_reason, cap_text = (
            Reason.AT_MAX_RATIO,
            f"maxRatioToRequests {float(config.max_ratio_to_requests):g} × the request, {_show(resource, ceiling)}",
        )
    elif others > 0:
        cap_reason, cap_text = (
            Reason.CAPPED_BY_OTHER_PODS,
            f"what the GPU's other pods leave free, {_show(resource, ceiling)} "
            f"({_show(resource, capacity)} less the {_show(resource, others)} they hold)",
        )
    else:
        cap_reason, cap_text = Reason.CAPPED_BY_GPU, f"what the GPU can hold, {_show(resource, capacity)}"
    pressing = limit > 0 and peak >= limit * (1 - config.ignored_delta)
    # At most scaleUpStep of the limit, but a raise is at least one unit (a limit of 1 milli-TFLOPS can grow).
    step_max = max(floor(limit * (1 + config.scale_up_step)), limit + 1) if limit else 0
    wanted = max(ceil(peak * (1 + config.extra_tflops_buffer)), step_max if pressing else 0, admitted_limit, request)
    why = (
        f"usage pressed on it (peak {_show(resource, ceil(peak))})"
        if pressing
        else f"peak {_show(resource, ceil(peak))} × (1 + {float(config.extra_tflops_buffer):g})"
    )
    ignored, inside = limit * config.ignored_delta, f"is within ignoredDeltaRange {float(config.ignored_delta):g}"
    if wanted > limit:
        if not pressing and wanted - limit <= ignored:
            return decide(limit, Reason.INSIDE_IGNORED_RANGE, f"stays {_show(resource, limit)}: {why} {inside}")
        new = min(wanted, step_max, ceiling)
        if new <= limit:
            return decide(limit, cap_reason, f"stays {_show(resource, limit)}: at {cap_text}, {why} wants more")
        if new == ceiling < min(wanted, step_max):
            return decide(new, cap_reason, f"raised to {_show(resource, new)}, capped at {cap_text}; {why}")
        stepped = f" (scaleUpStep; {why} wants {_show(resource, wanted)})" if new < wanted else f": {why}"
        return decide(new, Reason.LIMITS_RAISED, f"raised to {_show(resource, new)}{stepped}")
    if wanted < limit:
        if limit - wanted <= ignored:
            return decide(limit, Reason.INSIDE_IGNORED_RANGE, f"stays {_show(resource, limit)}: {why} {inside}")
        if not settled:
            return decide(
                limit,
                Reason.WAITING_FOR_HISTORY,
                f"stays {_show(resource, limit)}: {why}, but lowering waits for a window of samples all taken "
                "under it, the first excepted (use follows a change late)",
            )
        if usage.coverage < MIN_COVERAGE:
            return decide(limit, Reason.NO_SAMPLES, f"stays {_show(resource, limit)}: {_missing(usage)}")
        floor_text = "" if wanted > max(admitted_limit, request) else ", the admitted limit"
        return decide(wanted, Reason.LIMITS_LOWERED, f"lowered to {_show(resource, wanted)}{floor_text}: {why}")
    return decide(limit, Reason.UNCHANGED, f"stays {_show(resource, limit)}: {why}")


def recommend_request(
    config: RequestsConfig,
    resource: Resource,
    history: History,
    *,
    request: int,
    limit: int,
    capacity: int,
    now_s: float,
    sample_interval_s: float,
) -> Decision:
    """The request new pods of the workload get (and running ones, where the GPU has room).

    ``history``: the workload's usage histogram of ``resource`` (histogram.tflops_history / vram_history);
    ``limit``: the limit in force after the limits layer; ``capacity``: the most the GPU can reserve for it.
    Confidence rule: act only once min(last − first sample time, samples × sample_interval_s) reaches the
    aggregation period — VPA's confidence, min(days of history, samples ÷ 1440), in aggregation periods.
    """

    def decide(value: int, reason: Reason, message: str) -> Decision:
        return Decision(request, value, reason, f"{resource.value} request {message}")

    if not config.enable or not config.target.covers(resource):
        return decide(request, Reason.DISABLED, "is not auto-set")
    span = history.span
    if (
        history.is_empty()
        or span.first_s is None
        or span.last_s is None
        or not is_fresh(span.last_s, now_s, sample_interval_s)
    ):
        return decide(request, Reason.NO_SAMPLES, f"stays {_show(resource, request)}: no recent usage sample")
    have = min(span.last_s - span.first_s, span.samples * sample_interval_s)
    if have < config.aggregation_period_s:
        return decide(
            request,
            Reason.WAITING_FOR_HISTORY,
            f"stays {_show(resource, request)}: {_duration(have)} of history, "
            f"{_duration(config.aggregation_period_s)} (aggregationPeriod) needed",
        )
    usage = Fraction(history.percentile(float(config.percentile)))
    wanted = ceil(usage * (1 + config.extra_buffer))
    why = f"p{float(config.percentile * 100):g} {_show(resource, ceil(usage))} × (1 + {float(config.extra_buffer):g})"
    if wanted > min(limit, capacity):
        reason, cap = (Reason.CAPPED_BY_GPU, capacity) if capacity < limit else (Reason.CAPPED_BY_LIMIT, limit)
        if cap <= request:
            return decide(request, reason, f"stays {_show(resource, request)}: at {_show(resource, cap)}, {why}")
        return decide(cap, reason, f"raised to {_show(resource, cap)}, capped there; {why}")
    if abs(wanted - request) <= request * REQUEST_CHANGE_THRESHOLD:
        return decide(request, Reason.INSIDE_IGNORED_RANGE, f"stays {_show(resource, request)}: {why}, within 10 %")
    if wanted > request:
        return decide(wanted, Reason.REQUESTS_RAISED, f"raised to {_show(resource, wanted)}: {why}")
    return decide(wanted, Reason.REQUESTS_LOWERED, f"lowered to {_show(resource, wanted)}: {why}")


def recommend_replicas(
    config: ReplicasConfig,
    usage: WindowStats,
    *,
    replicas: int,
    max_limit: int,
    last_scaled_s: float | None,
    now_s: float,
    min_replicas: int = 1,
    max_replicas: int = MAX_REPLICAS,
) -> Decision:
    """The workload's replicas: ``usage`` holds every replica's TFLOPS samples over the evaluation period
    (its mean is the use per replica), ``max_limit`` the most a replica's TFLOPS limit may reach
    (:func:`limit_ceiling` when the limits layer is on, else the limit), ``last_scaled_s`` the time of the
    last change of replicas, either way (None: never)."""

    def decide(value: int, reason: Reason, message: str) -> Decision:
        return Decision(replicas, value, reason, f"replicas {message}")

    if not config.enable:
        return decide(replicas, Reason.DISABLED, "are not auto-set")
    if not usage.samples or not usage.fresh:
        return decide(replicas, Reason.NO_SAMPLES, f"stay {replicas}: no recent usage sample")
    target = config.target_tflops_of_limits * max_limit
    if target <= 0:
        return decide(replicas, Reason.UNCHANGED, f"stay {replicas}: a replica has no TFLOPS limit to measure")
    ratio = Fraction(usage.mean) / target
    why = (
        f"{_show(Resource.TFLOPS, ceil(usage.mean))} per replica against a target of "
        f"{float(config.target_tflops_of_limits * 100):g} % of {_show(Resource.TFLOPS, max_limit)}"
    )
    if abs(ratio - 1) <= REPLICAS_TOLERANCE:
        return decide(replicas, Reason.INSIDE_IGNORED_RANGE, f"stay {replicas}: {why}, within 10 %")
    desired = min(max(ceil(replicas * ratio), min_replicas), max_replicas)
    since = None if last_scaled_s is None else now_s - last_scaled_s
    if desired > replicas:
        new = min(desired, replicas + config.scale_up_step.of(replicas))
        if since is not None and since < config.scale_up_cool_down_s:
            wait = _duration(config.scale_up_cool_down_s - since)
            return decide(replicas, Reason.COOLING_DOWN, f"stay {replicas} for {wait} (scaleUpCoolDownTime); {why}")
        return decide(new, Reason.SCALED_UP, f"scaled up to {new}: {why}")
    if desired < replicas:
        if usage.coverage < MIN_COVERAGE:
            return decide(replicas, Reason.NO_SAMPLES, f"stay {replicas}: {_missing(usage)}")
        new = max(desired, replicas - config.scale_down_step.of(replicas))
        if since is not None and since < config.scale_down_cool_down_s:
            wait = _duration(config.scale_down_cool_down_s - since)
            return decide(replicas, Reason.COOLING_DOWN, f"stay {replicas} for {wait} (scaleDownCoolDownTime); {why}")
        return decide(new, Reason.SCALED_DOWN, f"scaled down to {new}: {why}")
    return decide(replicas, Reason.UNCHANGED, f"stay {replicas} (between {min_replicas} and {max_replicas}): {why}")


def _missing(usage: WindowStats) -> str:
    return f"only {usage.coverage:.0%} of the window's samples are there; missing samples never lower anything"


def _duration(seconds: float) -> str:
    """``45s``, ``12m30s``, ``3h``, ``2d4h`` — the largest two units, rounded down."""
    whole = int(seconds)
    parts = [(whole // 86400, "d"), (whole % 86400 // 3600, "h"), (whole % 3600 // 60, "m"), (whole % 60, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n]
    return "".join(shown[:2]) or "0s"
