"""Pod allocation and its hand-off: which GPUs the extender granted a pod, and the node's receipt.

The extender grants :class:`PodAllocation` at bind (annotation ``allocation``), carried by the Binding
itself, so that it lands in the same write as ``spec.nodeName`` (pods bound before that got it by a patch
first; both read the same). Every container gets every granted GPU, unless the pod asked for GPUs per
container (``container-gpu-count``): then ``containerGpus`` says which GPUs each one gets, disjoint. The
device plugin reads it at Allocate, checks it belongs to this pod and node, and, once every container got
its devices, writes :class:`Handoff` (annotation ``handoff``) with
the device IDs the kubelet chose, which releases the extender's per-node hand-off gate.
Only the extender may write the allocation; only the device plugin the hand-off (deploy/ policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from vgpu.contract.strict import Reader, dump, load
from vgpu.errors import DomainError
from vgpu.names import IsolationMode, Qos, SystemAnnotation
from vgpu.quantity import format_bytes, format_milli, humanize_bytes, humanize_tflops, parse_bytes, parse_milli

VERSION: Final = "v1"
KEY: Final = SystemAnnotation.ALLOCATION.value
HANDOFF_KEY: Final = SystemAnnotation.HANDOFF.value


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuGrant:
    """What one GPU gives this pod. TFLOPS in milli, VRAM in bytes; ``gpu_tflops`` is its capacity."""

    uuid: str
    index: int
    tflops_request: int
    tflops_limit: int
    vram_request: int
    vram_limit: int
    gpu_tflops: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PodAllocation:
    pod_uid: str
    node: str
    pool: str
    qos: Qos
    containers: tuple[str, ...]
    gpus: tuple[GpuGrant, ...]
    bound_at: str  # RFC 3339, the extender's clock
    # The mode the pod named (docs/isolation.md); None: it named none, and the node's own mode holds. Written
    # only when set, so allocations read as before for every plugin version where it is not.
    isolation: IsolationMode | None = None
    # Which GPUs (UUIDs) each container gets, in ``containers`` order, when the pod asked for GPUs per container:
    # disjoint, together every GPU. None: every container gets every GPU (and allocations read as before).
    container_gpus: tuple[tuple[str, tuple[str, ...]], ...] | None = None

    def gpus_of(self, container: str) -> tuple[GpuGrant, ...]:
        """The grants ``container`` gets: its own share of the GPUs, or all of them when the pod splits none."""
        if self.container_gpus is None:
            return self.gpus
        by_uuid = {g.uuid: g for g in self.gpus}
        return tuple(by_uuid[u] for c, uuids in self.container_gpus if c == container for u in uuids)

    def describe(self) -> str:
        """One line for the pod's GpuGranted event: each GPU's reserved share and limits, the node, the pool."""
        shares = "; ".join(
            f"{g.uuid} (index {g.index}): {humanize_tflops(g.tflops_request)} TFLOPS / "
            f"{humanize_bytes(g.vram_request)} reserved, limits {humanize_tflops(g.tflops_limit)} / "
            f"{humanize_bytes(g.vram_limit)}"
            for g in self.gpus
        )
        mode = f", isolation {self.isolation.value}" if self.isolation else ""
        split = "; ".join(f"{c}: {', '.join(uuids)}" for c, uuids in self.container_gpus or ())
        split = f"; GPUs per container: {split}" if split else ""
        return f"granted on node {self.node} (pool {self.pool}, qos {self.qos.value}{mode}): {shares}{split}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Handoff:
    """The device plugin's receipt: which device IDs each container got from the kubelet."""

    pod_uid: str
    node: str
    devices: tuple[tuple[str, tuple[str, ...]], ...]  # (container, device IDs) in allocation order
    at: str


