"""The contracts between the binaries: encode/decode round-trips, strict rejection of anything else."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu.contract import allocation, inventory, resolved
from vgpu.contract.allocation import GpuGrant, Handoff, PodAllocation
from vgpu.contract.inventory import GpuInfo, Health, NodeInventory
from vgpu.errors import DomainError
from vgpu.names import EnforcementBackend, PlacementPolicy, Qos
from vgpu.request import GpuRequest

NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)
MILLI = st.integers(min_value=0, max_value=10**9)
BYTES = st.integers(min_value=0, max_value=2**50)

GPUS = st.builds(
    GpuInfo, uuid=NAME.map(lambda s: f"GPU-{s}"), index=st.integers(0, 15), model=NAME, tflops=MILLI, vram=BYTES,
    health=st.sampled_from(Health), numa=st.none() | st.integers(0, 7), mig=st.booleans(),
)  # fmt: skip
INVENTORIES = st.builds(
    NodeInventory, node=NAME, pool=NAME, gpus=st.lists(GPUS, max_size=4).map(tuple), slices_per_gpu=st.integers(1, 64),
    backend=st.sampled_from(EnforcementBackend), heartbeat=st.just("2026-11-22T04:00:00Z"),
)  # fmt: skip
GRANTS = st.builds(
    GpuGrant, uuid=NAME, index=st.integers(0, 15), tflops_request=MILLI, tflops_limit=MILLI,
    vram_request=BYTES, vram_limit=BYTES, gpu_tflops=MILLI,
)  # fmt: skip
ALLOCATIONS = st.builds(
    PodAllocation, pod_uid=NAME, node=NAME, pool=NAME, qos=st.sampled_from(Qos),
    containers=st.lists(NAME, min_size=1, max_size=3).map(tuple), gpus=st.lists(GRANTS, min_size=1, max_size=4).map(tuple),
    bound_at=st.just("2026-11-22T04:00:00Z"),
)  # fmt: skip
HANDOFFS = st.builds(
    Handoff, pod_uid=NAME, node=NAME, at=st.just("2026-11-22T04:00:01Z"),
    devices=st.lists(st.tuples(NAME, st.lists(NAME, max_size=3).map(tuple)), max_size=3).map(tuple),
)  # fmt: skip
_REQUESTS = st.builds(
    GpuRequest, pool=NAME, containers=st.lists(NAME, min_size=1, max_size=3).map(tuple), gpu_count=st.integers(1, 128),
    tflops_request=MILLI, tflops_limit=MILLI, vram_request=BYTES, vram_limit=BYTES, qos=st.sampled_from(Qos),
    gpu_model=st.none() | NAME, dedicated_gpu=st.booleans(), is_local_gpu=st.booleans(),
    no_standalone_worker_mode=st.booleans(),
    workload=st.none() | NAME, generate_workload=st.none() | st.booleans(), workload_profile=st.none() | NAME,
    replicas=st.none() | st.integers(0, 100), placement_policy=st.none() | st.sampled_from(PlacementPolicy),
    node_affinity=st.none() | st.just({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}),
    auto_scaling=st.sampled_from([{}, {"autoSetLimits": {"enable": True, "scaleUpStep": "0.2"}}]),
)  # fmt: skip
PERCENTS = st.none() | st.tuples(st.integers(1, 100_000), st.integers(1, 100_000))  # thousandths, both or neither
REQUESTS = st.tuples(_REQUESTS, PERCENTS).map(
    lambda r: r[0] if r[1] is None else replace(r[0], compute_percent_request=r[1][0], compute_percent_limit=r[1][1])
)

# Fields added to a version after it shipped: absent in what older writers wrote, so absent is their default.
ADDED: dict[str, dict[str, Any]] = {".dedicatedGpu": {"dedicated_gpu": False}}

CODECS: list[tuple[str, Any, Callable[[Any], str], Callable[[str], Any]]] = [
    ("inventory", INVENTORIES, inventory.encode, inventory.decode),
    ("allocation", ALLOCATIONS, allocation.encode, allocation.decode),
    ("handoff", HANDOFFS, allocation.encode_handoff, allocation.decode_handoff),
    ("resolved", REQUESTS, resolved.encode, resolved.decode),
]


def mutilations(doc: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every copy of ``doc`` with exactly one object key removed, at any depth."""
    if isinstance(doc, dict):
        for key in doc:
            yield f"{path}.{key}", {k: v for k, v in doc.items() if k != key}
            for where, inner in mutilations(doc[key], f"{path}.{key}"):
                yield where, {**doc, key: inner}
    elif isinstance(doc, list):
        for i, item in enumerate(doc):
            for where, inner in mutilations(item, f"{path}[{i}]"):
                yield where, [*doc[:i], inner, *doc[i + 1 :]]


@pytest.mark.parametrize(("name", "values", "encode", "decode"), CODECS, ids=[c[0] for c in CODECS])
@given(data=st.data())
def test_round_trip_and_strictness(name: str, values: Any, encode: Any, decode: Any, data: st.DataObject) -> None:
    value = data.draw(values)
    text = encode(value)
    assert decode(text) == value
    assert encode(decode(text)) == text  # deterministic bytes: patch only on change
    for cut in range(len(text)):
        with pytest.raises(DomainError):
            decode(text[:cut])  # every truncation is rejected
    doc = json.loads(text)
    for where, broken in mutilations(doc):
        if "autoScalingConfig." in where or "nodeAffinity." in where:
            continue  # inner maps carried as is: validated by the profile parser / the API server
        if where in ADDED:
            assert decode(json.dumps(broken)) == replace(value, **ADDED[where])
            continue
        with pytest.raises(DomainError, match="missing"):
            decode(json.dumps(broken))


@pytest.mark.parametrize(("name", "values", "encode", "decode"), CODECS, ids=[c[0] for c in CODECS])
@given(data=st.data())
def test_unknown_version_and_unknown_field(
    name: str, values: Any, encode: Any, decode: Any, data: st.DataObject
) -> None:
    doc = json.loads(encode(data.draw(values)))
    with pytest.raises(DomainError, match=r"version 'v2': unsupported; this build reads v1"):
        decode(json.dumps({**doc, "version": "v2"}))
    with pytest.raises(DomainError, match="surprise: unknown field"):
        decode(json.dumps({**doc, "surprise": 1}))


def test_messages_name_the_document_and_path() -> None:
    doc = json.loads(inventory.encode(NodeInventory(
        node="n", pool="p", slices_per_gpu=4, backend=EnforcementBackend.NONE, heartbeat="t",
        gpus=(GpuInfo(uuid="GPU-1", index=0, model="T4", tflops=65_000, vram=15109 * 2**20),),
    )))  # fmt: skip
    doc["gpus"][0]["vram"] = "lots"
    with pytest.raises(
        DomainError, match=r"tensor-fusion.ai/gpu-inventory.gpus\[0\].vram 'lots': not a Kubernetes quantity"
    ):
        inventory.decode(json.dumps(doc))
    doc["gpus"][0]["index"] = True
    with pytest.raises(DomainError, match=r"gpus\[0\].index 'True': must be a whole number"):
        inventory.decode(json.dumps(doc))
    with pytest.raises(DomainError, match="must be a JSON object"):
        inventory.decode("[]")
    with pytest.raises(DomainError, match="not valid JSON"):
        inventory.decode("{")
