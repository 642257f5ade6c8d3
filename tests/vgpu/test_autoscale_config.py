"""autoScalingConfig to typed values: every default, every accepted form, the docs' table kept equal to the code's.

The rejected forms and their messages are in test_request_errors.py (PROFILE_CASES), where admission sees them.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from vgpu.autoscale.config import (
    FIELDS,
    LIMITS,
    PREDICTION,
    PREDICTION_FIELDS,
    REPLICAS,
    REQUESTS,
    AutoScalingConfig,
    LimitsConfig,
    Prediction,
    ReplicasConfig,
    ReplicaStep,
    RequestsConfig,
    Resource,
    Target,
    parse,
)
from vgpu.errors import DomainError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "autoscaling.md"
NO_PREDICTION = Prediction(enable=False, model=None, history_data_period_s=None, prediction_period_s=None)


def test_an_empty_config_is_every_documented_default() -> None:
    assert parse({}) == AutoScalingConfig(
        limits=LimitsConfig(
            enable=False, target=Target.ALL, evaluation_period_s=60.0, extra_tflops_buffer=Fraction(15, 100),
            ignored_delta=Fraction(5, 100), scale_up_step=Fraction(1), max_ratio_to_requests=Fraction(5),
            prediction=NO_PREDICTION,
        ),
        replicas=ReplicasConfig(
            enable=False, target_tflops_of_limits=Fraction(8, 10), evaluation_period_s=15.0,
            scale_up_step=ReplicaStep(100, percent=True), scale_down_step=ReplicaStep(100, percent=True),
            scale_up_cool_down_s=0.0, scale_down_cool_down_s=300.0,
        ),
        requests=RequestsConfig(
            enable=False, target=Target.ALL, percentile=Fraction(9, 10), extra_buffer=Fraction(15, 100),
            evaluation_period_s=60.0, aggregation_period_s=86400.0, prediction=NO_PREDICTION,
        ),
    )  # fmt: skip


def vars_of(config: AutoScalingConfig) -> dict[str, Any]:
    return {LIMITS: config.limits, REPLICAS: config.replicas, REQUESTS: config.requests}


ACCEPTED: list[tuple[str, str, object, str, object]] = [
    (LIMITS, "extraTFlopsBufferRatio", "0.2", "extra_tflops_buffer", Fraction(1, 5)),
    (LIMITS, "extraTFlopsBufferRatio", "20%", "extra_tflops_buffer", Fraction(1, 5)),
    (LIMITS, "extraTFlopsBufferRatio", "0", "extra_tflops_buffer", Fraction(0)),
    (LIMITS, "ignoredDeltaRange", "0.999", "ignored_delta", Fraction(999, 1000)),
    (LIMITS, "scaleUpStep", "2.0", "scale_up_step", Fraction(2)),
    (LIMITS, "scaleUpStep", "12.5%", "scale_up_step", Fraction(1, 8)),
    (LIMITS, "maxRatioToRequests", "1", "max_ratio_to_requests", Fraction(1)),
    (LIMITS, "maxRatioToRequests", "500%", "max_ratio_to_requests", Fraction(5)),
    (LIMITS, "targetResource", "vram", "target", Target.VRAM),
    (LIMITS, "evaluationPeriod", "30s", "evaluation_period_s", 30.0),
    (LIMITS, "evaluationPeriod", "1h30m", "evaluation_period_s", 5400.0),
    (LIMITS, "evaluationPeriod", "1.5h", "evaluation_period_s", 5400.0),
    (LIMITS, "evaluationPeriod", "500ms", "evaluation_period_s", 0.5),
    (LIMITS, "evaluationPeriod", "250us", "evaluation_period_s", 0.00025),
    (LIMITS, "evaluationPeriod", "365d", "evaluation_period_s", 365 * 86400.0),
    (LIMITS, "prediction", {"enable": True, "model": "lstm", "historyDataPeriod": "7d"}, "prediction",
     Prediction(enable=True, model="lstm", history_data_period_s=604800.0, prediction_period_s=None)),
    (REPLICAS, "targetTFlopsOfLimits", "100%", "target_tflops_of_limits", Fraction(1)),
    (REPLICAS, "scaleUpStep", "2", "scale_up_step", ReplicaStep(2, percent=False)),
    (REPLICAS, "scaleUpStep", "250%", "scale_up_step", ReplicaStep(250, percent=True)),
    (REPLICAS, "scaleDownStep", "1000000", "scale_down_step", ReplicaStep(1_000_000, percent=False)),
    (REPLICAS, "scaleUpCoolDownTime", "0s", "scale_up_cool_down_s", 0.0),
    (REPLICAS, "scaleDownCoolDownTime", "1w", "scale_down_cool_down_s", 604800.0),
    (REQUESTS, "percentileForAutoRequests", "0.99", "percentile", Fraction(99, 100)),
    (REQUESTS, "percentileForAutoRequests", "99.5%", "percentile", Fraction(995, 1000)),
    (REQUESTS, "extraBufferRatio", "10%", "extra_buffer", Fraction(1, 10)),
    (REQUESTS, "aggregationPeriod", "2w", "aggregation_period_s", 1209600.0),
    (REQUESTS, "enable", True, "enable", True),
]  # fmt: skip


@pytest.mark.parametrize(("block", "key", "raw", "attr", "typed"), ACCEPTED)
def test_each_accepted_form_is_read_exactly(block: str, key: str, raw: object, attr: str, typed: object) -> None:
    config = parse({block: {key: raw}})
    assert getattr(vars_of(config)[block], attr) == typed
    others = {b: v for b, v in vars_of(config).items() if b != block}
    assert others == {b: v for b, v in vars_of(parse({})).items() if b != block}  # nothing else moved


def test_parse_reports_every_problem_naming_the_path_it_was_given() -> None:
    with pytest.raises(DomainError) as caught:
        parse({"autoSetLimits": {"scaleUpStep": "x"}, "autoSetEverything": {}}, where="workload w")
    assert [str(e) for e in caught.value.errors] == [
        "workload w.autoSetEverything: unknown field; accepted: autoSetLimits, autoSetReplicas, autoSetRequests",
        "workload w.autoSetLimits.scaleUpStep 'x': must be a ratio above 0, such as 1.0 or 100% "
        "(the most one raise adds, as a share of the current limit)",
    ]


@pytest.mark.parametrize(
    ("step", "replicas", "moves"),
    [
        (ReplicaStep(2, percent=False), 10, 2),
        (ReplicaStep(2, percent=False), 1, 2),
        (ReplicaStep(50, percent=True), 3, 2),  # 1.5 rounds up, as HPA's Percent policy
        (ReplicaStep(50, percent=True), 4, 2),
        (ReplicaStep(10, percent=True), 1, 1),  # at least one
        (ReplicaStep(100, percent=True), 7, 7),
        (ReplicaStep(250, percent=True), 2, 5),
    ],
)
def test_a_replica_step_moves(step: ReplicaStep, replicas: int, moves: int) -> None:
    assert step.of(replicas) == moves


@pytest.mark.parametrize(
    ("target", "covered"),
    [
        (Target.ALL, {Resource.TFLOPS, Resource.VRAM}),
        (Target.TFLOPS, {Resource.TFLOPS}),
        (Target.VRAM, {Resource.VRAM}),
    ],
)
def test_target_resource_covers(target: Target, covered: set[Resource]) -> None:
    assert {r for r in Resource if target.covers(r)} == covered


def documented_rows() -> dict[tuple[str, str], list[str]]:
    """(layer, field) -> the remaining cells of docs/autoscaling.md's defaults table."""
    rows = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"`autoSet\w+`", cells[0]):
            rows[(cells[0].strip("`"), cells[1].strip("`"))] = cells[2:]
    return rows


def shown_default(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{default}`"


def test_the_docs_table_lists_every_field_with_its_default_what_is_accepted_and_the_source() -> None:
    expected = {}
    for block, schema in FIELDS.items():
        for f in schema:
            if f.key == PREDICTION:
                for p in PREDICTION_FIELDS:
                    expected[(block, f"prediction.{p.key}")] = [shown_default(p.default), p.accepted, p.source]
            else:
                expected[(block, f.key)] = [shown_default(f.default), f.accepted, f.source]
    assert documented_rows() == expected
