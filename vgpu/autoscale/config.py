"""The ``autoScalingConfig`` tree, read strictly into typed values with every default filled in.

One table (:data:`FIELDS`) says, for each field of each layer, what is accepted, the default and where
that default comes from (VPA, HPA, TensorFusion). The profile parser validates every WorkloadProfile,
workload and pool layer with it, so a malformed config is denied at admission naming the field, the
value and what is accepted; the recommender reads the typed form (:func:`parse`); and
``docs/autoscaling.md`` lists the same table (a test keeps the two equal). In the CRD the values stay
strings: ratios (``0.2`` or ``20%``) become exact Fractions here, durations (``5m``) seconds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from math import ceil
from typing import Any, Final

from vgpu import fields
from vgpu.errors import DomainError, FieldError

LIMITS: Final = "autoSetLimits"
REPLICAS: Final = "autoSetReplicas"
REQUESTS: Final = "autoSetRequests"
PREDICTION: Final = "prediction"

MAX_DURATION_S: Final = 365 * 86400


class Resource(StrEnum):
    """A GPU resource a layer sizes: TFLOPS in milli, VRAM in bytes."""

    TFLOPS = "tflops"
    VRAM = "vram"


class Target(StrEnum):
    """``targetResource``: which resources a layer adjusts."""

    ALL = "all"
    TFLOPS = "tflops"
    VRAM = "vram"

    def covers(self, resource: Resource) -> bool:
        return self is Target.ALL or self.value == resource.value


@dataclass(frozen=True, slots=True)
class ReplicaStep:
    """The most replicas one scaling step adds or removes: a count (HPA policy type ``Pods``) or a
    whole percentage of the current replicas (type ``Percent``)."""

    value: int
    percent: bool

    def of(self, replicas: int) -> int:
        """Replicas one step may move at ``replicas``: a percentage rounds up, as HPA's does."""
        return max(1, ceil(Fraction(replicas * self.value, 100))) if self.percent else self.value


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """A layer's ``prediction`` block: parsed and kept, not implemented (admission warns so)."""

    enable: bool
    model: str | None
    history_data_period_s: float | None
    prediction_period_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitsConfig:
    """``autoSetLimits``: layer 1, bursts the limit in place towards recent peak usage."""

    enable: bool
    target: Target
    evaluation_period_s: float
    extra_tflops_buffer: Fraction
    ignored_delta: Fraction
    scale_up_step: Fraction
    max_ratio_to_requests: Fraction
    prediction: Prediction


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicasConfig:
    """``autoSetReplicas``: layer 2, adds replicas when usage stays near the most a limit may reach."""

    enable: bool
    target_tflops_of_limits: Fraction
    evaluation_period_s: float
    scale_up_step: ReplicaStep
    scale_down_step: ReplicaStep
    scale_up_cool_down_s: float
    scale_down_cool_down_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestsConfig:
    """``autoSetRequests``: layer 3, moves the reserved request to a usage percentile over a long period."""

    enable: bool
    target: Target
    percentile: Fraction
    extra_buffer: Fraction
    evaluation_period_s: float
    aggregation_period_s: float
    prediction: Prediction


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoScalingConfig:
    limits: LimitsConfig
    replicas: ReplicasConfig
    requests: RequestsConfig


