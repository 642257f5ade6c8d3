"""GPUs per container (container-gpu-count): the request it resolves to, the contracts that carry it, the split.

Every refusal's message is in test_request_errors.py; here, what an accepted map means.
"""

from __future__ import annotations

import json

import pytest

from vgpu.container_gpus import split
from vgpu.contract import allocation, resolved
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.errors import DomainError
from vgpu.names import Annotation, Qos
from vgpu.profile import ProfileSpec, Resources
from vgpu.request import resolve

from .builders import pod

A = Annotation
GI = 1024**3
SHARE = {A.TFLOPS_REQUEST.value: "10", A.VRAM_REQUEST.value: "4Gi"}


def counts(value: dict[str, int], **more: str) -> dict[str, str]:
    return {**SHARE, A.CONTAINER_GPU_COUNT.value: json.dumps(value), **more}


def test_the_map_names_the_inject_containers_in_the_pods_order_and_the_pod_gets_their_sum() -> None:
    got = resolve(pod(counts({"inference": 2, "pre": 1}), containers=("pre", "logger", "inference")))
    assert (got.containers, got.gpu_count) == (("pre", "inference"), 3)
    assert got.container_gpu_counts == (("pre", 1), ("inference", 2))
    assert (got.tflops_request, got.vram_request) == (10_000, 4 * GI)  # the share stays per GPU
    assert got.describe().endswith(", GPUs per container: pre 1, inference 2")


def test_beside_inject_container_the_counts_follow_its_order_and_an_equal_gpu_count_is_accepted() -> None:
    annotations = counts({"a": 1, "b": 2}, **{A.INJECT_CONTAINER.value: "b,a", A.GPU_COUNT.value: "3"})
    got = resolve(pod(annotations, containers=("a", "b")))
    assert (got.containers, got.container_gpu_counts, got.gpu_count) == (("b", "a"), (("b", 2), ("a", 1)), 3)


def test_the_pods_map_beats_a_lower_layers_gpu_count() -> None:
    profile = ProfileSpec(resources=Resources(vram_request=GI), gpu_count=4, qos=Qos.HIGH)
    got = resolve(pod(counts({"a": 1, "b": 1}), containers=("a", "b")), profile=profile)
    assert (got.gpu_count, got.qos) == (2, Qos.HIGH)


def test_without_the_map_every_container_gets_every_gpu_as_before() -> None:
    got = resolve(pod({**SHARE, A.GPU_COUNT.value: "2", A.INJECT_CONTAINER.value: "a,b"}, containers=("a", "b")))
    assert got.container_gpu_counts is None and got.gpu_count == 2
    assert "containerGpuCount" not in json.loads(resolved.encode(got))  # reads as before the field existed


def test_whole_gpus_and_pinned_indices_go_with_the_map() -> None:
    dedicated = {A.CONTAINER_GPU_COUNT.value: '{"a": 1, "b": 1}', A.DEDICATED_GPU.value: "true"}
    got = resolve(pod(dedicated, containers=("a", "b")))
    assert (got.dedicated_gpu, got.gpu_count, got.container_gpu_counts) == (True, 2, (("a", 1), ("b", 1)))
    pinned = resolve(pod(counts({"a": 1, "b": 2}, **{A.GPU_INDICES.value: "3,0,1"}), containers=("a", "b")))
    assert (pinned.gpu_count, pinned.gpu_indices) == (3, (3, 0, 1))


def test_the_counts_survive_the_resolved_contract_which_holds_them_to_the_containers() -> None:
    got = resolve(pod(counts({"a": 1, "b": 2}), containers=("a", "b")))
    text = resolved.encode(got)
    assert resolved.decode(text) == got
    doc = json.loads(text)
    doc["gpuCount"] = 2
    with pytest.raises(DomainError, match=r"containerGpuCount .* summing to gpuCount 2"):
        resolved.decode(json.dumps(doc))
    doc["gpuCount"], doc["containerGpuCount"] = 3, [{"container": "b", "count": 2}, {"container": "a", "count": 1}]
    with pytest.raises(DomainError, match="must give each of the containers a, b its count, in order"):
        resolved.decode(json.dumps(doc))


def grant(uuid: str, index: int) -> GpuGrant:
    return GpuGrant(
        uuid=uuid, index=index, tflops_request=1, tflops_limit=1, vram_request=1, vram_limit=1, gpu_tflops=312_000
    )


GRANTS = (grant("GPU-c", 2), grant("GPU-a", 0), grant("GPU-d", 3))


def test_the_split_gives_runs_of_gpus_by_index_or_in_gpu_indices_order() -> None:
    pods = (("pre", 1), ("inference", 2))
    assert split(pods, GRANTS) == (("pre", ("GPU-a",)), ("inference", ("GPU-c", "GPU-d")))
    assert split(pods, GRANTS, (3, 0, 2)) == (("pre", ("GPU-d",)), ("inference", ("GPU-a", "GPU-c")))


def alloc(container_gpus: tuple[tuple[str, tuple[str, ...]], ...] | None) -> PodAllocation:
    return PodAllocation(
        pod_uid="u",
        node="n",
        pool="default-pool",
        qos=Qos.MEDIUM,
        containers=("pre", "inference"),
        gpus=GRANTS,
        bound_at="2026-01-01T00:00:00Z",
        container_gpus=container_gpus,
    )


def test_the_allocation_says_which_gpus_each_container_gets() -> None:
    granted = alloc(split((("pre", 1), ("inference", 2)), GRANTS))
    text = allocation.encode(granted)
    assert allocation.decode(text) == granted
    assert json.loads(text)["containerGpus"] == [
        {"container": "pre", "uuids": ["GPU-a"]},
        {"container": "inference", "uuids": ["GPU-c", "GPU-d"]},
    ]
    assert granted.gpus_of("pre") == (GRANTS[1],)
    assert granted.gpus_of("inference") == (GRANTS[0], GRANTS[2])
    assert "GPUs per container: pre: GPU-a; inference: GPU-c, GPU-d" in granted.describe()


def test_an_allocation_without_the_split_gives_every_container_every_gpu() -> None:
    granted = alloc(None)
    text = allocation.encode(granted)
    assert "containerGpus" not in json.loads(text)  # what every earlier extender wrote, read as before
    assert allocation.decode(text).gpus_of("pre") == allocation.decode(text).gpus_of("inference") == GRANTS


@pytest.mark.parametrize(
    ("container_gpus", "message"),
    [
        ((("inference", ("GPU-a",)), ("pre", ("GPU-c", "GPU-d"))), "must name the containers pre, inference, in order"),
        ((("pre", ("GPU-a",)),), "must name the containers pre, inference, in order"),
        ((("pre", ("GPU-a", "GPU-c")), ("inference", ("GPU-c", "GPU-d"))), "each granted GPU to exactly one container"),
        ((("pre", ("GPU-a",)), ("inference", ("GPU-c",))), "each granted GPU to exactly one container"),
        ((("pre", ()), ("inference", ("GPU-a", "GPU-c", "GPU-d"))), "and each container a GPU"),
        ((("pre", ("GPU-a",)), ("inference", ("GPU-c", "GPU-x"))), "each granted GPU to exactly one container"),
    ],
    ids=["order", "a container missing", "a GPU twice", "a GPU to none", "a container without", "not granted"],
)
def test_a_split_that_is_not_a_partition_of_the_grant_is_refused(
    container_gpus: tuple[tuple[str, tuple[str, ...]], ...], message: str
) -> None:
    with pytest.raises(DomainError, match=message):
        allocation.decode(allocation.encode(alloc(container_gpus)))