def encode(alloc: PodAllocation) -> str:
    return dump(
        {
            "version": VERSION,
            "podUID": alloc.pod_uid,
            "node": alloc.node,
            "pool": alloc.pool,
            "qos": alloc.qos.value,
            "containers": list(alloc.containers),
            "boundAt": alloc.bound_at,
            **({"isolation": alloc.isolation.value} if alloc.isolation else {}),
            "gpus": [grant_fields(g) for g in alloc.gpus],
            **(
                {"containerGpus": [{"container": c, "uuids": list(u)} for c, u in alloc.container_gpus]}
                if alloc.container_gpus is not None
                else {}
            ),
        }
    )


def grant_fields(g: GpuGrant) -> dict[str, object]:
    """One grant as the contracts write it (the allocation, the node claims)."""
    return {
        "uuid": g.uuid,
        "index": g.index,
        "tflopsRequest": format_milli(g.tflops_request),
        "tflopsLimit": format_milli(g.tflops_limit),
        "vramRequest": format_bytes(g.vram_request),
        "vramLimit": format_bytes(g.vram_limit),
        "gpuTflops": format_milli(g.gpu_tflops),
    }


def decode(text: str) -> PodAllocation:
    r = load(text, KEY, (VERSION,))
    mode = r.added_choice("isolation", tuple(IsolationMode))
    alloc = PodAllocation(
        pod_uid=r.text("podUID"),
        node=r.text("node"),
        pool=r.text("pool"),
        qos=Qos(r.choice("qos", tuple(Qos))),
        containers=r.strings("containers"),
        gpus=r.items("gpus", read_grant),
        bound_at=r.text("boundAt"),
        isolation=None if mode is None else IsolationMode(mode),
        container_gpus=r.added_items("containerGpus", _container_gpus),
    )
    r.done()
    _check_split(alloc)
    return alloc


def _container_gpus(r: Reader) -> tuple[str, tuple[str, ...]]:
    entry = (r.text("container"), r.strings("uuids"))
    r.done()
    return entry


def _check_split(alloc: PodAllocation) -> None:
    """A split names the allocation's containers in order and gives each GPU to exactly one of them."""
    if alloc.container_gpus is None:
        return
    where = f"{KEY}.containerGpus"
    named = tuple(c for c, _ in alloc.container_gpus)
    if named != alloc.containers:
        raise DomainError.one(
            where, ", ".join(named), f"must name the containers {', '.join(alloc.containers)}, in order"
        )
    given = [u for _, uuids in alloc.container_gpus for u in uuids]
    if sorted(given) != sorted(g.uuid for g in alloc.gpus) or any(not uuids for _, uuids in alloc.container_gpus):
        raise DomainError.one(
            where, ", ".join(given), "must give each granted GPU to exactly one container, and each container a GPU"
        )


def read_grant(r: Reader) -> GpuGrant:
    grant = GpuGrant(
        uuid=r.text("uuid"),
        index=r.integer("index"),
        tflops_request=r.quantity("tflopsRequest", parse_milli),
        tflops_limit=r.quantity("tflopsLimit", parse_milli),
        vram_request=r.quantity("vramRequest", parse_bytes),
        vram_limit=r.quantity("vramLimit", parse_bytes),
        gpu_tflops=r.quantity("gpuTflops", parse_milli),
    )
    r.done()
    return grant


def encode_handoff(h: Handoff) -> str:
    return dump(
        {
            "version": VERSION,
            "podUID": h.pod_uid,
            "node": h.node,
            "at": h.at,
            "devices": [{"container": c, "ids": list(ids)} for c, ids in h.devices],
        }
    )


def decode_handoff(text: str) -> Handoff:
    r = load(text, HANDOFF_KEY, (VERSION,))
    h = Handoff(pod_uid=r.text("podUID"), node=r.text("node"), at=r.text("at"), devices=r.items("devices", _devices))
    r.done()
    return h


def _devices(r: Reader) -> tuple[str, tuple[str, ...]]:
    entry = (r.text("container"), r.strings("ids"))
    r.done()
    return entry
