"""A compute-percent demand meets a node: its share in TFLOPS of that node's GPUs.

A percent (``compute-percent-request: 50``) means the same share of every GPU, so a Demand carries it
unconverted, and each decision over one node converts it first, here, into the TFLOPS of the GPUs it
may have there (:func:`on_node`). Everything after that — the fit, the policy's score and choice of
GPUs, the grant, the preemption's victims — reads plain TFLOPS, as for any pod, and a 50 % pod is
compared across an A100 node and an L4 node as the half of each it would hold, never as 156 TFLOPS
against 121.

The GPUs a percent pod may have on one node must be of one size (TFLOPS), or its per-GPU share would
differ between its own GPUs; a node where they are not is rejected with a reason that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from vgpu import compute_percent
from vgpu.quantity import humanize_tflops
from vgpu.scheduling.model import Demand, NodeState
from vgpu.scheduling.reasons import Reason, ReasonCode

Eligible = Callable[[str], bool] | None  # a model test on a GPU's product name (fit.ModelMatcher); None: any


def sizes(node: NodeState, eligible: Eligible = None) -> frozenset[int]:
    """The distinct TFLOPS (milli) of the node's healthy GPUs of an eligible model."""
    return frozenset(g.tflops for g in node.gpus if g.healthy and (eligible is None or eligible(g.model)))


def on_node(demand: Demand, node: NodeState, eligible: Eligible = None) -> Demand:
    """The demand in TFLOPS of this node's GPUs (their one size); any other demand, or a node whose eligible
    GPUs are not of one size (rejected by :func:`mixed_sizes`), as it is."""
    percent, limit = demand.compute_percent, demand.compute_percent_limit
    if percent is None or limit is None:
        return demand
    found = sizes(node, eligible)
    if len(found) != 1:
        return demand
    (size,) = found
    tflops, tflops_limit = compute_percent.tflops_on(percent, size), compute_percent.tflops_on(limit, size)
    if (tflops, tflops_limit) == (demand.tflops, demand.tflops_limit):
        return demand
    return replace(demand, tflops=tflops, tflops_limit=tflops_limit)


def mixed_sizes(demand: Demand, node: NodeState, eligible: Eligible = None) -> Reason | None:
    """Why a percent demand cannot go to a node whose eligible GPUs differ in size; None otherwise."""
    if demand.compute_percent is None:
        return None
    found = sorted(sizes(node, eligible))
    if len(found) < 2:
        return None
    shown = ", ".join(humanize_tflops(t) for t in found)
    return Reason(
        code=ReasonCode.GPU_SIZES_DIFFER,
        message=(
            f"the node's GPUs differ in size ({shown} TFLOPS) and the pod asks for compute in percent of a GPU, "
            "which would differ between them; pin tensor-fusion.ai/gpu-model, or ask in TFLOPS"
        ),
        values=tuple(humanize_tflops(t) for t in found),
    )
