"""core/v1 NodeAffinity required terms, evaluated purely over a node's name and labels."""

from __future__ import annotations

from typing import Any

import pytest

from tests.vgpu.scheduling.builders import expr, required
from vgpu.scheduling.affinity import node_affinity_matches

LABELS = {"zone": "a", "gpu-gen": "8", "tier": "gold"}


@pytest.mark.parametrize(
    ("affinity", "expected"),
    [
        pytest.param(None, True, id="no affinity"),
        pytest.param({}, True, id="empty affinity"),
        pytest.param({"preferredDuringSchedulingIgnoredDuringExecution": []}, True, id="only preferred terms"),
        pytest.param(required([expr("zone", "In", "a", "b")]), True, id="In hit"),
        pytest.param(required([expr("zone", "In", "b")]), False, id="In miss"),
        pytest.param(required([expr("missing", "In", "a")]), False, id="In on absent label"),
        pytest.param(required([expr("zone", "NotIn", "b")]), True, id="NotIn hit"),
        pytest.param(required([expr("zone", "NotIn", "a")]), False, id="NotIn miss"),
        pytest.param(required([expr("missing", "NotIn", "a")]), True, id="NotIn on absent label"),
        pytest.param(required([expr("zone", "Exists")]), True, id="Exists"),
        pytest.param(required([expr("missing", "Exists")]), False, id="Exists on absent label"),
        pytest.param(required([expr("missing", "DoesNotExist")]), True, id="DoesNotExist"),
        pytest.param(required([expr("zone", "DoesNotExist")]), False, id="DoesNotExist on present label"),
        pytest.param(required([expr("gpu-gen", "Gt", "7")]), True, id="Gt hit"),
        pytest.param(required([expr("gpu-gen", "Gt", "8")]), False, id="Gt is strict"),
        pytest.param(required([expr("gpu-gen", "Lt", "9")]), True, id="Lt hit"),
        pytest.param(required([expr("gpu-gen", "Lt", "8")]), False, id="Lt is strict"),
        pytest.param(required([expr("tier", "Gt", "1")]), False, id="Gt on a non-integer label"),
        pytest.param(required([expr("gpu-gen", "Gt", "1", "2")]), False, id="Gt with two values"),
        pytest.param(required([expr("gpu-gen", "Gt", " 7")]), False, id="Gt value with a space"),
        pytest.param(required([expr("zone", "Exists", "a")]), False, id="Exists with values is malformed"),
        pytest.param(required([expr("zone", "Like", "a")]), False, id="unknown operator"),
        pytest.param(required([expr("zone", "In", "a"), expr("tier", "In", "gold")]), True, id="AND both hold"),
        pytest.param(required([expr("zone", "In", "a"), expr("tier", "In", "bronze")]), False, id="AND one fails"),
        pytest.param(required([expr("zone", "In", "b")], [expr("tier", "In", "gold")]), True, id="OR second term"),
        pytest.param(required([expr("zone", "In", "b")], [expr("tier", "In", "x")]), False, id="OR no term"),
        pytest.param(required(), False, id="no terms match nothing"),
        pytest.param(required([]), False, id="an empty term matches nothing"),
        pytest.param(required(fields=[expr("metadata.name", "In", "n1")]), True, id="matchFields name In"),
        pytest.param(required(fields=[expr("metadata.name", "NotIn", "n1")]), False, id="matchFields name NotIn"),
        pytest.param(required(fields=[expr("metadata.uid", "In", "n1")]), False, id="matchFields other field"),
        pytest.param(
            required(fields=[expr("metadata.name", "In", "n1", "n2")]), False, id="matchFields needs one value"
        ),
        pytest.param({"requiredDuringSchedulingIgnoredDuringExecution": "zone=a"}, False, id="malformed selector"),
        pytest.param(
            {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ["zone"]}},
            False,
            id="malformed term",
        ),
        pytest.param(required([{"key": "zone", "operator": "In", "values": "a"}]), False, id="values not a list"),
    ],
)
def test_required_node_affinity(affinity: dict[str, Any] | None, expected: bool) -> None:
    assert node_affinity_matches(affinity, "n1", LABELS) is expected


def test_match_expressions_and_match_fields_in_one_term_are_anded() -> None:
    term = {"matchExpressions": [expr("zone", "In", "a")], "matchFields": [expr("metadata.name", "In", "n2")]}
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    assert not node_affinity_matches(affinity, "n1", LABELS)
    assert node_affinity_matches(affinity, "n2", LABELS)
