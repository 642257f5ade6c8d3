"""Per-container GPU usage from one sampling pass: processes to containers to grants, as plain data.

The sampler (:mod:`device_plugin.usage.sampler`) gathers, off the event loop, what the driver says each GPU's
processes use and whom each process belongs to; this module joins that with the node's pods into the
``/usage`` document (:mod:`vgpu.contract.usage`) without any I/O, so every rule is table-tested:

* a container's TFLOPS used is its processes' SM share of the GPU times the GPU's catalog TFLOPS (a MIG
  instance has TFLOPS of its own), its VRAM used what its processes hold;
* its request and limit are its pod's grant on that GPU: every GPU container of a pod is given the pod's
  whole grant at Allocate, so each is measured against it;
* a process whose pod, container or grant cannot be found is counted under the GPU's ``unattributed``,
  with the reason, never dropped;
* on a GPU shared through NVIDIA's MPS the driver counts every client's work to the MPS server process, so
  no container's SM share is known: its TFLOPS are unmeasured (:func:`sm_unknown`), never 0 or the server's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache

from device_plugin.cluster.pods import PodRecord
from device_plugin.gpus.probe import ProcessReport
from device_plugin.usage.process_owner import ProcessOwner
from vgpu.contract.allocation import GpuGrant, PodAllocation, decode
from vgpu.contract.inventory import GpuInfo
from vgpu.contract.usage import ContainerUsage, NodeUsage, Unattributed
from vgpu.errors import DomainError


class Skip(StrEnum):
    """Why a GPU, or a process on one, was not attributed to a container (a metric label)."""

    GPU_ERROR = "gpu_error"  # the GPU's driver calls failed: nothing of it was sampled
    NO_POD = "no_pod"  # the process exited before it was mapped, or is in no pod's cgroup
    POD_UNKNOWN = "pod_unknown"  # no pod of that UID on the node (deleted mid-sample, not yet watched)
    CONTAINER_UNKNOWN = "container_unknown"  # no container of the pod has that container ID
    NO_GRANT = "no_grant"  # the container holds no grant of this GPU (not ours, or no allocation)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProcesses:
    """One GPU and what its processes used in this pass."""

    gpu: GpuInfo
    report: ProcessReport


@dataclass(frozen=True, slots=True, kw_only=True)
class Holder:
    """One attributed process's hold on a GPU: what the VRAM guard may stop
    (:mod:`device_plugin.enforcement.vram_guard`)."""

    pid: int
    owner: ProcessOwner  # as the pass found it: a signal goes only to a process that still has this owner
    memory: int  # bytes, the driver's count


HolderKey = tuple[str, str, str]  # (pod UID, container, GPU UUID): one row of the usage document


@dataclass(frozen=True, slots=True, kw_only=True)
class Attribution:
    """A pass's document; each row's processes (``holders``); each process it could not attribute: (GPU UUID,
    PID, why)."""

    usage: NodeUsage
    skipped: tuple[tuple[str, int, Skip], ...]
    holders: Mapping[HolderKey, tuple[Holder, ...]]


def sm_unknown(report: ProcessReport) -> ProcessReport:
    """``report`` with its SM shares unmeasured (the contract's ``tflopsMeasured`` false, 0 by convention),
    its memory kept: for a GPU whose per-process shares are not the processes' own (MPS)."""
    return replace(report, processes=tuple(replace(p, sm_percent=0) for p in report.processes), sm_supported=False)


@lru_cache(maxsize=4096)
def grant_of(annotation: str) -> PodAllocation | None:
    """A pod's allocation annotation, decoded (each text once); None when it does not decode."""
    try:
        return decode(annotation)
    except DomainError:
        return None


def allocated(pods: Iterable[PodRecord]) -> dict[str, tuple[int, int]]:
    """Per GPU UUID, the (milli-TFLOPS, VRAM bytes) requested by the grants of the pods still running."""
    totals: dict[str, tuple[int, int]] = {}
    for pod in pods:
        alloc = grant_of(pod.allocation) if pod.active and pod.allocation else None
        for g in alloc.gpus if alloc is not None else ():
            tflops, vram = totals.get(g.uuid, (0, 0))
            totals[g.uuid] = (tflops + g.tflops_request, vram + g.vram_request)
    return totals


class _Pods:
    """The node's pods by UID, and by ``namespace/name`` or a name only one of them has (a fake's script)."""

    def __init__(self, pods: Iterable[PodRecord]) -> None:
        self._by_uid = {p.uid: p for p in pods}
        self._by_key = {p.key: p for p in self._by_uid.values()}
        names: dict[str, list[PodRecord]] = {}
        for p in self._by_uid.values():
            names.setdefault(p.name, []).append(p)
        self._by_name = {name: found[0] for name, found in names.items() if len(found) == 1}

    def find(self, ref: str) -> PodRecord | None:
        return self._by_uid.get(ref) or self._by_key.get(ref) or self._by_name.get(ref)


def _attribute(
    owner: ProcessOwner | None, pods: _Pods, gpu: str
) -> tuple[PodRecord, str, GpuGrant, ProcessOwner] | Skip:
    """The pod, container, grant and owner of a process on GPU ``gpu``, or why there are none."""
    if owner is None:
        return Skip.NO_POD
    pod = pods.find(owner.pod)
    if pod is None:
        return Skip.POD_UNKNOWN
    container = owner.container or dict(pod.container_ids).get(owner.container_id, "")
    if not container:
        return Skip.CONTAINER_UNKNOWN
    alloc = grant_of(pod.allocation) if pod.allocation else None
    grants = alloc.gpus_of(container) if alloc and container in alloc.containers else ()
    grant = next((g for g in grants if g.uuid == gpu), None)
    return Skip.NO_GRANT if grant is None else (pod, container, grant, owner)


def node_usage(
    *,
    node: str,
    sampled_at: str,
    interval_s: float,
    gpus: Sequence[GpuProcesses],
    owners: Mapping[int, ProcessOwner | None],
    pods: Iterable[PodRecord],
) -> Attribution:
    """The ``/usage`` document for one pass: ``owners`` maps each PID listed in ``gpus`` to its owner."""
    index = _Pods(pods)
    used: dict[HolderKey, tuple[PodRecord, GpuGrant, int, int]] = {}  # (uid, container, gpu) → sums
    holders: dict[HolderKey, list[Holder]] = {}
    lost: dict[str, tuple[int, int, int]] = {}  # gpu → (processes, SM percent, memory)
    skipped: list[tuple[str, int, Skip]] = []
    tflops = {g.gpu.uuid: g.gpu.tflops for g in gpus}
    measured = {g.gpu.uuid: g.report.sm_supported for g in gpus}
    for entry in gpus:
        uuid = entry.gpu.uuid
        for proc in entry.report.processes:
            found = _attribute(owners.get(proc.pid), index, uuid)
            if isinstance(found, Skip):
                skipped.append((uuid, proc.pid, found))
                count, sm, memory = lost.get(uuid, (0, 0, 0))
                lost[uuid] = (count + 1, sm + proc.sm_percent, memory + proc.memory_used)
                continue
            pod, container, grant, owner = found
            key = (pod.uid, container, uuid)
            _, _, sm, memory = used.get(key, (pod, grant, 0, 0))
            used[key] = (pod, grant, sm + proc.sm_percent, memory + proc.memory_used)
            holders.setdefault(key, []).append(Holder(pid=proc.pid, owner=owner, memory=proc.memory_used))
    containers = (
        ContainerUsage(
            namespace=pod.namespace,
            pod=pod.name,
            pod_uid=pod.uid,
            container=container,
            gpu=uuid,
            tflops_used=tflops[uuid] * sm // 100,
            vram_used=memory,
            tflops_measured=measured[uuid],
            tflops_request=grant.tflops_request,
            tflops_limit=grant.tflops_limit,
            vram_request=grant.vram_request,
            vram_limit=grant.vram_limit,
        )
        for (_, container, uuid), (pod, grant, sm, memory) in used.items()
    )
    usage = NodeUsage(
        node=node,
        sampled_at=sampled_at,
        interval_s=interval_s,
        containers=tuple(sorted(containers, key=lambda c: (c.namespace, c.pod, c.container, c.gpu))),
        unattributed=tuple(
            Unattributed(
                gpu=uuid,
                processes=count,
                tflops_used=tflops[uuid] * sm // 100,
                vram_used=memory,
                tflops_measured=measured[uuid],
            )
            for uuid, (count, sm, memory) in sorted(lost.items())
        ),
    )
    return Attribution(
        usage=usage, skipped=tuple(skipped), holders={key: tuple(found) for key, found in holders.items()}
    )
