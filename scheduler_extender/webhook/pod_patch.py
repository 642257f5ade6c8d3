"""The JSONPatch that turns an opted-in pod into one our scheduler and device plugin can serve.

Each inject container gets ``tensor-fusion.ai/vgpu`` (= gpu-count) in requests and limits, so
kube-scheduler sends the pod to the extender (managedResources) and kubelet asks the device plugin;
every other container loses any copy a tenant wrote. The pod is handed to our scheduler, gets the
QoS PriorityClass unless it chose one, tolerates the GPU nodes' taints (``tolerations.py``), and
carries the resolved request for everyone downstream.

Whole objects are replaced with ``add`` (which overwrites), so the patch is correct whatever
sub-keys were missing, and idempotent if the API server ever reinvokes us.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from scheduler_extender.webhook.tolerations import missing
from vgpu.contract import resolved
from vgpu.names import QOS_PRIORITY_VALUE, RESOURCE_VGPU, SCHEDULER_NAME, SystemAnnotation
from vgpu.request import GpuRequest

# Only our components write these; a tenant copy is removed on create (the admission policy
# rejects them for anyone but the owning service account, and RESOLVED_REQUEST is re-derived here).
SYSTEM_KEYS: Final = tuple(
    key.value for key in (SystemAnnotation.RESOLVED_REQUEST, SystemAnnotation.ALLOCATION, SystemAnnotation.HANDOFF)
)
_DEFAULT_SCHEDULER: Final = "default-scheduler"

Op = dict[str, Any]


def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON pointer (``/`` in annotation and resource names becomes ``~1``)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def pod_patch(
    pod: Mapping[str, Any],
    req: GpuRequest,
    annotations: Mapping[str, str],
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> tuple[list[Op], list[str]]:
    """The patch for ``pod`` (raw JSON, shape checked by the caller) and warnings for the user;
    ``annotations`` are the tenant's, already stripped of system keys; ``tolerations`` are the GPU
    nodes' (added unless the pod already tolerates them)."""
    ops: list[Op] = []
    warnings: list[str] = []
    wanted = {**annotations, SystemAnnotation.RESOLVED_REQUEST.value: resolved.encode(req)}
    ops.append({"op": "add", "path": pointer("metadata", "annotations"), "value": wanted})
    spec: Mapping[str, Any] = pod["spec"]
    for field in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(field) or ()):
            inject = field == "containers" and container.get("name") in req.containers
            current = container.get("resources")
            new = _with_vgpu(current, req.gpu_count if inject else None)
            if new != current:
                ops.append({"op": "add", "path": pointer("spec", field, index, "resources"), "value": new})
                if not inject:
                    warnings.append(f"removed {RESOURCE_VGPU} from {field[:-1]} {container.get('name')!s:.60}")
    scheduler = spec.get("schedulerName")
    if scheduler != SCHEDULER_NAME:
        ops.append({"op": "add", "path": pointer("spec", "schedulerName"), "value": SCHEDULER_NAME})
        if scheduler not in (None, "", _DEFAULT_SCHEDULER):
            warnings.append(f"spec.schedulerName {scheduler!s:.60} replaced by {SCHEDULER_NAME}")
    if not spec.get("priorityClassName"):
        # The Priority admission plugin ran before us and set spec.priority from the (absent) class;
        # set both so they agree even if the plugin is re-run after our patch.
        ops.append({"op": "add", "path": pointer("spec", "priorityClassName"), "value": req.qos.priority_class})
        ops.append({"op": "add", "path": pointer("spec", "priority"), "value": QOS_PRIORITY_VALUE[req.qos]})
    add = missing(spec.get("tolerations"), tolerations)
    if add and isinstance(spec.get("tolerations"), list):
        ops += [{"op": "add", "path": pointer("spec", "tolerations", "-"), "value": dict(t)} for t in add]
    elif add:
        ops.append({"op": "add", "path": pointer("spec", "tolerations"), "value": [dict(t) for t in add]})
    return ops, warnings


def _with_vgpu(current: object, count: int | None) -> Any:
    """``current`` resources with the vGPU resource set to ``count`` (or removed when None)."""
    res: dict[str, Any] = dict(current) if isinstance(current, Mapping) else {}
    changed = False
    for side in ("requests", "limits"):
        raw = res.get(side)
        block: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
        if count is not None and block.get(RESOURCE_VGPU) != str(count):
            block[RESOURCE_VGPU] = str(count)
        elif count is None and RESOURCE_VGPU in block:
            del block[RESOURCE_VGPU]
        else:
            continue
        res[side] = block
        changed = True
    return res if changed else current
