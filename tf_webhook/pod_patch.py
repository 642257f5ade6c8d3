"""The JSONPatch that turns an opted-in pod into one our scheduler and device plugin can serve.

Each inject container gets ``tensor-fusion.ai/vgpu`` (its GPUs: gpu-count, or its own count from
container-gpu-count) in requests and limits, so kube-scheduler sends the pod to the extender
(managedResources) and kubelet asks the device plugin, once per container with that many device IDs;
the first one also gets the pod's GPU shares as node resources (``vgpu/node_resources.py``), which
kube-scheduler's fit and preemption and ResourceQuota count. Every other container loses any copy of
these a tenant wrote. The pod is handed to our scheduler, gets the
QoS PriorityClass unless it chose one, tolerates the GPU nodes' taints (``tolerations.py``), gets its
profile's preferred node-affinity terms beside its own (kube-scheduler scores them; the required ones
the extender applies), and carries the resolved request for everyone downstream.

Whole objects are replaced with ``add`` (which overwrites), so the patch is correct whatever
sub-keys were missing, and idempotent if the API server ever reinvokes us.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from tf_webhook.tolerations import missing
from vgpu.contract import resolved
from vgpu.names import NODE_RESOURCES, QOS_PRIORITY_VALUE, RESOURCE_VGPU, SCHEDULER_NAME, SystemAnnotation
from vgpu.node_resources import pod_requests
from vgpu.request import GpuRequest
from vgpu.scheduling.affinity import PREFERRED, preferred_terms

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
    shares = {k: v for k, v in pod_requests(req).items() if v != "0"}
    first = next((c.get("name") for c in spec.get("containers") or () if c.get("name") in req.containers), None)
    counts = dict(req.container_gpu_counts or ((c, req.gpu_count) for c in req.containers))
    for field in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(field) or ()):
            inject = field == "containers" and container.get("name") in req.containers
            wanted = {RESOURCE_VGPU: str(counts[container.get("name")])} if inject else {}
            if inject and container.get("name") == first:
                wanted |= shares
            current = container.get("resources")
            new = _with_ours(current, wanted)
            if new != current:
                ops.append({"op": "add", "path": pointer("spec", field, index, "resources"), "value": new})
                if not inject:
                    removed = ", ".join(sorted(_ours_in(current)))
                    warnings.append(f"removed {removed} from {field[:-1]} {container.get('name')!s:.60}")
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
    affinity = _with_preferred(spec.get("affinity"), preferred_terms(req.node_affinity))
    if affinity is not None:
        ops.append({"op": "add", "path": pointer("spec", "affinity"), "value": affinity})
    return ops, warnings


def _with_preferred(current: object, terms: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The pod's affinity with ``terms`` (its profile's preferred node-affinity terms) added to its own
    preferred terms, each once; None when nothing is added."""
    affinity: dict[str, Any] = dict(current) if isinstance(current, Mapping) else {}
    node: dict[str, Any] = dict(affinity.get("nodeAffinity") or {})
    own = list(preferred_terms(node))
    added = [dict(t) for t in terms if t not in own]
    if not added:
        return None
    node[PREFERRED] = own + added
    affinity["nodeAffinity"] = node
    return affinity


def _with_ours(current: object, wanted: Mapping[str, str]) -> Any:
    """``current`` resources with exactly ``wanted`` of our resources, in requests and limits alike."""
    res: dict[str, Any] = dict(current) if isinstance(current, Mapping) else {}
    changed = False
    for side in ("requests", "limits"):
        raw = res.get(side)
        block: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
        ours = {k: str(v) for k, v in block.items() if k in _OURS}
        if ours == wanted:
            continue
        res[side] = {k: v for k, v in block.items() if k not in _OURS} | dict(wanted)
        changed = True
    return res if changed else current


def _ours_in(resources: object) -> set[str]:
    """Which of our resources ``resources`` (a container's) names, in requests or limits."""
    if not isinstance(resources, Mapping):
        return set()
    sides = (resources.get(side) for side in ("requests", "limits"))
    return {k for side in sides if isinstance(side, Mapping) for k in side if k in _OURS}


_OURS: Final = frozenset((RESOURCE_VGPU, *NODE_RESOURCES))
