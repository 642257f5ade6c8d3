"""Which nodes pass the filter: the per-GPU fit rules, one node per pod, and the shape of the result."""

from __future__ import annotations

from dataclasses import replace

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
from vgpu.quantity import parse_bytes
from vgpu.scheduling.filter import filter_nodes
from vgpu.scheduling.fit import eligible_node, fits, fitting_gpus
from vgpu.scheduling.model import Demand, NodeState
from vgpu.scheduling.reasons import ReasonCode


def passes(demand: Demand, node: NodeState) -> bool:
    result = filter_nodes(demand, make_snapshot(node), [node.name], CATALOG)
    return result.passed == (node.name,)


@pytest.mark.parametrize(
    ("demand", "node", "expected"),
    [
        pytest.param(make_demand(vram="2Gi"), make_node(vram_used="78Gi"), True, id="free VRAM exactly the request"),
        pytest.param(make_demand(tflops="7"), make_node(tflops_used="305"), True, id="free TFLOPS exactly the request"),
        pytest.param(make_demand(vram="2049Mi"), make_node(vram_used="78Gi"), False, id="one MiB over"),
        pytest.param(make_demand(count=4), make_node(n_gpus=4), True, id="four GPUs on one node"),
        pytest.param(make_demand(count=5), make_node(n_gpus=4), False, id="five GPUs on a four-GPU node"),
        pytest.param(make_demand(model="A100"), make_node(), True, id="A100 matches the NVML name"),
        pytest.param(make_demand(model="a100-80gb"), make_node(), True, id="model spelled loosely"),
        pytest.param(make_demand(model="A10"), make_node(), False, id="A10 is not an A100"),
        pytest.param(make_demand(pool=None), make_node(pool="any"), True, id="no pool asked: any pool"),
        pytest.param(make_demand(pool="p"), make_node(pool="p"), True, id="same pool"),
        pytest.param(make_demand(whole_gpu=True), make_node(), True, id="whole GPU on an idle GPU"),
        pytest.param(make_demand(whole_gpu=True), make_node(vram_used="1Mi"), False, id="whole GPU on a shared GPU"),
        pytest.param(make_demand(cpu=1000), make_node(cpu_free=1000), True, id="cpu exactly free"),
        pytest.param(make_demand(cpu=10**6), make_node(), True, id="cpu unchecked when the node publishes none"),
        pytest.param(
            make_demand(node_affinity=required([expr("zone", "In", "a")])),
            make_node(labels={"zone": "a"}),
            True,
            id="node affinity matches",
        ),
    ],
)
def test_fit_rules(demand: Demand, node: NodeState, expected: bool) -> None:
    assert passes(demand, node) is expected


def test_a_tflops_limit_is_not_reserved_but_a_vram_limit_is_held() -> None:
    node = make_node(vram_used="40Gi", tflops_used="300")
    # Compute is shared by time: a TFLOPS limit far above what is free does not stop the pod.
    assert passes(replace(make_demand(tflops="10", vram="4Gi"), tflops_limit=300_000), node)
    # Memory is not: the pod may allocate up to its VRAM limit, so the limit must be free, not just the request.
    assert passes(replace(make_demand(tflops="10", vram="4Gi"), vram_limit=parse_bytes("40Gi")), node)
    held = replace(make_demand(tflops="10", vram="4Gi"), vram_limit=parse_bytes("40Gi") + 1)
    assert not passes(held, node)
    (reason,) = filter_nodes(held, make_snapshot(node), [node.name], CATALOG).failed.values()
    assert reason.code is ReasonCode.INSUFFICIENT_VRAM and reason.requested == parse_bytes("40Gi") + 1
    assert "(its VRAM limit, which a pod holds)" in reason.message


def test_unhealthy_gpus_never_count() -> None:
    node = make_node(gpus=[make_gpu("GPU-a", healthy=False), make_gpu("GPU-b", index=1), make_gpu("GPU-c", index=2)])
    assert passes(make_demand(count=2), node)
    assert not passes(make_demand(count=3), node)
    assert [g.uuid for g in fitting_gpus(make_demand(), node)] == ["GPU-b", "GPU-c"]


def test_all_gpus_of_a_pod_must_be_on_one_node() -> None:
    a, b = make_node("a"), make_node("b")
    result = filter_nodes(make_demand(count=2), make_snapshot(a, b), ["a", "b"], CATALOG)
    assert result.passed == ()
    assert {r.code for r in result.reasons().values()} == {ReasonCode.TOO_FEW_GPUS}


def test_fractional_pods_share_a_gpu_but_never_one_held_whole() -> None:
    shared = make_node("shared", tflops_used="100", vram_used="20Gi", pods=3)
    held = make_node("held", gpus=[make_gpu("GPU-h", tflops_used="0", vram_used="0", pods=1, whole=True)])
    result = filter_nodes(make_demand(), make_snapshot(shared, held), ["shared", "held"], CATALOG)
    assert result.passed == ("shared",)
    assert result.failed["held"].code is ReasonCode.GPU_HELD_WHOLE


def test_passed_keeps_offer_order_and_judges_a_repeated_name_once() -> None:
    nodes = [make_node(n) for n in ("c", "a", "b")]
    result = filter_nodes(make_demand(), make_snapshot(*nodes), ["c", "a", "c", "b", "ghost"], CATALOG)
    assert result.passed == ("c", "a", "b")
    assert list(result.unresolvable) == ["ghost"]
    assert result.total == 4


def test_unresolvable_reason_wins_over_a_capacity_one() -> None:
    # Full AND in the wrong pool: preemption could free the GPU but the pool would still be wrong.
    node = make_node(pool="other", vram_used="80Gi")
    result = filter_nodes(make_demand(pool="default-pool"), make_snapshot(node), ["n1"], CATALOG)
    assert result.unresolvable["n1"].code is ReasonCode.POOL_MISMATCH


def test_eligible_view_drops_unhealthy_and_other_models_and_reuses_clean_nodes() -> None:
    mixed = make_node(
        gpus=[
            make_gpu("GPU-a"),
            make_gpu("GPU-t4", index=1, model=T4, tflops="65", vram="16Gi"),
            make_gpu("GPU-sick", index=2, healthy=False),
        ]
    )
    view = eligible_node(make_demand(model="A100"), mixed, CATALOG)
    assert [g.uuid for g in view.gpus] == ["GPU-a"]
    clean = make_node(n_gpus=2)
    assert eligible_node(make_demand(model="A100"), clean, CATALOG) is clean
    assert fits(make_demand(count=2), clean) and not fits(make_demand(count=2), view)
