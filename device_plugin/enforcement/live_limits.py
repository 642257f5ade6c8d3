"""Live limits, the pure part: what each container's limits are now, and what to rewrite for them.

The autoscaler changes a running pod's limits in place by patching its allocation annotation; the
container's environment was fixed at its start, so the plugin keeps, per container, a small document
of the current limits (``limits.json``) and, under HAMi-core, rewrites the memory and SM limits in the
shared region the container's processes map (:mod:`device_plugin.enforcement.hami_region`). This module decides,
without I/O: the limits a pod's allocation gives each of its containers, the document for them, which
region slots differ from them, and which pod directories are left over. :mod:`device_plugin.enforcement.live_files`
does the reading and writing. Every decision is level-triggered (desired against what is there), so a
missed event, a plugin restart or a region initialised late from stale environment variables is
corrected by the next pass.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from device_plugin.cluster.pods import TERMINAL_PHASES, PodRecord
from device_plugin.enforcement.envs import granted_percents, hami_mib
from vgpu.contract.allocation import PodAllocation, decode
from vgpu.errors import DomainError
from vgpu.quantity import MIB, humanize_tflops

DOCUMENT_VERSION: Final = "v1"


@dataclass(frozen=True, slots=True)
class GpuLimit:
    """One GPU's limits for a container, in the units every backend derives its own from."""

    uuid: str
    milli_tflops: int
    sm_percent: int
    vram_bytes: int


@dataclass(frozen=True, slots=True)
class Wanted:
    """What a container's live limits should be now, with the pod's name for the document."""

    namespace: str
    pod: str
    gpus: tuple[GpuLimit, ...]  # in the container's device order (HAMi-core's index i)


@dataclass(frozen=True, slots=True)
class SlotWrite:
    """One 8-byte value of HAMi-core's region: ``limit[index]`` (bytes) or ``sm_limit[index]`` (percent)."""

    field: str  # "limit" | "sm_limit"
    index: int
    value: int


ContainerKey = tuple[str, str]  # (pod UID, container name)


def limits_of(alloc: PodAllocation, container: str) -> tuple[GpuLimit, ...]:
    """The GPUs ``container`` holds (every GPU of the grant, unless the pod split them per container), with the
    grant's limits."""
    percent = granted_percents(alloc)
    return tuple(GpuLimit(g.uuid, g.tflops_limit, percent[g.uuid], g.vram_limit) for g in alloc.gpus_of(container))


def wanted(pods: Iterable[PodRecord], node: str) -> dict[ContainerKey, Wanted]:
    """The live limits of every container of the running pods whose allocation is for this node.

    A pod being deleted or finished keeps what it had (nothing is rewritten for it); an allocation that
    does not decode, or names another pod or node, gives nothing (Allocate refused such a pod)."""
    out: dict[ContainerKey, Wanted] = {}
    for pod in pods:
        if not pod.active or pod.node != node or pod.allocation is None:
            continue
        try:
            alloc = decode(pod.allocation)
        except DomainError:
            continue
        if alloc.pod_uid != pod.uid or alloc.node != node:
            continue
        for container in alloc.containers:
            out[(pod.uid, container)] = Wanted(pod.namespace, pod.name, limits_of(alloc, container))
    return out


def resident(pods: Iterable[PodRecord]) -> frozenset[str]:
    """UIDs of pods whose containers may still run here: not finished (a pod being deleted still runs)."""
    return frozenset(p.uid for p in pods if p.phase not in TERMINAL_PHASES)


def document(key: ContainerKey, want: Wanted, *, backend: str, generation: int, updated_at: str) -> str:
    """``limits.json``: the container's current limits per GPU UUID (docs/live-limits.md)."""
    uid, container = key
    body = {
        "version": DOCUMENT_VERSION,
        "pod": {"namespace": want.namespace, "name": want.pod, "uid": uid},
        "container": container,
        "backend": backend,
        "generation": generation,
        "updatedAt": updated_at,
        "gpus": {
            g.uuid: {
                "index": i,
                "tflopsLimit": humanize_tflops(g.milli_tflops),
                "milliTflopsLimit": g.milli_tflops,
                "smPercent": g.sm_percent,
                "vramLimitBytes": g.vram_bytes,
            }
            for i, g in enumerate(want.gpus)
        },
    }
    return json.dumps(body, indent=2) + "\n"


