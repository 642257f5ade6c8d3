"""TFLOPS and VRAM as node resources: what a node advertises and what a pod requests.

kube-scheduler and the API server do not read our annotations, so without these the scheduler's
preemption dry run thinks every node fits once CPU and memory do, ResourceQuota cannot count GPU
shares, and ``kubectl describe node`` shows none. Extended resources are whole numbers with request
equal to limit, so TFLOPS go in thousandths — the request model's unit, so nothing is rounded here;
``parse_milli`` already rounds a sub-milli annotation up — and VRAM in bytes.

A node advertises the sum over its schedulable GPUs (healthy; of a GPU in MIG mode, its instances
instead of itself, vgpu.mig): a pod that fits one
GPU in the extender's per-GPU ledger always fits the node's totals, so the totals are a prefilter that
never refuses what the extender would place. They may accept what no single GPU can hold
(fragmentation); the extender's filter still decides that.
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
