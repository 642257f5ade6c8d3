"""Virtual slices: how one physical GPU becomes N kubelet device IDs, and back.

The kubelet only counts opaque IDs, so each healthy GPU is advertised as ``slices_per_gpu`` IDs
``<uuid>::<n>`` (NVIDIA's replica spelling), each carrying the GPU's NUMA node for the Topology
Manager. Slices cap how many containers share a GPU; which GPU a pod really uses is decided by the
extender and recorded in its allocation, so the GPU encoded in an ID is a hint, never authority.
IDs are at most 63 characters, as the device plugin API requires.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from vgpu.contract.inventory import GpuInfo, Health

SEPARATOR: Final = "::"
MAX_ID_LENGTH: Final = 63


class SliceIdError(ValueError):
    """A device ID that is not one of ours, or a GPU whose UUID cannot be encoded."""


@dataclass(frozen=True, slots=True)
class Slice:
    id: str
    uuid: str
    healthy: bool
    numa: int | None


def slice_id(uuid: str, n: int) -> str:
    device_id = f"{uuid}{SEPARATOR}{n}"
    if len(device_id) > MAX_ID_LENGTH:
        raise SliceIdError(f"device ID {device_id!r} is longer than {MAX_ID_LENGTH} characters")
    return device_id


def gpu_of(device_id: str) -> str:
    """The GPU UUID a slice ID encodes."""
    uuid, sep, n = device_id.rpartition(SEPARATOR)
    if not sep or not uuid or not n.isdigit():
        raise SliceIdError(f"device ID {device_id!r} is not <gpu-uuid>{SEPARATOR}<n>")
    return uuid


def slices(gpus: Iterable[GpuInfo], per_gpu: int) -> tuple[Slice, ...]:
    """Every slice of every GPU, in GPU index then slice order; an unhealthy GPU's slices are unhealthy.
    A GPU in MIG mode has none: its MIG instances have theirs."""
    return tuple(
        Slice(slice_id(g.uuid, n), g.uuid, g.health is Health.HEALTHY, g.numa)
        for g in sorted(gpus, key=lambda g: g.index)
        if not g.mig
        for n in range(per_gpu)
    )


def preferred(
    available: Sequence[str], must_include: Sequence[str], size: int, favour: Sequence[str] = ()
) -> list[str]:
    """A hint for kubelet's choice: the must-include IDs, then slices of the ``favour`` GPUs (the
    pending pod's granted GPUs, in order), then slices of the GPUs with the most free slices, so the
    kubelet's accounting tracks the extender's placement and GPUs fill one at a time."""
    chosen = list(dict.fromkeys(must_include))[:size]
    rest = [d for d in available if d not in chosen]
    free_by_gpu: dict[str, int] = {}
    for d in rest:
        free_by_gpu[_gpu_or_self(d)] = free_by_gpu.get(_gpu_or_self(d), 0) + 1
    favoured = {uuid: rank for rank, uuid in enumerate(favour)}
    wanted = dict.fromkeys(_gpu_or_self(d) for d in chosen)
    for uuid in favour:  # one slice of each granted GPU first, so a multi-GPU pod spans its GPUs
        if len(chosen) < size and uuid not in wanted:
            pick = next((d for d in rest if _gpu_or_self(d) == uuid and d not in chosen), None)
            if pick is not None:
                chosen.append(pick)
                wanted[uuid] = None
    ordered = sorted(
        rest,
        key=lambda d: (favoured.get(_gpu_or_self(d), len(favoured)), -free_by_gpu[_gpu_or_self(d)], _gpu_or_self(d), d),
    )
    chosen += [d for d in ordered if d not in chosen][: max(0, size - len(chosen))]
    return chosen


def _gpu_or_self(device_id: str) -> str:
    try:
        return gpu_of(device_id)
    except SliceIdError:
        return device_id
