"""Which pod and container a GPU process belongs to: the seam between the driver's PIDs and the node's pods.

NVML names a GPU's processes by host PID only. On a node, the PID's cgroup path names its pod
(``pod<uid>``, with dashes under the cgroupfs driver and underscores under systemd's) and, in the next
component, its container: the runtime's container ID, bare (cgroupfs) or as a systemd scope
(``cri-containerd-<id>.scope``, ``crio-<id>.scope``, ``docker-<id>.scope``); the pod's
``status.containerStatuses`` then turn that ID into the container's name (:mod:`device_plugin.usage.usage`).
The fake GPU file's scripted processes have synthetic PIDs, so :class:`~device_plugin.gpus.fake_probe.FakeProbe`
answers for them behind the same :class:`ProcessResolver`. Reading ``/proc`` is the only I/O here;
parsing a cgroup file is a pure function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"(?:^|-)([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessOwner:
    """Who a GPU process belongs to, as far as the process itself tells."""

    pod: str  # the pod's UID; a scripted (fake) process may name the pod instead: ``namespace/name`` or ``name``
    container_id: str = ""  # the runtime's container ID, from the cgroup path
    container: str = ""  # the container's name, where the resolver knows it (the fake GPU file's script)


class ProcessResolver(Protocol):
    def owner(self, pid: int) -> ProcessOwner | None:
        """The pod (and container) of process ``pid``; None when it has exited or is in no pod. May block."""
        ...


def owner_from_cgroup(text: str) -> ProcessOwner | None:
    """The pod UID and container ID in a ``/proc/<pid>/cgroup`` file (v1: one line per hierarchy, v2: one
    line); None when no line names a pod. The container ID is empty when the path stops at the pod."""
    for line in text.splitlines():
        parts = line.split(":", 2)[-1].split("/")
        for i, part in enumerate(parts):
            pod = _POD_UID.search(part)
            if pod is not None:
                container = _CONTAINER_ID.search(parts[i + 1]) if i + 1 < len(parts) else None
                return ProcessOwner(pod=pod[1].replace("_", "-"), container_id=container[1] if container else "")
    return None


class ProcResolver:
    """A :class:`ProcessResolver` over ``/proc`` (the host's: the plugin runs with ``hostPID``)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = str(proc)

    def owner(self, pid: int) -> ProcessOwner | None:
        try:  # once per process per pass: a plain open, without pathlib objects (benchmarks/usage_sampling.py)
            with open(f"{self._proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as cgroup:
                text = cgroup.read()
        except OSError:  # exited between the driver's list and this read
            return None
        return owner_from_cgroup(text)
