"""The resolved request: the webhook's normalised GpuRequest, written on the pod at admission.

Everything downstream (extender, device plugin, CLI) reads this one annotation instead of
re-resolving annotations, profiles and pool defaults, which may have changed since admission.
"""

from __future__ import annotations

from typing import Any, Final

from vgpu.contract.strict import dump, load
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
        **({"gpuIndices": list(req.gpu_indices)} if req.gpu_indices else {}),
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
        gpu_indices=r.added_integers("gpuIndices", 0, MAX_GPU_COUNT - 1),
    )
    r.done()
    return req
