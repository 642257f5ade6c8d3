"""The ``/usage`` document a device plugin serves: exact round-trips, strict rejection of anything else."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu.contract import usage
from vgpu.contract.usage import ContainerUsage, NodeUsage, Unattributed
from vgpu.errors import DomainError

NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)
MILLI = st.integers(min_value=0, max_value=10**9)
BYTES = st.integers(min_value=0, max_value=2**50)
CONTAINERS = st.builds(
    ContainerUsage, namespace=NAME, pod=NAME, pod_uid=NAME, container=NAME, gpu=NAME, tflops_used=MILLI,
    vram_used=BYTES, tflops_measured=st.booleans(), tflops_request=MILLI, tflops_limit=MILLI, vram_request=BYTES, vram_limit=BYTES,
)  # fmt: skip
UNATTRIBUTED = st.builds(
    Unattributed, gpu=NAME, processes=st.integers(0, 10_000), tflops_used=MILLI, vram_used=BYTES,
    tflops_measured=st.booleans(),
)  # fmt: skip
DOCUMENTS = st.builds(
    NodeUsage, node=NAME, sampled_at=st.just("2026-11-22T04:00:00.125Z"),
    interval_s=st.sampled_from([0.05, 1, 5.0, 30]), containers=st.lists(CONTAINERS, max_size=4).map(tuple),
    unattributed=st.lists(UNATTRIBUTED, max_size=3).map(tuple),
)  # fmt: skip


@given(DOCUMENTS)
def test_every_document_round_trips_exactly(doc: NodeUsage) -> None:
    assert usage.decode(usage.encode(doc)) == doc


def test_quantities_are_kubernetes_quantities() -> None:
    doc = NodeUsage(
        node="n",
        sampled_at="2026-11-22T04:00:00.125Z",
        interval_s=5,
        containers=(
            ContainerUsage(
                namespace="ml",
                pod="p",
                pod_uid="u",
                container="main",
                gpu="GPU-0",
                tflops_used=31_200,
                vram_used=1024**3,
                tflops_measured=True,
                tflops_request=10_000,
                tflops_limit=20_500,
                vram_request=0,
                vram_limit=4 * 1024**3,
            ),
        ),
    )
    (c,) = json.loads(usage.encode(doc))["containers"]
    assert (c["tflopsUsed"], c["tflopsLimit"], c["vramUsed"], c["vramLimit"]) == ("31200m", "20500m", "1Gi", "4Gi")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d | {"version": "v9"}, "node usage.version"),
        (lambda d: d | {"extra": 1}, r"node usage\.extra: unknown field"),
        (lambda d: {k: v for k, v in d.items() if k != "sampledAt"}, r"node usage\.sampledAt: missing"),
        (lambda d: d | {"intervalSeconds": 0}, "intervalSeconds"),
        (
            lambda d: d | {"unattributed": [{"gpu": "g", "processes": 1, "tflopsUsed": "x", "vramUsed": "0"}]},
            "tflopsUsed",
        ),
    ],
)
def test_a_document_off_the_contract_is_refused_naming_the_path(
    edit: Callable[[dict[str, Any]], dict[str, Any]], message: str
) -> None:
    doc = NodeUsage(node="n", sampled_at="2026-11-22T04:00:00Z", interval_s=5, containers=())
    with pytest.raises(DomainError, match=message):
        usage.decode(json.dumps(edit(json.loads(usage.encode(doc)))))
