"""Placement: the GPUs of the chosen node a pod gets, as the grants the allocation contract records.

kube-scheduler decides the node; which GPUs on it is ours (the extender binds). The policy picks
the GPUs, this module re-checks the node in full (the snapshot may have moved since filter) and
turns the choice into :class:`vgpu.contract.allocation.GpuGrant`s — the exact values the ledger
reserves and the device plugin enforces, so the three can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpu import mig
from vgpu.catalog import Catalog
from vgpu.contract.allocation import GpuGrant
from vgpu.scheduling.compute_share import on_node
from vgpu.scheduling.fit import ModelMatcher, check_node, eligible_node, gpu_fits
from vgpu.scheduling.model import Demand, GpuState, NodeState
from vgpu.scheduling.policy import Policy


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where one pod goes: its node, its GPUs (as seen before placing) and the grants on them; ``demand`` is
    the pod's as placed there (a compute percent in TFLOPS of those GPUs: what the policy observes)."""

    pod_key: str
    node: str
    gpus: tuple[GpuState, ...]
    grants: tuple[GpuGrant, ...]
    whole: bool
    demand: Demand


def grants_for(demand: Demand, gpus: tuple[GpuState, ...]) -> tuple[GpuGrant, ...]:
    """The grants for a demand on these GPUs. A whole-GPU demand reserves each GPU's full capacity, and
    so does any demand on a MIG unit: a unit goes to one pod whole (vgpu.mig), its limits are its size."""
    return tuple(_grant(demand, g) for g in gpus)


def _grant(demand: Demand, g: GpuState) -> GpuGrant:
    if mig.split_product(g.model) is not None:
        t_request = t_limit = g.tflops
        v_request = v_limit = g.vram
    elif demand.whole_gpu:
        t_request, t_limit = g.tflops, max(g.tflops, demand.tflops_limit)
        v_request, v_limit = g.vram, max(g.vram, demand.vram_limit)
    else:
        t_request, t_limit, v_request, v_limit = demand.tflops, demand.tflops_limit, demand.vram, demand.vram_limit
    return GpuGrant(
        uuid=g.uuid,
        index=g.index,
        tflops_request=t_request,
        tflops_limit=t_limit,
        vram_request=v_request,
        vram_limit=v_limit,
        gpu_tflops=g.tflops,
    )


def place(demand: Demand, node: NodeState, policy: Policy, catalog: Catalog) -> Placement | None:
    """Choose the pod's GPUs on this node with the policy; None when the node cannot take it now.

    Does not call ``policy.observe``: do that once the placement is committed.
    """
    match = ModelMatcher(catalog, demand.gpu_model)
    if check_node(demand, node, match) is not None:
        return None
    view = eligible_node(demand, node, match)
    demand = on_node(demand, view)
    gpus = policy.choose_gpus(demand, view)
    chosen = {g.uuid for g in gpus}
    allowed = {g.uuid for g in view.gpus}
    # A policy is a plug-in: never trust it to return gpu_count distinct, eligible, fitting GPUs.
    if len(gpus) != demand.gpu_count or len(chosen) != len(gpus) or not chosen <= allowed:
        return None
    if not all(gpu_fits(demand, g) for g in gpus):
        return None
    return Placement(
        pod_key=demand.pod_key,
        node=node.name,
        gpus=gpus,
        grants=grants_for(demand, gpus),
        whole=demand.whole_gpu,
        demand=demand,
    )
