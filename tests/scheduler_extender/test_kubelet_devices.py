"""The vGPU device IDs a pod's spec makes the kubelet hold: its device manager's rule, case by case.

The expected figures are worked out by hand from the kubelet's ``ManagerImpl.Allocate``: init
containers first, an ordinary init container's IDs reusable by what follows, a sidecar's and an app
container's never.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler_extender.kubelet_devices import allocate_sizes, vgpu_device_ids
from vgpu.names import RESOURCE_VGPU


def c(name: str, vgpu: object = None, *, sidecar: bool = False, requests_only: bool = False) -> dict[str, Any]:
    """A container asking ``vgpu`` IDs (as its limit, or only as a request), optionally a sidecar."""
    container: dict[str, Any] = {"name": name, "image": "x"}
    if vgpu is not None:
        side = "requests" if requests_only else "limits"
        container["resources"] = {side: {RESOURCE_VGPU: vgpu, "cpu": "1"}}
    if sidecar:
        container["restartPolicy"] = "Always"
    return container


@dataclass(frozen=True)
class Case:
    id: str
    containers: list[dict[str, Any]]
    expected: int | None
    init: list[dict[str, Any]] = field(default_factory=list)


CASES = [
    Case("one container, one GPU", [c("main", "1")], 1),
    Case("one container, gpu-count 2", [c("main", "2")], 2),
    Case("two GPU containers add up", [c("a", "1"), c("b", "1")], 2),
    Case("a container without the resource takes none", [c("main", "1"), c("log")], 1),
    Case("no container asks: None", [c("main"), c("log")], None),
    Case("an asked zero is zero, not None", [c("main", "0")], 0),
    Case("quantities round up like Quantity.Value()", [c("main", "1500m")], 2),
    Case("an integer in JSON counts too", [c("main", 3)], 3),
    Case("only a request: the kubelet reads limits", [c("main", "1", requests_only=True)], None),
    Case("an unreadable value is skipped", [c("main", "lots"), c("b", "1")], 1),
    Case("a boolean is not a count", [c("main", True)], None),
    Case("init smaller than the apps: apps reuse its IDs", [c("a", "2"), c("b", "1")], 3, init=[c("i", "2")]),
    Case("init larger than the apps: max(init, sum)", [c("a", "1"), c("b", "1")], 4, init=[c("i", "4")]),
    Case("two inits reuse each other's IDs", [c("a", "1")], 3, init=[c("i", "2"), c("j", "3")]),
    Case("a sidecar keeps its IDs for the pod's life", [c("a", "1")], 2, init=[c("s", "1", sidecar=True)]),
    Case(
        "a sidecar takes an earlier init's IDs away from the apps",
        [c("a", "2")],
        4,
        init=[c("i", "2"), c("s", "2", sidecar=True)],
    ),
    Case(
        "an init after a sidecar reuses only its predecessors' free IDs",
        [c("a", "1")],
        4,
        init=[c("s", "1", sidecar=True), c("i", "3")],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_ids_the_kubelet_holds_for_the_pod(case: Case) -> None:
    pod = {"spec": {"initContainers": case.init, "containers": case.containers}}
    assert vgpu_device_ids(pod) == case.expected


@pytest.mark.parametrize(
    "pod",
    [{}, {"spec": "x"}, {"spec": {"containers": "x"}}, {"spec": {"containers": ["x", {"resources": []}]}}],
    ids=["no spec", "spec not an object", "containers not a list", "odd containers"],
)
def test_a_malformed_pod_asks_for_nothing_and_never_raises(pod: dict[str, Any]) -> None:
    assert vgpu_device_ids(pod) is None


SIZES = [
    ("one GPU", [], [c("main", "1")], {1}),
    ("two GPUs", [], [c("main", "2")], {2}),
    ("two one-GPU containers: one size", [], [c("a", "1"), c("b", "1")], {1}),
    ("container-gpu-count: containers of 1 and 2 GPUs", [], [c("pre", "1"), c("inference", "2")], {1, 2}),
    ("an init container is allocated too", [c("i", "2")], [c("a", "1")], {1, 2}),
    ("a zero or no resource makes no call", [], [c("a", "0"), c("log"), c("b", "2")], {2}),
    ("quantities round up as the kubelet's count", [], [c("main", "1500m")], {2}),
]


@pytest.mark.parametrize(("init", "containers", "expected"), [s[1:] for s in SIZES], ids=[s[0] for s in SIZES])
def test_allocate_sizes_are_the_limits_of_the_containers_that_ask(
    init: list[dict[str, Any]], containers: list[dict[str, Any]], expected: set[int]
) -> None:
    assert allocate_sizes({"spec": {"initContainers": init, "containers": containers}}) == expected


def test_a_pod_that_asks_nothing_has_no_allocate_size() -> None:
    assert allocate_sizes({"spec": {"containers": [c("main")]}}) == frozenset()
    assert allocate_sizes({}) == frozenset()
