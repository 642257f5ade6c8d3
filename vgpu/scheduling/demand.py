"""From the request model's :class:`vgpu.request.GpuRequest` to the core's :class:`Demand`.

The webhook resolves a pod's annotations, profile and pool defaults into one GpuRequest; the core
decides over the smaller, flatter Demand (the trace replay builds Demands directly from trace rows).
Keeping the mapping in one function means the extender and the benchmark cannot read a request
differently — e.g. both treat every value as per GPU, multiplied by ``gpu_count`` only at placement.
The vGPU slots a pod takes are read the same way for the pod being scheduled and for the pods
already holding GPUs (:func:`gpu_slots`), so the filter and the ledger count alike.
"""

from __future__ import annotations

import json
from collections.abc import Hashable

from vgpu.request import GpuRequest
from vgpu.scheduling.model import Demand, workload_key


def gpu_slots(device_ids: int | None, *, containers: int, gpu_count: int) -> int:
    """The vGPU slots a pod takes on each GPU it is granted.

    ``device_ids``: the ``tensor-fusion.ai/vgpu`` device IDs its spec makes the kubelet hold, spread
    over its ``gpu_count`` GPUs and rounded up (the webhook gives each GPU container ``gpu_count``,
    so this is its number of GPU containers; with ``container-gpu-count`` each GPU is one container's,
    so 1). None: no container of the spec asks for any yet (a manifest before the webhook, e.g.
    ``tfctl explain``): what the webhook will inject, one per container of ``containers``.
    """
    if device_ids is None:
        return containers
    return -(-device_ids // gpu_count) if gpu_count > 0 else 0


def demand_from_request(
    req: GpuRequest,
    *,
    pod_key: str,
    device_ids: int | None = None,
    cpu: int = 0,
    memory: int = 0,
) -> Demand:
    """The Demand of one pod (``pod_key`` is ``<namespace>/<name>``).

    ``device_ids`` is what the pod's spec asks of ``tensor-fusion.ai/vgpu`` by the kubelet's rule
    (None: nothing yet), turned into slots per GPU by :func:`gpu_slots`.

    A dedicated request (``tensor-fusion.ai/dedicated-gpu``) asks for entire GPUs: idle ones, never
    shared, granted whole (trace rows with a full-GPU share build such Demands directly). ``cpu`` and
    ``memory`` are only checked against nodes that publish ``cpu_free``/``memory_free`` (the replay).
    The workload is keyed by the pod's namespace (from ``pod_key``), as the cache keys the nodes it holds.
    """
    namespace = pod_key.partition("/")[0]
    return Demand(
        pod_key=pod_key,
        gpu_count=req.gpu_count,
        tflops=req.tflops_request,
        vram=req.vram_request,
        tflops_limit=req.tflops_limit,
        vram_limit=req.vram_limit,
        qos=req.qos,
        pool=req.pool,
        gpu_model=req.gpu_model,
        workload=None if req.workload is None else workload_key(namespace, req.workload),
        is_local_gpu=req.is_local_gpu,
        policy=req.placement_policy,
        node_affinity=req.node_affinity,
        whole_gpu=req.dedicated_gpu,
        isolation=req.isolation,
        gpu_indices=None if req.gpu_indices is None else frozenset(req.gpu_indices),
        slots=gpu_slots(
            device_ids, containers=1 if req.container_gpu_counts else len(req.containers), gpu_count=req.gpu_count
        ),
        cpu=cpu,
        memory=memory,
        compute_percent=req.compute_percent_request,
        compute_percent_limit=req.compute_percent_limit,
    )


def decision_key(demand: Demand) -> tuple[Hashable, ...]:
    """What a node's verdict and score read of a demand: equal keys, equal answers on the same node state.

    The pod, its workload, QoS and TFLOPS limit (a percent one too) are left out: the fit checks TFLOPS and the VRAM
    a pod holds (the larger of its VRAM request and limit, so the VRAM limit is in the key), and scores
    read the shape and where it may run (locality, which reads the workload, is never remembered). So the
    first pod of a new workload whose shape an earlier one had is judged from what is remembered for it.
    """
    affinity = None if demand.node_affinity is None else json.dumps(demand.node_affinity, sort_keys=True)
    return (
        demand.pool,
        demand.gpu_model,
        demand.gpu_count,
        demand.tflops,
        demand.vram,
        demand.vram_limit,
        demand.whole_gpu,
        demand.slots,
        demand.cpu,
        demand.memory,
        demand.policy,
        affinity,
        demand.isolation,
        demand.gpu_indices,
        demand.compute_percent,
    )
