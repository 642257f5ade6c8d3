"""Which pod is this Allocate for, and is its allocation sound? Pure decisions over pod records.

Allocate carries only device IDs (reference/device-plugin-api.md §7), and the extender keeps at most
one pod per node and Allocate size in hand-off, so the pod is the one on this node that carries an
allocation, has no hand-off receipt, is still active, and whose next unserved container asks for
exactly this many devices. Exactly one such pod is served; none or several is an
:class:`AllocateError` that says so (we never guess). A match is not a proof:
:mod:`device_plugin.kubelet.proof` settles each answer afterwards. See docs/architecture.md,
section "The hand-off".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from device_plugin.cluster.pods import PodRecord
from vgpu import isolation
from vgpu.contract.allocation import Handoff, PodAllocation, decode, decode_handoff
from vgpu.contract.inventory import GpuInfo, Health
from vgpu.errors import DomainError
from vgpu.names import RESOURCE_VGPU, EnforcementBackend
from vgpu.quantity import humanize_bytes, humanize_tflops

RESOURCE_NOUN = f"{RESOURCE_VGPU} devices"

# Annotation texts are immutable and decode to frozen values: decode each once, not on every Allocate
# (a node reboot re-allocates every pod at once, and each lookup scans every receipt on the node).
cached_receipt = functools.lru_cache(maxsize=4096)(decode_handoff)
_allocation = functools.lru_cache(maxsize=4096)(decode)


class AllocateError(Exception):
    """Allocate must fail; the message is what ``kubectl describe pod`` will show.

    ``waitable`` marks "no pod found yet": the watch may lag the extender's bind, so the caller may
    wait for the pod cache to change before giving up."""

    def __init__(self, message: str, *, waitable: bool = False) -> None:
        super().__init__(message)
        self.waitable = waitable


@dataclass(frozen=True, slots=True)
class Match:
    pod: PodRecord
    container: str
    again: bool  # a re-allocation of a container whose hand-off is already recorded


def next_container(pod: PodRecord, served: Collection[str]) -> tuple[str, int] | None:
    """The first container, in the kubelet's admission order, not yet served (answered or confirmed)."""
    return next(((c, n) for c, n in pod.vgpu_containers if c not in served), None)


def awaiting(
    pods: Iterable[PodRecord], node: str, count: int, served: Mapping[str, Collection[str]]
) -> list[PodRecord]:
    """Pods on ``node`` in hand-off whose next container to serve wants ``count`` devices."""
    found = []
    for pod in pods:
        if pod.node != node or pod.allocation is None or pod.handoff is not None or not pod.active:
            continue
        nxt = next_container(pod, served.get(pod.uid, ()))
        if nxt is not None and nxt[1] == count:
            found.append(pod)
    return found


def recorded(pods: Iterable[PodRecord], node: str, ids: Iterable[str]) -> Match | None:
    """An active pod on ``node`` whose hand-off receipt already gave exactly ``ids`` to a container."""
    wanted = frozenset(ids)
    for pod in pods:
        if pod.node != node or pod.handoff is None or not pod.active:
            continue
        try:
            receipt: Handoff = cached_receipt(pod.handoff)
        except DomainError:
            continue
        for container, got in receipt.devices:
            if frozenset(got) == wanted and receipt.pod_uid == pod.uid:
                return Match(pod, container, again=True)
    return None


def choose(
    pods: Iterable[PodRecord], node: str, ids: tuple[str, ...], served: Mapping[str, Collection[str]]
) -> Match | AllocateError:
    """The pod this Allocate is for, or the error to return (no match, or ambiguous)."""
    pods = list(pods)
    found = awaiting(pods, node, len(ids), served)
    if len(found) == 1:
        pod = found[0]
        nxt = next_container(pod, served.get(pod.uid, ()))
        assert nxt is not None  # awaiting() only returns pods with a next container
        return Match(pod, nxt[0], again=False)
    if len(found) > 1:
        names = ", ".join(sorted(p.key for p in found))
        return AllocateError(
            f"ambiguous: {len(found)} pods on node {node} await an allocation of {len(ids)} "
            f"{RESOURCE_NOUN} ({names}); refusing to guess"
        )
    again = recorded(pods, node, ids)
    if again is not None:
        return again
    return AllocateError(
        f"no pod on node {node} awaits an allocation of {len(ids)} {RESOURCE_NOUN} "
        "(no active pod with a tensor-fusion allocation, no hand-off receipt and a container of that size)",
        waitable=True,
    )


