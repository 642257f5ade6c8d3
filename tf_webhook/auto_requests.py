"""autoSetRequests at admission: a new pod of an autoscaled workload gets the recommended requests.

The autoscaler (in the extender) publishes its recommendation in the TensorFusionWorkload's
``status.autoScaling.requests`` — ``tflopsRequest`` / ``vramRequest`` appear only once there is enough
history to recommend (docs/autoscaling.md, the confidence rule). A pod whose resolved request enables the
layer, for the resources its ``targetResource`` covers, is admitted with them instead of its profile's or
annotations' requests; a limit below the new request is raised to it (a request never exceeds its limit).
The resolved request says so (``autoRequests``: from where, and what was replaced), and so does an
admission warning. Whole-GPU pods have no request to change. Pure: the request and the workload object in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from vgpu.autoscale.config import REQUESTS, Resource, parse
from vgpu.errors import DomainError
from vgpu.names import KIND_WORKLOAD
from vgpu.quantity import humanize_bytes, humanize_tflops, parse_bytes, parse_milli
from vgpu.request import GpuRequest


def recommended(workload: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The workload's ``status.autoScaling.requests``, or nothing."""
    status = (workload or {}).get("status")
    auto = status.get("autoScaling") if isinstance(status, Mapping) else None
    requests = auto.get("requests") if isinstance(auto, Mapping) else None
    return requests if isinstance(requests, Mapping) else {}


def stamp(
    req: GpuRequest, namespace: str, read: Callable[[str, str], Mapping[str, Any] | None]
) -> tuple[GpuRequest, tuple[str, ...]]:
    """``req`` with the workload's recommended requests where the layer applies, and the warning saying so;
    ``read(namespace, name)`` fetches the workload, only when the layer is on."""
    block = req.auto_scaling.get(REQUESTS)
    if req.dedicated_gpu or not req.workload or not (isinstance(block, Mapping) and block.get("enable") is True):
        return req, ()
    try:
        target = parse(dict(req.auto_scaling)).requests.target
    except DomainError:  # admission checked the config already; an unusable one changes nothing
        return req, ()
    found = recommended(read(namespace, req.workload))
    changes: dict[str, int] = {}
    shown: list[str] = []
    for resource, key, quantity, show in (
        (Resource.TFLOPS, "tflopsRequest", parse_milli, humanize_tflops),
        (Resource.VRAM, "vramRequest", parse_bytes, humanize_bytes),
    ):
        raw = found.get(key)
        if not target.covers(resource) or not isinstance(raw, str):
            continue
        try:
            value = quantity(raw, key=key)
        except DomainError:
            continue
        old = req.tflops_request if resource is Resource.TFLOPS else req.vram_request
        if value > 0 and value != old:
            changes[resource.value] = value
            shown.append(f"{resource.value} request {show(old)} → {show(value)}")
    if not changes:
        return req, ()
    tflops = changes.get(Resource.TFLOPS.value, req.tflops_request)
    vram = changes.get(Resource.VRAM.value, req.vram_request)
    source = f"{KIND_WORKLOAD} {namespace}/{req.workload} status.autoScaling.requests (autoSetRequests)"
    note = f"{source}: {', '.join(shown)}"
    stamped = replace(
        req,
        tflops_request=tflops,
        vram_request=vram,
        tflops_limit=max(req.tflops_limit, tflops),
        vram_limit=max(req.vram_limit, vram),
        auto_requests=note,
    )
    return stamped, (f"requests set by {note}",)
