"""How many ``tensor-fusion.ai/vgpu`` device IDs the kubelet holds for a pod, counted by its own rule.

The kubelet admits a pod only while the node has that many healthy IDs free (it ignores which GPU
an ID is named after) and holds them until the pod is gone, so the extender, which binds pods, must
count each pod exactly as the kubelet will, or a pod it binds fails admission for good. The rule is
the kubelet device manager's (pkg/kubelet/cm/devicemanager, ``ManagerImpl.Allocate``): each
container takes its *limit* (quantities rounded up), init containers first and in order; the IDs
of a finished (ordinary) init container may be reused by the containers after it, while a sidecar
(an init container with ``restartPolicy: Always``) and every app container keep theirs. Without
sidecars that is max(largest init container, sum of the app containers). Pure: reads raw pod JSON.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from math import ceil
from typing import Any

from vgpu.errors import DomainError
from vgpu.names import RESOURCE_VGPU
from vgpu.quantity import parse

_SIDECAR = "Always"


def vgpu_device_ids(pod: Mapping[str, Any]) -> int | None:
    """The IDs the pod's spec makes the kubelet hold in all; None when no container asks for any."""
    asked = False
    held = reusable = 0
    for runs_to_completion, count in _asking(pod):
        asked = True
        reused = min(count, reusable)
        held += count - reused
        if runs_to_completion:
            reusable += count - reused  # it runs to completion: all its IDs are free for the next ones
        else:
            reusable -= reused
    return held if asked else None


def allocate_sizes(pod: Mapping[str, Any]) -> frozenset[int]:
    """How many device IDs the kubelet's Allocate calls for this pod can carry: one call per container with
    a vGPU limit (init containers included), each carrying that limit's count of IDs. The device plugin
    matches an Allocate to a pod by that count (device_plugin/kubelet/lookup.py), so pods whose sizes are disjoint
    can be in hand-off on one node at once (HANDOFF.md)."""
    return frozenset(count for _, count in _asking(pod) if count)


def _asking(pod: Mapping[str, Any]) -> Iterator[tuple[bool, int]]:
    """Each container with a readable vGPU limit, in the kubelet's order (init containers first): whether
    it runs to completion (an ordinary init container, not a sidecar) and its limit."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return
    for field in ("initContainers", "containers"):
        containers = spec.get(field)
        for container in containers if isinstance(containers, list) else ():
            count = _limit(container)
            if count is not None:
                yield field == "initContainers" and container.get("restartPolicy") != _SIDECAR, count


def _limit(container: object) -> int | None:
    """The container's vGPU limit (what the kubelet reads), None when it has none or it is unreadable."""
    if not isinstance(container, Mapping):
        return None
    resources = container.get("resources")
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    value = limits.get(RESOURCE_VGPU) if isinstance(limits, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    try:
        return ceil(parse(str(value), key=RESOURCE_VGPU))
    except DomainError:
        return None  # the API server never stores such a value; a hand-made request may carry one
