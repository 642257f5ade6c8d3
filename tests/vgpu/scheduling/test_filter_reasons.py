"""Every rejection reason of the filter: its code, its kube-scheduler style message, and its map."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.vgpu.scheduling.builders import (
    CATALOG,
    T4,
    expr,
    make_demand,
    make_gpu,
    make_node,
    make_snapshot,
    required,
)
from vgpu.names import IsolationMode
from vgpu.scheduling.filter import filter_nodes
from vgpu.scheduling.model import Demand, NodeState
from vgpu.scheduling.reasons import ReasonCode

R = ReasonCode


@dataclass(frozen=True)
class Case:
    id: str
    node: NodeState | None
    demand: Demand
    code: ReasonCode
    message: str


CASES = [
    Case(
        "unknown node",
        None,
        make_demand(),
        R.UNKNOWN_NODE,
        "node unknown to the GPU extender (no GPU inventory seen for it)",
    ),
    Case(
        "corrupt inventory",
        make_node(inventory_error="gpus[0].vram: not a quantity"),
        make_demand(),
        R.INVENTORY_ERROR,
        "GPU inventory unreadable: gpus[0].vram: not a quantity",
    ),
    Case(
        "other pool",
        make_node(pool="pool-a"),
        make_demand(pool="pool-b"),
        R.POOL_MISMATCH,
        "node is in GPU pool pool-a, pod asks for pool pool-b",
    ),
    Case(
        "node affinity",
        make_node(labels={"zone": "b"}),
        make_demand(node_affinity=required([expr("zone", "In", "a")])),
        R.NODE_AFFINITY,
        "node didn't match the pod's node affinity",
    ),
    Case("no GPUs", make_node(gpus=[]), make_demand(), R.NO_GPUS, "node has no GPUs"),
    Case(
        "isolation not served",
        make_node(isolation=(IsolationMode.SHARED, IsolationMode.SOFT)),
        make_demand(isolation=IsolationMode.HARD),
        R.ISOLATION,
        "no GPU on node serves isolation hard (its GPUs serve shared, soft)",
    ),
    Case(
        "pinned index absent",
        make_node(n_gpus=2),
        make_demand(gpu_indices=(3,)),
        R.GPU_INDICES,
        "node has no GPU 3 serving the pod (its GPUs: 0,1)",
    ),
    Case(
        "wrong model",
        make_node(model=T4, tflops="65", vram="16Gi"),
        make_demand(model="A100"),
        R.GPU_MODEL,
        "no A100 GPU on node (it has T4)",
    ),
    Case(
        "too few healthy GPUs",
        make_node(gpus=[make_gpu("GPU-a", healthy=False), make_gpu("GPU-b", index=1)]),
        make_demand(count=2),
        R.TOO_FEW_GPUS,
        "node has 1 healthy A100-SXM4-80GB GPUs of 2, pod needs 2",
    ),
    Case(
        "GPU VRAM too small",
        make_node(model=T4, tflops="65", vram="16Gi"),
        make_demand(vram="20Gi"),
        R.GPU_TOO_SMALL,
        "GPU-n1-0 has 16Gi VRAM in all, pod requests 20Gi per GPU",
    ),
    Case(
        "GPU TFLOPS too small",
        make_node(),
        make_demand(tflops="400"),
        R.GPU_TOO_SMALL,
        "GPU-n1-0 has 312 TFLOPS in all, pod requests 400 per GPU",
    ),
    Case(
        "insufficient VRAM",
        make_node(vram_used="78Gi"),
        make_demand(vram="4Gi"),
        R.INSUFFICIENT_VRAM,
        "insufficient VRAM on GPU-n1-0: requested 4Gi, free 2Gi",
    ),
    Case(
        "insufficient TFLOPS",
        make_node(tflops_used="305"),
        make_demand(tflops="10"),
        R.INSUFFICIENT_TFLOPS,
        "insufficient TFLOPS on GPU-n1-0: requested 10, free 7",
    ),
    Case(
        "insufficient VRAM on the second of two GPUs",
        make_node(gpus=[make_gpu("GPU-a"), make_gpu("GPU-b", index=1, vram_used="78Gi")]),
        make_demand(count=2),
        R.INSUFFICIENT_VRAM,
        "insufficient VRAM on GPU-b: requested 4Gi, free 2Gi (pod needs 2 GPUs, only 1 with enough)",
    ),
    Case(
        "each resource free somewhere, never both on enough GPUs",
        make_node(
            gpus=[
                make_gpu("GPU-a", tflops_used="310"),
                make_gpu("GPU-b", index=1),
                make_gpu("GPU-c", index=2, vram_used="79Gi"),
            ]
        ),
        make_demand(count=2),
        R.INSUFFICIENT_GPUS,
        "only 1 of 3 A100-SXM4-80GB GPUs have both 10 TFLOPS and 4Gi VRAM free, pod needs 2",
    ),
    Case(
        "whole GPUs busy",
        make_node(gpus=[make_gpu("GPU-a"), make_gpu("GPU-b", index=1, vram_used="1Gi")]),
        make_demand(count=2, whole_gpu=True),
        R.WHOLE_GPU_BUSY,
        "only 1 of 2 A100-SXM4-80GB GPUs idle, pod needs 2 whole GPUs",
    ),
    Case(
        "room only on a GPU held whole",
        make_node(gpus=[make_gpu("GPU-a", whole=True, pods=1)]),
        make_demand(),
        R.GPU_HELD_WHOLE,
        "1 of 1 A100-SXM4-80GB GPUs held whole by other pods, pod needs 1 shared GPUs",
    ),
    Case(
        "every vGPU slot of the node held",
        make_node(n_gpus=2, slots_used=16),  # 16 on each GPU
        make_demand(),
        R.INSUFFICIENT_SLOTS,
        "insufficient tensor-fusion.ai/vgpu slots on node n1: requested 1, free 0 of 32",
    ),
    Case(
        "the GPU with room has no slot, the one with a slot no room",
        make_node(gpus=[make_gpu("GPU-a", slots_used=16), make_gpu("GPU-b", index=1, vram_used="78Gi")]),
        make_demand(),
        R.INSUFFICIENT_SLOTS,
        "insufficient tensor-fusion.ai/vgpu slots on GPU-a: requested 1, free 0 of 16",
    ),
    Case(
        "insufficient cpu",
        make_node(cpu_free=1000),
        make_demand(cpu=2000),
        R.INSUFFICIENT_CPU,
        "insufficient cpu: requested 2000m, free 1000m",
    ),
    Case(
        "insufficient memory",
        make_node(memory_free="4Gi"),
        make_demand(memory="8Gi"),
        R.INSUFFICIENT_MEMORY,
        "insufficient memory: requested 8Gi, free 4Gi",
    ),
    Case(
        "percent over GPUs of two sizes",
        make_node(gpus=[make_gpu("GPU-a", index=0), make_gpu("GPU-b", index=1, model=T4, tflops="65", vram="16Gi")]),
        make_demand(percent=50_000),
        R.GPU_SIZES_DIFFER,
        "the node's GPUs differ in size (65, 312 TFLOPS) and the pod asks for compute in percent of a GPU, "
        "which would differ between them; pin tensor-fusion.ai/gpu-model, or ask in TFLOPS",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_rejection_carries_its_code_message_and_map(case: Case) -> None:
    snapshot = make_snapshot() if case.node is None else make_snapshot(case.node)
    name = "n1" if case.node is None else case.node.name
    result = filter_nodes(case.demand, snapshot, [name], CATALOG)
    assert result.passed == ()
    reason = result.reasons()[name]
    assert (reason.code, reason.message) == (case.code, case.message)
    wire = result.unresolvable_messages() if reason.unresolvable else result.failed_messages()
    other = result.failed_messages() if reason.unresolvable else result.unresolvable_messages()
    assert wire == {name: case.message} and other == {}


def test_every_filter_code_is_covered_by_the_table() -> None:
    ledger_codes = {R.OVER_COMMIT, R.UNKNOWN_GPU, R.INVALID_GRANT, R.WHOLE_CONFLICT, R.POD_EXISTS, R.UNKNOWN_POD}
    assert {c.code for c in CASES} == set(ReasonCode) - ledger_codes


@pytest.mark.parametrize(
    ("code", "unresolvable"),
    [
        (R.GPU_MODEL, True),
        (R.ISOLATION, True),
        (R.GPU_INDICES, True),
        (R.GPU_SIZES_DIFFER, True),
        (R.POOL_MISMATCH, True),
        (R.NODE_AFFINITY, True),
        (R.TOO_FEW_GPUS, True),
        (R.GPU_TOO_SMALL, True),
        (R.INSUFFICIENT_VRAM, False),
        (R.INSUFFICIENT_TFLOPS, False),
        (R.WHOLE_GPU_BUSY, False),
        (R.GPU_HELD_WHOLE, False),
        (R.INSUFFICIENT_SLOTS, False),
    ],
)
def test_preemption_can_only_help_capacity_misfits(code: ReasonCode, unresolvable: bool) -> None:
    case = next(c for c in CASES if c.code is code)
    snapshot = make_snapshot(case.node) if case.node else make_snapshot()
    result = filter_nodes(case.demand, snapshot, ["n1"], CATALOG)
    assert ("n1" in result.unresolvable) is unresolvable
    assert ("n1" in result.failed) is not unresolvable
