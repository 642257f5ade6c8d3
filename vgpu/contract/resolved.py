"""The resolved request: the webhook's normalised GpuRequest, written on the pod at admission.

Everything downstream (extender, device plugin, CLI) reads this one annotation instead of
re-resolving annotations, profiles and pool defaults, which may have changed since admission.
"""

from __future__ import annotations

from typing import Any, Final

from vgpu import compute_percent
from vgpu.contract.strict import Reader, dump, load
from vgpu.errors import DomainError
from vgpu.fields import MAX_GPU_COUNT, MAX_REPLICAS
from vgpu.names import MAX_EVICTION_PROTECTION_S, IsolationMode, PlacementPolicy, Qos, SystemAnnotation
from vgpu.quantity import format_bytes, format_milli, parse_bytes, parse_milli
from vgpu.request import GpuRequest

VERSION: Final = "v1"
KEY: Final = SystemAnnotation.RESOLVED_REQUEST.value


def encode(req: GpuRequest) -> str:
    doc: dict[str, Any] = {
        "version": VERSION,
        "pool": req.pool,
        "containers": list(req.containers),
        "gpuCount": req.gpu_count,
        "tflopsRequest": format_milli(req.tflops_request),
        "tflopsLimit": format_milli(req.tflops_limit),
        "vramRequest": format_bytes(req.vram_request),
        "vramLimit": format_bytes(req.vram_limit),
        "qos": req.qos.value,
        "isLocalGPU": req.is_local_gpu,
        "noStandaloneWorkerMode": req.no_standalone_worker_mode,
        "gpuModel": req.gpu_model,
        "workload": req.workload,
        "generateWorkload": req.generate_workload,
        "workloadProfile": req.workload_profile,
        "replicas": req.replicas,
        "placementPolicy": req.placement_policy and req.placement_policy.value,
        "nodeAffinity": req.node_affinity,
        "autoScalingConfig": req.auto_scaling,
        # Only on dedicated pods: every other pod's annotation reads as before this field existed.
        **({"dedicatedGpu": True} if req.dedicated_gpu else {}),
        **({"autoRequests": req.auto_requests} if req.auto_requests else {}),
        **({"isolation": req.isolation.value} if req.isolation else {}),
        **({"evictionProtectionSeconds": req.eviction_protection_s} if req.eviction_protection_s else {}),
        **(
            {"containerGpuCount": [{"container": c, "count": n} for c, n in req.container_gpu_counts]}
            if req.container_gpu_counts
            else {}
        ),
        **({"gpuIndices": list(req.gpu_indices)} if req.gpu_indices else {}),
        # Thousandths of a percent (vgpu.compute_percent); the TFLOPS above are then the admission charge.
        **(
            {
                "computePercentRequestMilli": req.compute_percent_request,
                "computePercentLimitMilli": req.compute_percent_limit,
            }
            if req.compute_percent_request is not None
            else {}
        ),
    }
    return dump(doc)


def decode(text: str) -> GpuRequest:
    r = load(text, KEY, (VERSION,))
    policy = r.opt_choice("placementPolicy", tuple(PlacementPolicy))
    isolation = r.added_choice("isolation", tuple(IsolationMode))
    req = GpuRequest(
        pool=r.text("pool"),
        containers=r.strings("containers"),
        gpu_count=r.integer("gpuCount", 1, MAX_GPU_COUNT),
        tflops_request=r.quantity("tflopsRequest", parse_milli),
        tflops_limit=r.quantity("tflopsLimit", parse_milli),
        vram_request=r.quantity("vramRequest", parse_bytes),
        vram_limit=r.quantity("vramLimit", parse_bytes),
        qos=Qos(r.choice("qos", tuple(Qos))),
        is_local_gpu=r.flag("isLocalGPU"),
        no_standalone_worker_mode=r.flag("noStandaloneWorkerMode"),
        gpu_model=r.opt_text("gpuModel"),
        dedicated_gpu=r.added_flag("dedicatedGpu"),
        workload=r.opt_text("workload"),
        generate_workload=r.opt_flag("generateWorkload"),
        workload_profile=r.opt_text("workloadProfile"),
        replicas=r.opt_integer("replicas", (0, MAX_REPLICAS)),
        placement_policy=None if policy is None else PlacementPolicy(policy),
        node_affinity=r.obj("nodeAffinity", optional=True),
        auto_scaling=r.obj("autoScalingConfig") or {},
        auto_requests=r.added_text("autoRequests"),
        isolation=None if isolation is None else IsolationMode(isolation),
        eviction_protection_s=r.added_integer("evictionProtectionSeconds", 1, MAX_EVICTION_PROTECTION_S),
        container_gpu_counts=r.added_items("containerGpuCount", _container_count),
        gpu_indices=r.added_integers("gpuIndices", 0, MAX_GPU_COUNT - 1),
        compute_percent_request=r.added_integer("computePercentRequestMilli", 1, compute_percent.WHOLE),
        compute_percent_limit=r.added_integer("computePercentLimitMilli", 1, compute_percent.WHOLE),
    )
    r.done()
    _check_counts(req)
    if (req.compute_percent_request is None) != (req.compute_percent_limit is None):
        raise DomainError.one(f"{KEY}.computePercentLimitMilli", None, "missing: set both compute percents, or neither")
    return req


def _container_count(r: Reader) -> tuple[str, int]:
    entry = (r.text("container"), r.integer("count", 1, MAX_GPU_COUNT))
    r.done()
    return entry


def _check_counts(req: GpuRequest) -> None:
    """GPUs per container name the request's containers in order and sum to its GPU count."""
    if req.container_gpu_counts is None:
        return
    named = tuple(c for c, _ in req.container_gpu_counts)
    total = sum(n for _, n in req.container_gpu_counts)
    if named != req.containers or total != req.gpu_count:
        raise DomainError.one(
            f"{KEY}.containerGpuCount",
            ", ".join(f"{c}: {n}" for c, n in req.container_gpu_counts),
            f"must give each of the containers {', '.join(req.containers)} its count, in order, "
            f"summing to gpuCount {req.gpu_count}",
        )
