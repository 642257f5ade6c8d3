"""Admission warnings for values we accept and store but do not act on yet: never silence.

The request model parses every TensorFusion field strictly, and the generated TensorFusionWorkload
keeps them, so a user who turns autoscaling on, asks for replicas or a standalone worker, or
configures prediction gets no error — and, until a controller implements them, no effect. Each such
value is named in a warning the API server hands back to ``kubectl``, saying what does not happen,
so that silence is never mistaken for a promise. The three autoscaling layers are acted on by the
autoscaler in the extender (docs/autoscaling.md), so they warn no more; their prediction blocks still
do. An isolation mode that does not hold a value the pod sets, or holds it only in part, says so too
(docs/isolation.md): shared enforces no TFLOPS limit, soft's HAMi-core holds one inside the pod's processes
with the limits measured, and under hard a request is guaranteed only where no pod may go past its own.
Several inject containers sharing the pod's GPUs are each held to its whole grant alone, and said so.
Pure: a resolved request in, warning texts out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from vgpu.names import TF_UNSERVED_KEYS, Annotation, IsolationMode
from vgpu.quantity import humanize_bytes, humanize_tflops
from vgpu.request import GpuRequest

_PREDICTING: Final = ("autoSetLimits", "autoSetRequests")


def _enabled(block: object) -> bool:
    return isinstance(block, dict) and block.get("enable") is True


def unserved(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """One warning per TensorFusion annotation the pod carries that means nothing here (names.TF_UNSERVED_KEYS)."""
    return tuple(
        f"{key}: TensorFusion's, ignored here: {TF_UNSERVED_KEYS[key]}"
        for key in sorted(annotations)
        if key in TF_UNSERVED_KEYS
    )


def unkept(req: GpuRequest) -> tuple[str, ...]:
    """One warning per accepted value nothing acts on, naming the field and what does not happen."""
    out = []
    for block in _PREDICTING:
        config = dict(req.auto_scaling.get(block) or {})
        if _enabled(config.get("prediction")):
            out.append(
                f"autoScalingConfig.{block}.prediction.enable: accepted but not implemented: "
                "no usage prediction is made (decisions use measured usage only)"
            )
    if req.replicas is not None and not _enabled(req.auto_scaling.get("autoSetReplicas")):
        out.append(
            f"{Annotation.REPLICAS} / replicas '{req.replicas}': recorded on the TensorFusionWorkload only; it "
            "creates and scales no pods (the owning Deployment or StatefulSet's replicas decide). With "
            f"{Annotation.AUTO_REPLICAS} it is the fewest replicas the autoscaler keeps"
        )
    if req.no_standalone_worker_mode:
        out.append(
            f"{Annotation.NO_STANDALONE_WORKER_MODE} / standaloneWorkerMode: recorded only; every pod uses its "
            "granted GPU from its own containers (there is no separate worker to run or skip)"
        )
    out += _isolation(req)
    out += _sharing_containers(req)
    return tuple(out)


def _sharing_containers(req: GpuRequest) -> list[str]:
    """Several inject containers on the same GPUs: each is handed the pod's whole grant at Allocate and held
    to it alone by its limiter (HAMi-core's region and MPS are per container or per process); only the VRAM
    guard, by the driver's count, holds them to the pod's VRAM limit together (docs/security.md)."""
    if len(req.containers) < 2 or req.container_gpu_counts is not None or req.dedicated_gpu:
        return []
    n, names = len(req.containers), ",".join(req.containers)
    compute = (
        f"its TFLOPS limit {humanize_tflops(req.tflops_limit)} holds each one alone, so together they may use up to "
        f"{n} times it; "
        if req.tflops_limit and req.isolation is not IsolationMode.SHARED
        else ""
    )
    return [
        f"{Annotation.INJECT_CONTAINER} '{names}': these {n} containers share the pod's GPUs, and each is given "
        f"the pod's whole grant, its limiter holding each one alone: {compute}the pod's VRAM limit "
        f"{humanize_bytes(req.vram_limit)} holds for them together only by the driver's count, the device plugin "
        "killing the largest of their processes once together they stay past it (docs/security.md). For limits "
        f"that hold each container, give each its own GPUs ({Annotation.CONTAINER_GPU_COUNT}) or the GPU to one"
    ]


def _isolation(req: GpuRequest) -> list[str]:
    mode, key = req.isolation, Annotation.ISOLATION
    limit, request = humanize_tflops(req.tflops_limit), humanize_tflops(req.tflops_request)
    if req.dedicated_gpu or req.tflops_limit == 0:
        return []
    if mode is IsolationMode.SHARED:
        return [
            f"{key} 'shared': the TFLOPS limit {limit} is not enforced (pods on the GPU share its compute by "
            f"time-slicing) and the TFLOPS request {request} is counted for placement only, not guaranteed; "
            "VRAM limits hold (docs/isolation.md)"
        ]
    if mode is IsolationMode.SOFT:
        return [
            f"{key} 'soft': the TFLOPS limit {limit} is held by HAMi-core inside the pod's processes, not by the "
            "GPU: a steady kernel loop settles within 1 point of it in about 3 s, but short kernels and CUDA Graphs "
            "start well below it and take tens of seconds to reach it, a busy neighbour still delays every kernel "
            "(small-kernel p99 x35), a process that runs without HAMi-core is not limited, and after a pause a "
            "load runs at the whole GPU for seconds (a loop capped at 25 % ran at 100 % for 4 s after a 20 s pause) "
            "(measured on an H200 with the plugin image's HAMi-core). Ask for isolation hard for a cap the GPU "
            "enforces (docs/isolation.md)"
        ]
    if mode is IsolationMode.HARD:
        # MPS's active-thread percentage holds each client process, never the pod (docs/isolation-mps.md).
        per_process = (
            f"the TFLOPS limit {limit} holds each of the pod's processes, not the pod: N busy processes may use up "
            "to N times it (MPS limits each client; docs/isolation-mps.md)"
        )
        if req.tflops_limit > req.tflops_request:
            return [
                f"{key} 'hard': each pod may use up to its TFLOPS limit ({limit} here), so requests on a GPU are "
                "guaranteed only while its pods' limits fit in it: the scheduler counts requests, so this pod's "
                f"request {request} holds where every hard pod on its GPU sets its limit equal to its request "
                f"(docs/isolation.md); and {per_process}"
            ]
        return [f"{key} 'hard': {per_process}"]
    return []