Read = Callable[[str, object, list[FieldError]], Any]


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a block: its CRD key, what it must be, its default (in the CRD's own form) and why."""

    key: str
    attr: str  # the typed config's attribute
    kind: str  # bool | text | target | ratio | duration | steps | prediction: the CRD-facing type
    accepted: str  # what a value must be, in words: the error message's and the docs' text
    default: object  # None: unset
    source: str  # where the default comes from
    read: Read  # the typed value, or None with a FieldError appended


def _string(parse: Callable[[str, str, list[FieldError]], Any]) -> Read:
    def read(key: str, raw: object, errors: list[FieldError]) -> Any:
        if isinstance(raw, str):
            return parse(key, raw, errors)
        errors.append(FieldError(key, fields.shown(raw), "must be a string"))
        return None

    return read


def _flag(key: str, raw: object, errors: list[FieldError]) -> bool | None:
    if isinstance(raw, bool):
        return raw
    errors.append(FieldError(key, fields.shown(raw), "must be true or false"))
    return None


def _ratio(accepted: str, within: Callable[[Fraction], bool]) -> Read:
    return _string(lambda key, raw, errors: fields.ratio(key, raw, errors, accepted, within))


def _duration(accepted: str, within: Callable[[Fraction], bool]) -> Read:
    def seconds(key: str, raw: str, errors: list[FieldError]) -> float | None:
        value = fields.duration(key, raw, errors, accepted, within)
        return None if value is None else float(value)

    return _string(seconds)


_STEPS = re.compile(r"^([1-9][0-9]{0,6})(%?)$")


def _steps(key: str, raw: str, errors: list[FieldError]) -> ReplicaStep | None:
    match = _STEPS.fullmatch(raw)
    if match and (match[2] or int(match[1]) <= fields.MAX_REPLICAS):
        return ReplicaStep(int(match[1]), bool(match[2]))
    errors.append(FieldError(key, fields.shown(raw), f"must be {STEPS}"))
    return None


def _target(key: str, raw: str, errors: list[FieldError]) -> Target | None:
    chosen = fields.choice(key, raw, tuple(Target), errors)
    return None if chosen is None else Target(chosen)


BUFFER: Final = "a ratio of 0 or more, such as 0.15 or 15%"
IGNORED: Final = "a ratio from 0 up to (not including) 1, such as 0.05 or 5%"
LIMIT_STEP: Final = "a ratio above 0, such as 1.0 or 100% (the most one raise adds, as a share of the current limit)"
MAX_RATIO: Final = "a ratio of 1 or more, such as 5.0 or 500% (a limit is never below its request)"
SHARE: Final = "a ratio above 0 and at most 1, such as 0.8 or 80%"
PERIOD: Final = "a duration above 0 and at most 365d, such as 15s, 5m, 1h or 1d"
COOL_DOWN: Final = "a duration from 0s to 365d, such as 0s, 30s, 5m or 1h"
STEPS: Final = (
    f"a whole number of replicas from 1 to {fields.MAX_REPLICAS}, such as 1 or 2, "
    "or a whole percentage of the current replicas from 1%, such as 50%"
)

_TEXT = _string(lambda _key, raw, _errors: raw)
_TARGET = _string(_target)
_BUFFER = _ratio(BUFFER, lambda v: v >= 0)
_SHARE = _ratio(SHARE, lambda v: 0 < v <= 1)
_PERIOD = _duration(PERIOD, lambda s: 0 < s <= MAX_DURATION_S)
_COOL_DOWN = _duration(COOL_DOWN, lambda s: 0 <= s <= MAX_DURATION_S)
_STEP = _string(_steps)

_OFF = "TensorFusion: a layer is off until enabled (profile, or the pod's tensor-fusion.ai/auto-* annotation)"
_TF_TARGET = 'TensorFusion: "tflops", "vram", or "all" by default'
_NOT_IMPLEMENTED = "not implemented: no prediction is made (admission warns when it is enabled)"

PREDICTION_FIELDS: Final = (
    Field("enable", "enable", "bool", "true or false", False, _NOT_IMPLEMENTED, _flag),
    Field("model", "model", "text", "a string", None, _NOT_IMPLEMENTED, _TEXT),
    Field("historyDataPeriod", "history_data_period_s", "duration", PERIOD, None, _NOT_IMPLEMENTED, _PERIOD),
    Field("predictionPeriod", "prediction_period_s", "duration", PERIOD, None, _NOT_IMPLEMENTED, _PERIOD),
)


def _prediction(key: str, raw: object, errors: list[FieldError]) -> Prediction:
    return Prediction(**_read_block(raw, PREDICTION_FIELDS, key, errors))


_PREDICTION = Field(PREDICTION, PREDICTION, "prediction", "an object", {}, _NOT_IMPLEMENTED, _prediction)

FIELDS: Final[dict[str, tuple[Field, ...]]] = {
    LIMITS: (
        Field("enable", "enable", "bool", "true or false", False, _OFF, _flag),
        Field("targetResource", "target", "target", "one of all, tflops, vram", "all", _TF_TARGET, _TARGET),
        Field("evaluationPeriod", "evaluation_period_s", "duration", PERIOD, "1m",
              "VPA: the recommender's 1-minute loop (--recommender-interval)", _PERIOD),
        Field("extraTFlopsBufferRatio", "extra_tflops_buffer", "ratio", BUFFER, "0.15",
              "VPA: the 15 % safety margin (--recommendation-margin-fraction); also TensorFusion's recommender",
              _BUFFER),
        Field("ignoredDeltaRange", "ignored_delta", "ratio", IGNORED, "0.05",
              'TensorFusion: "if they are equal within a range (eg. 5%), do nothing" (AutoSetLimits)',
              _ratio(IGNORED, lambda v: 0 <= v < 1)),
        Field("scaleUpStep", "scale_up_step", "ratio", LIMIT_STEP, "100%",
              "HPA: the default scale-up policy adds at most 100 % per period", _ratio(LIMIT_STEP, lambda v: v > 0)),
        Field("maxRatioToRequests", "max_ratio_to_requests", "ratio", MAX_RATIO, "5.0",
              'TensorFusion: "the multiplier of requests, to avoid limit set too high, like 5.0"',
              _ratio(MAX_RATIO, lambda v: v >= 1)),
        _PREDICTION,
    ),
    REPLICAS: (
        Field("enable", "enable", "bool", "true or false", False, _OFF, _flag),
        Field("targetTFlopsOfLimits", "target_tflops_of_limits", "ratio", SHARE, "0.8",
              "HPA: autoscaling/v1's default target utilisation, 80 %", _SHARE),
        Field("evaluationPeriod", "evaluation_period_s", "duration", PERIOD, "15s",
              "HPA: the controller's 15-second sync (--horizontal-pod-autoscaler-sync-period)", _PERIOD),
        Field("scaleUpStep", "scale_up_step", "steps", STEPS, "100%",
              "HPA: the default scale-up policy, 100 % per period (HPA also allows 4 pods, whichever is more)",
              _STEP),
        Field("scaleDownStep", "scale_down_step", "steps", STEPS, "100%",
              "HPA: the default scale-down policy, 100 % per period", _STEP),
        Field("scaleUpCoolDownTime", "scale_up_cool_down_s", "duration", COOL_DOWN, "0s",
              "HPA: the default scale-up stabilization window, 0 s", _COOL_DOWN),
        Field("scaleDownCoolDownTime", "scale_down_cool_down_s", "duration", COOL_DOWN, "5m",
              "HPA: the default scale-down stabilization window, 300 s", _COOL_DOWN),
    ),
    REQUESTS: (
        Field("enable", "enable", "bool", "true or false", False, _OFF, _flag),
        Field("targetResource", "target", "target", "one of all, tflops, vram", "all", _TF_TARGET, _TARGET),
        Field("percentileForAutoRequests", "percentile", "ratio", SHARE, "0.9",
              "VPA: the target is the 90th percentile (also TensorFusion's recommender)", _SHARE),
        Field("extraBufferRatio", "extra_buffer", "ratio", BUFFER, "0.15",
              "VPA: the 15 % safety margin (--recommendation-margin-fraction)", _BUFFER),
        Field("evaluationPeriod", "evaluation_period_s", "duration", PERIOD, "1m",
              "VPA: the recommender's 1-minute loop (--recommender-interval)", _PERIOD),
        Field("aggregationPeriod", "aggregation_period_s", "duration", PERIOD, "24h",
              "TensorFusion's recommender: a 24 h aggregation interval (and VPA's 24 h histogram half-life)",
              _PERIOD),
        _PREDICTION,
    ),
}  # fmt: skip

# key -> kind per block, the CRD-facing shape (tests/deploy/test_crds.py holds the CRD to it).
AUTO_BLOCKS: Final = {block: {f.key: f.kind for f in schema} for block, schema in FIELDS.items()}


def parse(auto: Mapping[str, Any], *, where: str = "autoScalingConfig") -> AutoScalingConfig:
    """The typed config, defaults filled in; raises :class:`DomainError` listing every problem."""
    errors: list[FieldError] = []
    config = _read(auto, where, errors)
    if errors:
        raise DomainError(errors)
    return config


def validate(raw: object, where: str, errors: list[FieldError]) -> dict[str, dict[str, Any]]:
    """The config as the CRD holds it (strings kept), after checking every field; problems go to ``errors``."""
    if raw is None:
        return {}
    _read(raw, where, errors)
    if not isinstance(raw, Mapping):
        return {}
    return {
        name: {k: dict(v) if isinstance(v, Mapping) else v for k, v in block.items()}
        for name, block in raw.items()
        if name in FIELDS and isinstance(block, Mapping)
    }


def _read(raw: object, where: str, errors: list[FieldError]) -> AutoScalingConfig:
    blocks: dict[str, object] = {}
    if not isinstance(raw, Mapping):
        errors.append(FieldError(where, fields.shown(raw), "must be an object"))
    else:
        for name, block in raw.items():
            if name in FIELDS:
                blocks[name] = block
            else:
                errors.append(FieldError(f"{where}.{name}", None, f"unknown field; accepted: {', '.join(FIELDS)}"))

    def typed(name: str) -> dict[str, Any]:
        return _read_block(blocks.get(name, {}), FIELDS[name], f"{where}.{name}", errors)

    return AutoScalingConfig(
        limits=LimitsConfig(**typed(LIMITS)),
        replicas=ReplicasConfig(**typed(REPLICAS)),
        requests=RequestsConfig(**typed(REQUESTS)),
    )


def _read_block(raw: object, schema: tuple[Field, ...], where: str, errors: list[FieldError]) -> dict[str, Any]:
    """attr -> typed value for every field of ``schema``: the given one where it is accepted, else the default."""
    given: Mapping[str, object] = {}
    if isinstance(raw, Mapping):
        given = raw
    else:
        errors.append(FieldError(where, fields.shown(raw), "must be an object"))
    by_key = {f.key: f for f in schema}
    for key in given:
        if key not in by_key:
            errors.append(FieldError(f"{where}.{key}", None, f"unknown field; accepted: {', '.join(by_key)}"))
    out: dict[str, Any] = {}
    for f in schema:
        value = f.read(f"{where}.{f.key}", given[f.key], errors) if f.key in given else None
        if value is None and f.default is not None:
            value = f.read(f"{where}.{f.key} (default)", f.default, errors)
        out[f.attr] = value
    return out
