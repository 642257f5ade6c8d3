"""TensorFusionWorkload specs written by ``generate-workload: "true"``, and how an update merges.

TensorFusion's webhook rewrote the whole workload spec from each new pod, so the last pod won and
fields only a profile or an operator had set (autoScalingConfig, nodeAffinity) vanished. Here an
update is a deep merge: what the pod resolved overrides, everything else already on the workload
stays. The merge is pure so the Kubernetes shell only does get / create / replace-with-retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from vgpu.names import CRD_GROUP, CRD_VERSION, KIND_WORKLOAD
from vgpu.profile import ProfileSpec, Resources, to_crd
from vgpu.request import GpuRequest

API_VERSION: Final = f"{CRD_GROUP}/{CRD_VERSION}"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "tensor-fusion-webhook"}
# Replaced as a whole when the pod sets them: a partial merge of a node affinity could silently
# widen or narrow where the workload may run.
_ATOMIC: Final = frozenset({"nodeAffinity"})


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadUpsert:
    """Create the workload, or merge ``spec`` into the existing one."""

    namespace: str
    name: str
    spec: Mapping[str, Any]


def spec_of(req: GpuRequest) -> dict[str, Any]:
    """The workload spec (WorkloadProfile shape) holding a pod's resolved request."""
    percent = req.compute_percent_request
    return to_crd(
        ProfileSpec(
            resources=Resources(  # compute in the form it was asked: a percent is a share of each GPU
                tflops_request=req.tflops_request if percent is None else None,
                tflops_limit=req.tflops_limit if percent is None else None,
                percent_request=percent,
                percent_limit=req.compute_percent_limit,
                vram_request=req.vram_request,
                vram_limit=req.vram_limit,
            ),
            replicas=req.replicas,
            pool_name=req.pool,
            qos=req.qos,
            is_local_gpu=req.is_local_gpu,
            standalone_worker_mode=req.no_standalone_worker_mode,
            gpu_model=req.gpu_model,
            gpu_count=req.gpu_count,
            node_affinity=req.node_affinity,
            auto_scaling=req.auto_scaling,
        )
    )


def merge_spec(existing: Mapping[str, Any] | None, incoming: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``incoming`` over ``existing``: incoming values win, keys it lacks are kept."""
    merged: dict[str, Any] = dict(existing or {})
    for key, value in incoming.items():
        old = merged.get(key)
        if key not in _ATOMIC and isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = merge_spec(old, value)
        else:
            merged[key] = value
    return merged


def new_object(upsert: WorkloadUpsert) -> dict[str, Any]:
    """The TensorFusionWorkload to create when none exists yet."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_WORKLOAD,
        "metadata": {"name": upsert.name, "namespace": upsert.namespace, "labels": dict(MANAGED_BY)},
        "spec": dict(upsert.spec),
    }


def updated_object(existing: Mapping[str, Any], upsert: WorkloadUpsert) -> dict[str, Any] | None:
    """The existing workload with the pod's spec merged in, or None when nothing would change."""
    spec = existing.get("spec")
    merged = merge_spec(spec if isinstance(spec, Mapping) else None, upsert.spec)
    if merged == spec:
        return None
    return {**existing, "spec": merged}
