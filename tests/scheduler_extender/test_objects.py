"""The pod label naming an allocation's node: a valid label value for any node name, one per node."""

from __future__ import annotations

import re

from scheduler_extender.objects import allocated_node_label

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # Kubernetes' rule, max 63


def test_a_short_node_name_is_its_own_label_value() -> None:
    assert allocated_node_label("gpu-node-7.example") == "gpu-node-7.example"


def test_a_node_name_longer_than_a_label_value_becomes_a_digest_distinct_per_node() -> None:
    a, b = "a" * 64 + ".example.com", "a" * 64 + ".example.org"
    for name in (a, b, "x" * 253):
        value = allocated_node_label(name)
        assert len(value) <= 63 and LABEL_VALUE.match(value), value
    assert allocated_node_label(a) != allocated_node_label(b)
    assert allocated_node_label(a) == allocated_node_label(a)
