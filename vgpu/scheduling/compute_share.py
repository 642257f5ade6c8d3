"""A compute-percent demand meets a node: its share in TFLOPS of that node's GPUs.

A percent (``compute-percent-request: 50``) means the same share of every GPU, so a Demand carries it
unconverted, and each decision over one node converts it first, here, into the TFLOPS of the GPUs it
may have there (:func:`share_on`). Everything after that — the fit, the policy's score and choice of
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


def share_on(demand: Demand, node: NodeState, eligible: Eligible = None) -> Demand | Reason:
    """The demand in TFLOPS of this node's eligible GPUs (their one size), or why a percent demand cannot go
    there: those GPUs differ in size. Any other demand, and a node with no eligible GPU, as it is."""
    percent, limit = demand.compute_percent, demand.compute_percent_limit
    if percent is None or limit is None:
        return demand
    found = sorted(sizes(node, eligible))
    if len(found) > 1:
        shown = ", ".join(humanize_tflops(t) for t in found)
        return Reason(
            code=ReasonCode.GPU_SIZES_DIFFER,
            message=(
                f"the node's GPUs differ in size ({shown} TFLOPS) and the pod asks for compute in percent of a GPU, "
                "which would differ between them; pin tensor-fusion.ai/gpu-model, or ask in TFLOPS"
            ),
            values=tuple(humanize_tflops(t) for t in found),
        )
    if not found:
        return demand
    tflops, tflops_limit = compute_percent.tflops_on(percent, found[0]), compute_percent.tflops_on(limit, found[0])
    if (tflops, tflops_limit) == (demand.tflops, demand.tflops_limit):
        return demand
    return replace(demand, tflops=tflops, tflops_limit=tflops_limit)


def on_node(demand: Demand, node: NodeState, eligible: Eligible = None) -> Demand:
    """:func:`share_on` where the node is known to take the demand (its reason is the fit check's to give)."""
    share = share_on(demand, node, eligible)
    return demand if isinstance(share, Reason) else share
