"""The status of each GPUPool: its nodes and GPUs, their capacity, what pods hold there, and Ready.

Pools are a name on nodes, and only the extender's cache has every node's GPU inventory and every
pod's allocation, so only it can say what a pool offers right now. A node's pool is the one the cache
places it by; CPU-only nodes are in no pool. The status counts nodes, GPUs and healthy GPUs, the
healthy GPUs' capacity and what pods reserve there, how many healthy GPUs serve each isolation mode
(docs/isolation.md), each GPU product's TFLOPS (what admission charges a compute-percent pod against),
and one condition, ``Ready``. The fields and rules: deploy/README.md, section "Workload and pool status".

Pure; ``status.py`` lists the pools, compares and patches (the leader only).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_extender.objects import PodRecord
from scheduler_extender.status import NOTHING, READY, Condition, ObjectRef, Status, StatusOf, reserved_by
from vgpu import compute_percent
from vgpu.names import LABEL_NODE_POOL, IsolationMode
from vgpu.quantity import format_bytes, format_milli
from vgpu.scheduling.model import NodeState


@dataclass(frozen=True, slots=True)
class PoolTotals:
    """A pool's GPU nodes, their GPUs, the healthy ones, and the healthy ones' TFLOPS (milli) and VRAM (bytes)."""

    nodes: int = 0
    gpus: int = 0
    healthy_gpus: int = 0
    tflops_milli: int = 0
    vram_bytes: int = 0
    modes: tuple[tuple[str, int], ...] = ()  # (isolation mode, healthy GPUs serving it), by mode
    # (product, its largest TFLOPS in milli) of the healthy GPUs, by product: what the webhook charges a
    # compute-percent pod against (vgpu.compute_percent.charge_base)
    sizes: tuple[tuple[str, int], ...] = ()


EMPTY_POOL = PoolTotals()


def is_gpu_node(node: NodeState) -> bool:
    """Whether the node is in a pool at all: it has a GPU inventory, or the pool label."""
    return bool(node.gpus) or node.inventory_error is not None or LABEL_NODE_POOL in node.labels


@dataclass(slots=True)
class _Sums:
    """One pool's running totals while :func:`pool_totals` walks the nodes."""

    nodes: int = 0
    gpus: int = 0
    healthy_gpus: int = 0
    tflops_milli: int = 0
    vram_bytes: int = 0
    served: Counter[frozenset[IsolationMode]] = field(default_factory=Counter)  # healthy GPUs per set of modes
    sizes: list[tuple[str, int]] = field(default_factory=list)  # (product, TFLOPS) of each healthy GPU

    def totals(self) -> PoolTotals:
        return PoolTotals(
            nodes=self.nodes,
            gpus=self.gpus,
            healthy_gpus=self.healthy_gpus,
            tflops_milli=self.tflops_milli,
            vram_bytes=self.vram_bytes,
            modes=_by_mode(self.served),
            sizes=tuple(sorted(compute_percent.largest(self.sizes).items())),
        )


def pool_totals(nodes: Iterable[NodeState]) -> dict[str, PoolTotals]:
    """Sum the GPU nodes by pool: one pass over the GPUs, each pool's totals built once at the end."""
    sums: dict[str, _Sums] = {}
    for node in nodes:
        if not is_gpu_node(node):
            continue
        pool = sums.get(node.pool)
        if pool is None:
            pool = sums[node.pool] = _Sums()
        pool.nodes += 1
        pool.gpus += len(node.gpus)
        for gpu in node.gpus:
            if gpu.healthy:
                pool.healthy_gpus += 1
                pool.tflops_milli += gpu.tflops
                pool.vram_bytes += gpu.vram
                pool.served[gpu.isolation] += 1
                pool.sizes.append((gpu.model, gpu.tflops))
    return {name: pool.totals() for name, pool in sums.items()}


def _by_mode(served: Counter[frozenset[IsolationMode]]) -> tuple[tuple[str, int], ...]:
    """(isolation mode, healthy GPUs serving it), by mode, from how many GPUs serve each set of modes."""
    counts: Counter[str] = Counter()
    for modes, gpus in served.items():
        for mode in modes:
            counts[mode.value] += gpus
    return tuple(sorted(counts.items()))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def pool_ready(pool: str, totals: PoolTotals) -> Condition:
    """Ready while the pool has a healthy GPU; otherwise why not."""
    if totals.nodes == 0:
        joins = f"a node joins it with the label {LABEL_NODE_POOL}={pool}"
        return Condition(READY, False, "NoNodes", f"no GPU node is in the pool: {joins}")
    nodes, gpus = _count(totals.nodes, "node"), _count(totals.gpus, "GPU")
    if totals.gpus == 0:
        return Condition(READY, False, "NoHealthyGPUs", f"{nodes} in the pool, reporting no GPU")
    if totals.healthy_gpus == 0:
        return Condition(READY, False, "NoHealthyGPUs", f"none of the {gpus} on {nodes} is healthy")
    return Condition(READY, True, "HealthyGPUs", f"{totals.healthy_gpus} of {gpus} healthy, on {nodes}")


def pool_statuses(nodes: Iterable[NodeState], records: Iterable[PodRecord]) -> StatusOf:
    """What each GPUPool's status should say, given the cache's nodes and the pods holding GPUs."""
    nodes = tuple(nodes)
    totals = pool_totals(nodes)
    pool_of = {n.name: n.pool for n in nodes if is_gpu_node(n)}
    allocated = reserved_by(records, lambda r: pool_of.get(r.allocation.node) if r.allocation else None)

    def status_of(ref: ObjectRef, _pool: Mapping[str, Any]) -> Status:
        name = ref[1]
        pool, held = totals.get(name, EMPTY_POOL), allocated.get(name, NOTHING)
        fields = {
            "nodes": pool.nodes,
            "gpus": pool.gpus,
            "healthyGPUs": pool.healthy_gpus,
            "capacityTflops": format_milli(pool.tflops_milli),
            "capacityVram": format_bytes(pool.vram_bytes),
            "isolationModes": dict(pool.modes),
            "gpuTflops": {product: format_milli(tflops) for product, tflops in pool.sizes},
            **held.allocated_fields(),
        }
        return Status(fields, (pool_ready(name, pool),))

    return status_of
