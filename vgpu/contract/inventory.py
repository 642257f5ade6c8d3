"""Node inventory: the GPUs a device plugin found, written as an annotation on its Node.

The extender's cluster cache reads this to know each GPU's UUID, model, TFLOPS, VRAM, health and
NUMA node. Only the device plugin's service account may write it (deploy/ admission policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from vgpu.contract.strict import Reader, dump, load
from vgpu.names import EnforcementBackend, SystemAnnotation
from vgpu.quantity import format_bytes, format_milli, parse_bytes, parse_milli

VERSION: Final = "v1"
KEY: Final = SystemAnnotation.NODE_INVENTORY.value


class Health(StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    """One physical GPU, or one MIG instance of a GPU in MIG mode (``parent``: that GPU's UUID; its
    ``model`` is the unit's product name, vgpu.mig). TFLOPS in milli, VRAM in bytes.

    A GPU in MIG mode (``mig``) is published but never scheduled: its units are.
    """

    uuid: str
    index: int
    model: str
    tflops: int
    vram: int
    health: Health = Health.HEALTHY
    numa: int | None = None
    mig: bool = False
    parent: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInventory:
    node: str
    pool: str
    gpus: tuple[GpuInfo, ...]
    slices_per_gpu: int
    backend: EnforcementBackend
    heartbeat: str  # RFC 3339, written by the plugin's clock


def encode(inv: NodeInventory) -> str:
    return dump(
        {
            "version": VERSION,
            "node": inv.node,
            "pool": inv.pool,
            "slicesPerGpu": inv.slices_per_gpu,
            "backend": inv.backend.value,
            "heartbeat": inv.heartbeat,
            "gpus": [
                {
                    "uuid": g.uuid,
                    "index": g.index,
                    "model": g.model,
                    "tflops": format_milli(g.tflops),
                    "vram": format_bytes(g.vram),
                    "health": g.health.value,
                    "numa": g.numa,
                    "mig": g.mig,
                    # Only on MIG units: inventories without them read as before this field existed.
                    **({"parent": g.parent} if g.parent is not None else {}),
                }
                for g in inv.gpus
            ],
        }
    )


def decode(text: str) -> NodeInventory:
    r = load(text, KEY, (VERSION,))
    inv = NodeInventory(
        node=r.text("node"),
        pool=r.text("pool"),
        slices_per_gpu=r.integer("slicesPerGpu", 1),
        backend=EnforcementBackend(r.choice("backend", tuple(EnforcementBackend))),
        heartbeat=r.text("heartbeat"),
        gpus=r.items("gpus", _gpu),
    )
    r.done()
    return inv


def _gpu(r: Reader) -> GpuInfo:
    gpu = GpuInfo(
        uuid=r.text("uuid"),
        index=r.integer("index"),
        model=r.text("model"),
        tflops=r.quantity("tflops", parse_milli),
        vram=r.quantity("vram", parse_bytes),
        health=Health(r.choice("health", tuple(Health))),
        numa=r.opt_integer("numa"),
        mig=r.flag("mig"),
        parent=r.added_text("parent"),
    )
    r.done()
    return gpu
