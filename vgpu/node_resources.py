"""TFLOPS and VRAM as node resources: what a node advertises and what a pod requests.

kube-scheduler and the API server do not read our annotations; without these resources the
scheduler's preemption dry run, ResourceQuota and ``kubectl describe node`` see no GPU shares.
Extended resources are whole numbers, so TFLOPS go in thousandths (the request model's unit: nothing
is rounded here) and VRAM in bytes. A node advertises the sum over its schedulable GPUs (healthy; a
MIG GPU's instances instead of itself), so the totals are a prefilter that never refuses what the
extender would place; the extender's per-GPU filter still decides.
See deploy/README.md, section "GPU shares as node resources".
"""

from __future__ import annotations

from vgpu.contract.inventory import Health, NodeInventory
from vgpu.names import RESOURCE_MILLI_TFLOPS, RESOURCE_VRAM
from vgpu.request import GpuRequest


def node_capacity(inv: NodeInventory) -> dict[str, str]:
    """The extended resources a node with this inventory advertises (capacity and allocatable)."""
    usable = [g for g in inv.gpus if g.health is Health.HEALTHY and not g.mig]
    return {
        RESOURCE_MILLI_TFLOPS: str(sum(g.tflops for g in usable)),
        RESOURCE_VRAM: str(sum(g.vram for g in usable)),
    }


def pod_requests(req: GpuRequest) -> dict[str, str]:
    """The extended resources a pod with this request asks for, in all: per-GPU request × GPU count."""
    return {
        RESOURCE_MILLI_TFLOPS: str(req.tflops_request * req.gpu_count),
        RESOURCE_VRAM: str(req.vram_request * req.gpu_count),
    }