@dataclass(frozen=True, slots=True)
class Recorded:
    """What a ``limits.json`` of ours records."""

    gpus: tuple[GpuLimit, ...]
    generation: int
    updated_at: str


def recorded(text: str) -> Recorded | None:
    """The limits, generation and time a ``limits.json`` records; None when it is not one of ours."""
    try:
        body: Any = json.loads(text)
        if body.get("version") != DOCUMENT_VERSION:
            return None
        entries = sorted(body["gpus"].items(), key=lambda item: int(item[1]["index"]))
        gpus = tuple(
            GpuLimit(str(uuid), int(e["milliTflopsLimit"]), int(e["smPercent"]), int(e["vramLimitBytes"]))
            for uuid, e in entries
        )
        return Recorded(gpus, int(body["generation"]), str(body["updatedAt"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def parse_document(text: str) -> tuple[tuple[GpuLimit, ...], int] | None:
    """The limits and generation a ``limits.json`` records; None when it is not one of ours."""
    found = recorded(text)
    return None if found is None else (found.gpus, found.generation)


@dataclass(frozen=True, slots=True)
class Tamper:
    """A container's live-limits file found in a state the plugin did not leave it in (docs/security.md,
    "Tampering with live limits"): ``restored`` when the plugin put back what it keeps, False when it could not
    (HAMi-core's region truncated, removed or replaced: the plugin then resets it to an empty file)."""

    namespace: str
    pod: str
    uid: str
    container: str
    target: str  # the file's name: limits.json | hami.cache
    kind: str  # a short code, one per vector (events are posted once per container and kind)
    detail: str  # what was found, for people
    restored: bool

    def message(self) -> str:
        pod = f"pod {self.namespace}/{self.pod} (uid {self.uid})"
        what = f"container {self.container} of {pod}: {self.target} {self.detail}"
        if self.restored:
            return f"{what}; the device plugin restored the live limits it keeps"
        return (
            f"{what}; it cannot be restored, so the device plugin made it an empty regular file, which HAMi-core "
            "initialises again from the container's environment at the container's next CUDA process, and the "
            "plugin then writes the current limits into it"
        )


def region_values(gpus: Sequence[GpuLimit]) -> tuple[tuple[int, int], ...]:
    """(``limit[i]``, ``sm_limit[i]``) as HAMi-core itself derives them from our environment variables:
    ``CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`` read as MiB × 2^20 bytes, ``CUDA_DEVICE_SM_LIMIT_<i>`` as is."""
    return tuple((hami_mib(g.vram_bytes) * MIB, g.sm_percent) for g in gpus)


def region_writes(want: Sequence[tuple[int, int]], have: Sequence[tuple[int, int]]) -> tuple[SlotWrite, ...]:
    """The slots of the container's devices whose value differs from the wanted one."""
    writes: list[SlotWrite] = []
    for i, ((limit, sm), (had_limit, had_sm)) in enumerate(zip(want, have, strict=True)):
        if limit != had_limit:
            writes.append(SlotWrite("limit", i, limit))
        if sm != had_sm:
            writes.append(SlotWrite("sm_limit", i, sm))
    return tuple(writes)


def leftover(dirs: Mapping[str, float], resident_uids: frozenset[str], *, now: float, grace_s: float) -> list[str]:
    """Pod directories (UID → last modified, seconds) to remove: no such pod runs here, and the directory
    is older than ``grace_s`` (one Allocate just made for a pod the watch has not shown yet is kept)."""
    return sorted(uid for uid, mtime in dirs.items() if uid not in resident_uids and now - mtime >= grace_s)
