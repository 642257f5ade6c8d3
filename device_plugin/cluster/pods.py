"""The plugin's view of a pod: the few facts Allocate and the hand-off need, read from raw pod JSON.

The pod cache is fed by a watch and the lookup runs on every Allocate, so pods are reduced once,
on arrival, to a frozen :class:`PodRecord`: identity, node, phase, our two annotations, and the
containers that request ``tensor-fusion.ai/vgpu`` in the order the kubelet admits them (init
containers first, then app containers, each in spec order — see the kubelet captures), and the
runtime's ID of each running container, which names a GPU process's container in its cgroup.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from vgpu.names import RESOURCE_VGPU, SystemAnnotation

TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    node: str
    phase: str
    deleting: bool
    allocation: str | None
    handoff: str | None
    vgpu_containers: tuple[tuple[str, int], ...]  # (container, vgpu count) in kubelet admission order
    container_ids: tuple[tuple[str, str], ...] = ()  # (runtime container ID, container name), from the status

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        """Not terminal and not being deleted: a pod the kubelet may still admit or run."""
        return self.phase not in TERMINAL_PHASES and not self.deleting


def _count(container: Mapping[str, Any]) -> int:
    """The container's vgpu count: the limit, else the request (extended resources need both equal)."""
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        raw = (resources.get(section) or {}).get(RESOURCE_VGPU)
        if raw is not None:
            try:
                return int(str(raw))
            except ValueError:
                return 0
    return 0


def _container_ids(status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Each container's current ID without its runtime's scheme (``containerd://<id>`` → ``<id>``)."""
    statuses = [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
        *(status.get("ephemeralContainerStatuses") or ()),
    ]
    return tuple(
        (str(s["containerID"]).rpartition("://")[2], str(s.get("name", ""))) for s in statuses if s.get("containerID")
    )


def from_json(pod: Mapping[str, Any]) -> PodRecord:
    """Reduce a pod as the API serves it (camelCase JSON) to a record."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    status = pod.get("status") or {}
    ordered = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    return PodRecord(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        deleting=meta.get("deletionTimestamp") is not None,
        allocation=annotations.get(SystemAnnotation.ALLOCATION.value),
        handoff=annotations.get(SystemAnnotation.HANDOFF.value),
        vgpu_containers=tuple((str(c.get("name", "")), n) for c in ordered if (n := _count(c)) > 0),
        container_ids=_container_ids(status),
    )
