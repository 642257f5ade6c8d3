"""Which workloads the autoscaler looks after, read from the extender's cache: pure.

A workload is autoscaled while one of its live pods' resolved requests enables a layer (its profile's
``autoScalingConfig`` or the pod's ``auto-*`` annotations, merged by the webhook). Its config, requests and
controller are its newest pod's — after a rollout that changed the profile, the new pods speak for it.
Each placed pod brings its grants, with what its GPUs could hold for it: the GPU's TFLOPS, and its memory
with what the other pods there hold (the ledger's figure: each the larger of its VRAM request and limit), so
a raise never promises memory another pod may allocate. The decision is a proposal: the write is judged again
against the ledger under the cache's lock (``resize.py``), since a pod may be placed there in between.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler_extender.objects import OwnerRef, PodRecord
from vgpu.autoscale.config import AutoScalingConfig, parse
from vgpu.autoscale.evaluate import Grant, Member, Workload, WorkloadKey
from vgpu.errors import DomainError
from vgpu.scheduling.ledger import held_vram
from vgpu.scheduling.model import GpuState, NodeState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Autoscaled:
    """A workload to evaluate, and the controller of its newest pod (what an HPA would scale)."""

    workload: Workload
    owner: OwnerRef | None
    predictions: tuple[str, ...]  # layers whose prediction block is enabled: not implemented, said in status


def autoscaled(
    records: Iterable[PodRecord], nodes: Iterable[NodeState], *, max_replicas: int
) -> dict[WorkloadKey, Autoscaled]:
    """Every autoscaled workload's members, newest pod first deciding the config."""
    gpus: dict[str, GpuState] = {g.uuid: g for n in nodes for g in n.gpus}
    groups: dict[WorkloadKey, list[PodRecord]] = {}
    for r in records:
        if r.auto is None or r.workload is None or r.terminal or r.deleting:
            continue
        groups.setdefault((r.ref.namespace, r.workload), []).append(r)
    out: dict[WorkloadKey, Autoscaled] = {}
    for (namespace, name), pods in groups.items():
        pods.sort(key=lambda r: (r.auto.created if r.auto else "", r.ref.name), reverse=True)
        newest = pods[0].auto
        assert newest is not None
        config = _config(newest.request.auto_scaling, f"{namespace}/{name}")
        if config is None:
            continue
        req = newest.request
        members = tuple(_member(r, gpus) for r in pods)
        predictions = tuple(
            layer
            for layer, on in (
                ("autoSetLimits", config.limits.prediction.enable),
                ("autoSetRequests", config.requests.prediction.enable),
            )
            if on
        )
        workload = Workload(
            namespace=namespace,
            name=name,
            config=config,
            members=members,
            tflops_request=req.tflops_request,
            tflops_limit=req.tflops_limit,
            vram_request=req.vram_request,
            vram_limit=req.vram_limit,
            gpu_count=req.gpu_count,
            replicas=len(members),
            min_replicas=max(1, req.replicas or 1),
            max_replicas=max(max_replicas, req.replicas or 1),
        )
        out[(namespace, name)] = Autoscaled(workload, newest.owner, predictions)
    return out


def _config(raw: Mapping[str, object], where: str) -> AutoScalingConfig | None:
    try:
        return parse(dict(raw), where=f"{where} autoScalingConfig")
    except DomainError as exc:  # admitted before strict checking existed: left alone, said once per pass
        log.warning("workload %s: autoscaling config not usable: %s", where, exc)
        return None


def _member(r: PodRecord, gpus: Mapping[str, GpuState]) -> Member:
    assert r.auto is not None
    grants: tuple[Grant, ...] = ()
    if r.allocation is not None and r.node_name is not None:
        grants = tuple(
            Grant(
                gpu=g.uuid,
                tflops_request=g.tflops_request,
                tflops_limit=g.tflops_limit,
                vram_request=g.vram_request,
                vram_limit=g.vram_limit,
                tflops_capacity=g.gpu_tflops,
                vram_capacity=_vram_capacity(gpus.get(g.uuid), held_vram(g)),
                vram_others=_vram_others(gpus.get(g.uuid), held_vram(g)),
            )
            for g in r.allocation.gpus
        )
    return Member(
        uid=r.ref.uid,
        name=r.ref.name,
        grants=grants,
        admitted_tflops_limit=r.auto.request.tflops_limit,
        admitted_vram_limit=r.auto.request.vram_limit,
    )


def _vram_capacity(gpu: GpuState | None, own: int) -> int:
    """The GPU's memory; unknown GPU (gone from the inventory): what the pod holds, so nothing is raised."""
    return own if gpu is None else gpu.vram


def _vram_others(gpu: GpuState | None, own: int) -> int:
    """What the GPU's other pods hold there: the ledger's VRAM held on it (each pod's larger of request and
    limit) less the pod's own ``own``."""
    return 0 if gpu is None else max(gpu.vram_used - own, 0)
