"""Builders for scheduling-core tests: GPUs, nodes, snapshots and demands in readable units.

Quantities are written as users write them (``"10"`` TFLOPS, ``"4Gi"``) and parsed with the same
exact helpers the product uses, so a test reads like a pod spec and never hand-multiplies bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vgpu.catalog import Catalog, builtin
from vgpu.names import DEFAULT_SLICES_PER_GPU, IsolationMode, PlacementPolicy, Qos
from vgpu.quantity import parse_bytes, parse_milli
from vgpu.scheduling.model import EVERY_MODE, Demand, GpuState, NodeState, Snapshot

A100 = "NVIDIA A100-SXM4-80GB"
T4 = "Tesla T4"
CATALOG: Catalog = builtin()


def make_gpu(
    uuid: str = "GPU-0",
    *,
    index: int = 0,
    model: str = A100,
    tflops: str = "312",
    vram: str = "80Gi",
    tflops_used: str = "0",
    vram_used: str = "0",
    pods: int | None = None,
    healthy: bool = True,
    whole: bool = False,
    slots: int = DEFAULT_SLICES_PER_GPU,
    slots_used: int = 0,
    isolation: Iterable[IsolationMode] = EVERY_MODE,
) -> GpuState:
    t_used, v_used = parse_milli(tflops_used), parse_bytes(vram_used)
    return GpuState(
        uuid=uuid,
        index=index,
        model=model,
        tflops=parse_milli(tflops),
        vram=parse_bytes(vram),
        healthy=healthy,
        tflops_used=t_used,
        vram_used=v_used,
        pods=(1 if t_used or v_used else 0) if pods is None else pods,
        whole=whole,
        slots=slots,
        slots_used=slots_used,
        isolation=frozenset(isolation),
    )


def make_node(
    name: str = "n1",
    *,
    pool: str = "default-pool",
    gpus: Sequence[GpuState] | None = None,
    n_gpus: int = 1,
    labels: Mapping[str, str] | None = None,
    inventory_error: str | None = None,
    cpu_free: int | None = None,
    memory_free: str | None = None,
    node_slots_used: int | None = None,
    **gpu: Any,
) -> NodeState:
    """A node with ``gpus``, or ``n_gpus`` GPUs built by :func:`make_gpu` from the remaining keywords.

    ``node_slots_used`` (the device IDs the node's pods hold) defaults to the sum over its GPUs' ``slots_used``.
    """
    if gpus is None:
        gpus = [make_gpu(f"GPU-{name}-{i}", index=i, **gpu) for i in range(n_gpus)]
    return NodeState(
        name=name,
        pool=pool,
        labels=dict(labels or {}),
        gpus=tuple(gpus),
        inventory_error=inventory_error,
        cpu_free=cpu_free,
        memory_free=None if memory_free is None else parse_bytes(memory_free),
        slots_used=sum(g.slots_used for g in gpus) if node_slots_used is None else node_slots_used,
    )


def make_snapshot(*nodes: NodeState, workload_nodes: Mapping[str, frozenset[str]] | None = None) -> Snapshot:
    return Snapshot(nodes={n.name: n for n in nodes}, workload_nodes=dict(workload_nodes or {}))


def make_demand(
    *,
    pod_key: str = "default/p",
    tflops: str = "10",
    vram: str = "4Gi",
    count: int = 1,
    qos: Qos = Qos.MEDIUM,
    pool: str | None = None,
    model: str | None = None,
    workload: str | None = None,
    is_local_gpu: bool = False,
    policy: PlacementPolicy | None = None,
    node_affinity: Mapping[str, Any] | None = None,
    whole_gpu: bool = False,
    cpu: int = 0,
    memory: str = "0",
    slots: int = 1,
    isolation: IsolationMode | None = None,
    gpu_indices: Iterable[int] | None = None,
    percent: int | None = None,
) -> Demand:
    """``percent``: compute in thousandths of a percent of each GPU (``tflops`` is then the admission charge)."""
    t, v = parse_milli(tflops), parse_bytes(vram)
    return Demand(
        pod_key=pod_key,
        gpu_count=count,
        tflops=t,
        vram=v,
        tflops_limit=t,
        vram_limit=v,
        qos=qos,
        pool=pool,
        gpu_model=model,
        workload=workload,
        is_local_gpu=is_local_gpu,
        policy=policy,
        node_affinity=node_affinity,
        whole_gpu=whole_gpu,
        cpu=cpu,
        memory=parse_bytes(memory),
        slots=slots,
        isolation=isolation,
        gpu_indices=None if gpu_indices is None else frozenset(gpu_indices),
        compute_percent=percent,
        compute_percent_limit=percent,
    )


def required(*terms: Sequence[Mapping[str, Any]], fields: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A NodeAffinity whose required terms each hold the given matchExpressions."""
    built: list[dict[str, Any]] = [{"matchExpressions": list(t)} for t in terms]
    if fields:
        built.append({"matchFields": list(fields)})
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": built}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)} if values else {"key": key, "operator": operator}
