"""Why a node cannot take a pod, as a value: a code, a kube-scheduler style message, and its figures.

A rejection is never a bare ``False`` (DESIGN §3). The code decides which map of the extender's
filter reply the node goes to (``FailedNodes`` when preemption could help, ``FailedAndUnresolvableNodes``
when nothing would), the message is what ``kubectl describe pod`` shows, and the numeric figures
let :mod:`vgpu.scheduling.summary` say "most free 2Gi on A100" without re-parsing messages.
The ledger's refusals reuse the same type so every "no" in the core reads alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ReasonCode(StrEnum):
    """Why a node was rejected (filter) or a ledger transition refused."""

    # Permanent for this pod: preemption cannot help (FailedAndUnresolvableNodes).
    UNKNOWN_NODE = "unknown-node"
    INVENTORY_ERROR = "inventory-error"
    NO_GPUS = "no-gpus"
    POOL_MISMATCH = "pool-mismatch"
    NODE_AFFINITY = "node-affinity"
    GPU_MODEL = "gpu-model"
    ISOLATION = "isolation"  # no GPU of the node serves the pod's isolation mode
    GPU_INDICES = "gpu-indices"  # the node lacks a GPU index the pod pins
    GPU_SIZES_DIFFER = "gpu-sizes-differ"  # a compute-percent pod's GPUs there are not all of one size
    TOO_FEW_GPUS = "too-few-gpus"
    GPU_TOO_SMALL = "gpu-too-small"
    # Capacity: freeing room (preemption, pods finishing) could help (FailedNodes).
    INSUFFICIENT_TFLOPS = "insufficient-tflops"
    INSUFFICIENT_VRAM = "insufficient-vram"
    INSUFFICIENT_GPUS = "insufficient-gpus"
    WHOLE_GPU_BUSY = "whole-gpu-busy"
    GPU_HELD_WHOLE = "gpu-held-whole"
    INSUFFICIENT_SLOTS = "insufficient-slots"  # vGPU device IDs: on a GPU (sharing cap) or the node (kubelet)
    INSUFFICIENT_CPU = "insufficient-cpu"
    INSUFFICIENT_MEMORY = "insufficient-memory"
    # Ledger refusals.
    OVER_COMMIT = "over-commit"
    UNKNOWN_GPU = "unknown-gpu"
    INVALID_GRANT = "invalid-grant"
    WHOLE_CONFLICT = "whole-conflict"
    POD_EXISTS = "pod-exists"
    UNKNOWN_POD = "unknown-pod"


UNRESOLVABLE: frozenset[ReasonCode] = frozenset(
    {
        ReasonCode.UNKNOWN_NODE,
        ReasonCode.INVENTORY_ERROR,
        ReasonCode.NO_GPUS,
        ReasonCode.POOL_MISMATCH,
        ReasonCode.NODE_AFFINITY,
        ReasonCode.GPU_MODEL,
        ReasonCode.ISOLATION,
        ReasonCode.GPU_INDICES,
        ReasonCode.GPU_SIZES_DIFFER,
        ReasonCode.TOO_FEW_GPUS,
        ReasonCode.GPU_TOO_SMALL,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reason:
    """One rejection. ``requested``/``free`` are in the unit of the code (milli-TFLOPS, bytes, GPUs, ...).

    ``gpu_model`` names the model of the GPU the figure was taken on; ``values`` carries the distinct
    things that did not match (the node's models, its pool) for the summary.
    """

    code: ReasonCode
    message: str
    requested: int = 0
    free: int = 0
    gpu_model: str = ""
    values: tuple[str, ...] = ()

    @property
    def unresolvable(self) -> bool:
        """True when no preemption on this node could make the pod fit."""
        return self.code in UNRESOLVABLE

    def __str__(self) -> str:
        return self.message