def validate(pod: PodRecord, node: str, gpus: Mapping[str, GpuInfo], backend: EnforcementBackend) -> PodAllocation:
    """Decode the pod's allocation strictly and check it is for this pod, this node and real GPUs that serve the
    isolation mode it names (``backend``: this plugin's)."""
    where = f"pod {pod.key}"
    if pod.allocation is None:
        raise AllocateError(f"{where}: has no tensor-fusion allocation")
    try:
        alloc = _allocation(pod.allocation)
    except DomainError as exc:
        raise AllocateError(f"{where}: allocation annotation is invalid: {exc}") from None
    if alloc.pod_uid != pod.uid:
        raise AllocateError(
            f"{where}: allocation is for pod UID {alloc.pod_uid} but this pod's UID is {pod.uid} "
            "(copied or forged allocation)"
        )
    if alloc.node != node:
        raise AllocateError(f"{where}: allocation is for node {alloc.node} but this is node {node}")
    if not alloc.gpus:
        raise AllocateError(f"{where}: allocation grants no GPU")
    uuids = [g.uuid for g in alloc.gpus]
    if len(set(uuids)) != len(uuids):
        raise AllocateError(f"{where}: allocation lists a GPU twice ({', '.join(uuids)})")
    wanted = {c for c, _ in pod.vgpu_containers}
    if set(alloc.containers) != wanted:
        raise AllocateError(
            f"{where}: allocation is for containers {sorted(alloc.containers)} but the containers requesting "
            f"{RESOURCE_VGPU} are {sorted(wanted)}"
        )
    for container, count in pod.vgpu_containers:
        if count != len(alloc.gpus_of(container)):
            raise AllocateError(
                f"{where}: container {container} requests {count} {RESOURCE_VGPU} but the allocation "
                f"grants it {len(alloc.gpus_of(container))} GPU(s)"
            )
    for grant in alloc.gpus:
        gpu = gpus.get(grant.uuid)
        if gpu is None:
            raise AllocateError(f"{where}: allocation names GPU {grant.uuid}, which node {node} does not have")
        if gpu.health is not Health.HEALTHY:
            raise AllocateError(f"{where}: allocation names GPU {grant.uuid}, which is unhealthy on node {node}")
        if gpu.mig:
            raise AllocateError(
                f"{where}: allocation names GPU {grant.uuid}, which is in MIG mode on node {node}: its UUID gives a "
                "container no usable CUDA device; pods are granted its MIG instances instead"
            )
        _ordered(where, grant.uuid, "TFLOPS", humanize_tflops, grant.tflops_request, grant.tflops_limit, gpu.tflops)
        _ordered(where, grant.uuid, "vram", humanize_bytes, grant.vram_request, grant.vram_limit, gpu.vram)
        modes = isolation.served(backend, mig_unit=gpu.parent is not None)
        if alloc.isolation is not None and alloc.isolation not in modes:
            raise AllocateError(
                f"{where}: allocation asks for isolation {alloc.isolation} on GPU {grant.uuid}, which serves "
                f"{', '.join(sorted(modes))} on node {node} (its device plugin runs --backend={backend})"
            )
    return alloc


def _ordered(
    where: str, uuid: str, what: str, fmt: Callable[[int], str], request: int, limit: int, capacity: int
) -> None:
    if request > limit:
        raise AllocateError(f"{where}: GPU {uuid}: {what} request {fmt(request)} exceeds its limit {fmt(limit)}")
    if limit > capacity:
        raise AllocateError(
            f"{where}: GPU {uuid}: {what} limit {fmt(limit)} exceeds the GPU's capacity {fmt(capacity)}"
        )
