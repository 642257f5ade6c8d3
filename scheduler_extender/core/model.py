"""The plain values the scheduling core decides over: GPUs, nodes, a cluster snapshot, a pod's demand.

Everything here is a frozen dataclass built by the shell (from the cluster cache) or by the
benchmark (from a trace), so that filter/score/place/ledger are pure functions of these values
and the extender and the trace replay run exactly the same decisions.
Units: TFLOPS in milli-TFLOPS, VRAM in bytes, CPU in millicores, memory in bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu.names import PlacementPolicy, Qos


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuState:
    """One physical GPU and what is already reserved on it (sum of granted *requests*)."""

    uuid: str
    index: int
    model: str
    tflops: int
    vram: int
    healthy: bool = True
    numa: int | None = None
    tflops_used: int = 0
    vram_used: int = 0
    pods: int = 0  # pods holding a share of this GPU
    whole: bool = False  # held exclusively by a whole-GPU pod

    @property
    def tflops_free(self) -> int:
        return self.tflops - self.tflops_used

    @property
    def vram_free(self) -> int:
        return self.vram - self.vram_used


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeState:
    """One node as the extender knows it. ``inventory_error`` is set when its inventory is corrupt."""

    name: str
    pool: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[GpuState, ...] = ()
    inventory_error: str | None = None
    # Non-GPU resources, used by the trace replay (kube-scheduler checks them in-tree for real pods).
    cpu_free: int | None = None
    memory_free: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """What one pod needs, per GPU, resolved from its GpuRequest (or a trace row)."""

    pod_key: str  # "<namespace>/<name>"
    gpu_count: int
    tflops: int  # per-GPU request (reserved)
    vram: int  # per-GPU request (reserved)
    tflops_limit: int
    vram_limit: int
    qos: Qos = Qos.MEDIUM
    pool: str | None = None
    gpu_model: str | None = None
    workload: str | None = None
    is_local_gpu: bool = False
    policy: PlacementPolicy | None = None
    node_affinity: Mapping[str, Any] | None = None
    whole_gpu: bool = False  # asks for entire GPUs (never shares with fractional pods)
    cpu: int = 0
    memory: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """An immutable view of the cluster for one decision."""

    nodes: Mapping[str, NodeState]
    # workload name -> node names where that workload already holds GPUs (local-GPU affinity)
    workload_nodes: Mapping[str, frozenset[str]] = field(default_factory=dict)
