"""vGPU slots (the device IDs the plugin advertises) as a fit constraint: filter, reasons, ledger, preemption.

Two rules, both the core's: no GPU holds more of a pod's containers than its slices (the issue's
"one GPU held 20 pods" on 16 slices), and a node's healthy GPUs must have the pod's device IDs free
in all beyond what its pods hold — what the kubelet checks, ignoring which GPU an ID names; a pod
that passes the filter is one the kubelet admits.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vgpu.scheduling.builders import CATALOG, make_demand, make_gpu, make_node, make_snapshot
from vgpu.contract.allocation import GpuGrant
from vgpu.names import Qos
from vgpu.request import GpuRequest
from vgpu.scheduling.demand import demand_from_request, gpu_slots
from vgpu.scheduling.filter import filter_nodes
from vgpu.scheduling.ledger import Ledger, LedgerRefusal
from vgpu.scheduling.model import Demand, GpuState, NodeState
from vgpu.scheduling.placement import place
from vgpu.scheduling.policy import REGISTRY
from vgpu.scheduling.preempt import Victim, select_victims
from vgpu.scheduling.reasons import ReasonCode
from vgpu.scheduling.replay import replay
from vgpu.scheduling.summary import summarize

R = ReasonCode


def verdict(demand: Demand, node: NodeState) -> tuple[ReasonCode, str] | None:
    reason = filter_nodes(demand, make_snapshot(node), [node.name], CATALOG).reasons().get(node.name)
    return None if reason is None else (reason.code, reason.message)


@dataclass(frozen=True)
class Case:
    id: str
    node: NodeState
    demand: Demand
    expected: tuple[ReasonCode, str] | None  # None: the node passes


def gpus(*used: int, slots: int = 16, vram_used: str = "0") -> list[GpuState]:
    """GPUs GPU-0, GPU-1, … with ``slots`` slices each, of which ``used`` are held."""
    return [make_gpu(f"GPU-{i}", index=i, slots=slots, slots_used=u, vram_used=vram_used) for i, u in enumerate(used)]


SLOTS = "tensor-fusion.ai/vgpu slots"
CASES = [
    Case("a free slot on the GPU", make_node(gpus=gpus(15)), make_demand(), None),
    Case(
        "16 pods on a 16-slice GPU: a 17th is refused",
        make_node(gpus=gpus(16)),
        make_demand(),
        (R.INSUFFICIENT_SLOTS, f"insufficient {SLOTS} on node n1: requested 1, free 0 of 16"),
    ),
    Case(
        "the node's last free slots are on the GPU without room",
        make_node(gpus=[make_gpu("GPU-0", slots_used=16), make_gpu("GPU-1", index=1, tflops_used="312")]),
        make_demand(),
        (R.INSUFFICIENT_SLOTS, f"insufficient {SLOTS} on GPU-0: requested 1, free 0 of 16"),
    ),
    Case("two containers fit a GPU with two free", make_node(gpus=gpus(14)), make_demand(slots=2), None),
    Case(
        "two containers on a GPU with one free",
        make_node(gpus=[*gpus(15), make_gpu("GPU-1", index=1, vram_used="80Gi")]),
        make_demand(slots=2),
        (R.INSUFFICIENT_SLOTS, f"insufficient {SLOTS} on GPU-0: requested 2, free 1 of 16"),
    ),
    Case(
        "a two-GPU pod: the second GPU has no slot",
        make_node(gpus=gpus(0, 16, 16)),
        make_demand(count=2),
        (
            R.INSUFFICIENT_SLOTS,
            f"insufficient {SLOTS} on GPU-1: requested 1, free 0 of 16 (pod needs 2 GPUs, only 1 with enough)",
        ),
    ),
    Case(
        "slots held on an unhealthy GPU count against the node's healthy ones (the kubelet's total)",
        make_node(gpus=[make_gpu("GPU-0", slots=4), make_gpu("GPU-1", index=1, slots=4, slots_used=4, healthy=False)]),
        make_demand(),
        (R.INSUFFICIENT_SLOTS, f"insufficient {SLOTS} on node n1: requested 1, free 0 of 4"),
    ),
    Case(
        "a pod on a GPU gone from the inventory still holds its IDs",
        make_node(gpus=gpus(0, slots=2), node_slots_used=2),
        make_demand(),
        (R.INSUFFICIENT_SLOTS, f"insufficient {SLOTS} on node n1: requested 1, free 0 of 2"),
    ),
    Case(
        "a two-GPU pod needs its IDs on the node in all",
        make_node(gpus=gpus(0, 0, slots=2), node_slots_used=3),
        make_demand(count=2),
        (R.INSUFFICIENT_SLOTS, f"insufficient {SLOTS} on node n1: requested 2, free 1 of 4"),
    ),
    Case(
        "a whole-GPU pod on an idle GPU with fewer slices than its containers",
        make_node(gpus=gpus(0, slots=1)),
        make_demand(whole_gpu=True, slots=2),
        (R.INSUFFICIENT_SLOTS, f"insufficient {SLOTS} on node n1: requested 2, free 1 of 1"),
    ),
    Case("a pod holding no IDs needs no slot", make_node(gpus=gpus(16)), make_demand(slots=0), None),
    Case(
        "VRAM is reported before slots when both are short",
        make_node(gpus=gpus(16, vram_used="78Gi")),
        make_demand(),
        (R.INSUFFICIENT_VRAM, "insufficient VRAM on GPU-0: requested 4Gi, free 2Gi"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_slot_rules_and_reasons(case: Case) -> None:
    assert verdict(case.demand, case.node) == case.expected


def test_out_of_slots_is_a_capacity_reason_that_preemption_may_fix() -> None:
    node = make_node(gpus=gpus(16))
    result = filter_nodes(make_demand(), make_snapshot(node), ["n1"], CATALOG)
    assert "n1" in result.failed and not result.unresolvable
    assert summarize(make_demand(), result) == f"0/1 nodes: 1 insufficient {SLOTS} (need 1, most free 0)"


def test_placement_takes_only_gpus_with_a_free_slot() -> None:
    node = make_node(gpus=[make_gpu("GPU-0", slots_used=16), make_gpu("GPU-1", index=1, vram_used="70Gi")])
    for name in REGISTRY.names():
        placement = place(make_demand(), node, REGISTRY.create(name), CATALOG)
        assert placement is not None and [g.uuid for g in placement.gpus] == ["GPU-1"], name


@pytest.mark.parametrize(
    ("device_ids", "containers", "count", "expected"),
    [(1, 1, 1, 1), (4, 2, 2, 2), (3, 1, 2, 2), (0, 1, 1, 0), (None, 3, 2, 3), (2, 1, 0, 0)],
    ids=["one", "two containers of two GPUs", "rounded up", "no IDs", "before the webhook", "no GPUs"],
)
def test_slots_per_gpu_from_the_pods_device_ids(
    device_ids: int | None, containers: int, count: int, expected: int
) -> None:
    assert gpu_slots(device_ids, containers=containers, gpu_count=count) == expected


def test_the_demand_carries_the_specs_slots_else_the_webhooks() -> None:
    request = GpuRequest(
        pool="p",
        containers=("a", "b"),
        gpu_count=2,
        tflops_request=1,
        tflops_limit=1,
        vram_request=1,
        vram_limit=1,
        qos=Qos.MEDIUM,
    )
    assert demand_from_request(request, pod_key="ns/p", device_ids=6).slots == 3
    assert demand_from_request(request, pod_key="ns/p").slots == 2


# --- the ledger ------------------------------------------------------------------------------------
NODE = make_node("n1", gpus=gpus(0, 0, slots=2))


def grant(uuid: str) -> GpuGrant:
    return GpuGrant(
        uuid=uuid, index=0, tflops_request=1, tflops_limit=1, vram_request=1, vram_limit=1, gpu_tflops=312_000
    )


def test_the_ledger_refuses_a_gpus_slots_past_its_slices_and_changes_nothing() -> None:
    ledger = Ledger().reserve("ns/a", NODE, [grant("GPU-0")], None, slots=2)
    with pytest.raises(LedgerRefusal) as caught:
        ledger.reserve("ns/b", NODE, [grant("GPU-1"), grant("GPU-0")], None)
    reason = caught.value.reason
    assert (reason.code, reason.requested, reason.free) == (R.OVER_COMMIT, 1, 0)
    assert reason.message == f"ns/b would over-commit {SLOTS} on GPU-0: requested 1, free 0 of 2"
    assert ledger.entry("ns/b") is None and ledger.usage("GPU-1").slots == 0 and ledger.node_slots("n1") == 2


def test_the_ledger_keeps_each_gpus_and_the_nodes_slots_and_gives_them_back() -> None:
    ledger = Ledger().reserve("ns/a", NODE, [grant("GPU-0"), grant("GPU-1")], None, slots=1)
    ledger = ledger.reserve("ns/b", NODE, [grant("GPU-1")], 5.0, slots=1)
    view = ledger.apply_node(NODE)
    assert [g.slots_used for g in view.gpus] == [1, 2] and view.slots_used == 3
    assert verdict(make_demand(), view) is None  # GPU-0's second slot, the node's fourth
    short = verdict(make_demand(count=2), view)
    assert short == (R.INSUFFICIENT_SLOTS, f"insufficient {SLOTS} on node n1: requested 2, free 1 of 4")
    after = ledger.expire(5.0).release("ns/a")
    assert after.node_slots("n1") == 0 and after.apply_node(NODE) is NODE


def test_an_allocation_already_written_counts_past_the_slices_and_leaves_no_room() -> None:
    ledger = Ledger().reserve("ns/old1", NODE, [grant("GPU-0")], None, slots=2)
    ledger = ledger.reserve("ns/old2", NODE, [grant("GPU-0")], None, slots=1, past_slices=True)
    view = ledger.apply_node(NODE)
    assert view.gpus[0].slots_used == 3 and view.slots_used == 3
    placement = place(make_demand(), view, REGISTRY.create("binpack"), CATALOG)
    assert placement is not None and [g.uuid for g in placement.gpus] == ["GPU-1"]  # never the over-full GPU-0
    assert verdict(make_demand(count=2), view) == (
        R.INSUFFICIENT_SLOTS,
        f"insufficient {SLOTS} on node n1: requested 2, free 1 of 4",
    )


def test_the_nodes_count_survives_its_gpu_leaving_the_inventory() -> None:
    ledger = Ledger().reserve("ns/a", NODE, [grant("GPU-1")], None, slots=2)
    shrunk = make_node("n1", gpus=gpus(0, slots=2))
    view = ledger.apply_node(shrunk)
    assert view.slots_used == 2 and view.gpus[0].slots_used == 0
    assert verdict(make_demand(), view) == (
        R.INSUFFICIENT_SLOTS,
        f"insufficient {SLOTS} on node n1: requested 1, free 0 of 2",
    )


# --- preemption ----------------------------------------------------------------------------------------
def victim(key: str, uuid: str, qos: Qos = Qos.LOW) -> Victim:
    return Victim(pod_key=key, qos=qos, grants=(grant(uuid),), slots=1)


def loaded(node: NodeState, *victims: Victim) -> NodeState:
    ledger = Ledger()
    for v in victims:
        ledger = ledger.reserve(v.pod_key, node, v.grants, None, qos=v.qos, slots=v.slots)
    return ledger.apply_node(node)


def test_preemption_frees_slots_on_the_gpu() -> None:
    node = make_node(gpus=gpus(0, slots=2))
    victims = [victim("ns/low", "GPU-0"), victim("ns/med", "GPU-0", Qos.MEDIUM)]
    assert select_victims(make_demand(qos=Qos.HIGH), loaded(node, *victims), victims, CATALOG) == ("ns/low",)


def test_preemption_may_free_the_nodes_ids_held_on_a_gpu_the_pod_cannot_use() -> None:
    node = make_node(gpus=[make_gpu("GPU-0", slots=1), make_gpu("GPU-1", index=1, slots=1, healthy=False)])
    on_sick = victim("ns/on-sick", "GPU-1")
    loaded_node = loaded(node, on_sick)
    assert verdict(make_demand(), loaded_node) == (
        R.INSUFFICIENT_SLOTS,
        f"insufficient {SLOTS} on node n1: requested 1, free 0 of 1",
    )
    assert select_victims(make_demand(qos=Qos.HIGH), loaded_node, [on_sick], CATALOG) == ("ns/on-sick",)


# --- the replay (tfctl plan, the placement benchmark) --------------------------------------------------
def test_the_replay_places_no_more_containers_on_a_gpu_than_its_slices() -> None:
    node = make_node("n", gpus=gpus(0, slots=4))
    demands = [make_demand(pod_key=f"ns/p{i}", tflops="1", vram="1Gi") for i in range(6)]
    placed = [o.node for o in replay([node], demands, REGISTRY.create("binpack"), CATALOG)]
    assert placed == ["n"] * 4 + [None] * 2


# --- property: a slot reason exactly when slots are what is missing ------------------------------------
@st.composite
def slotted_nodes(draw: st.DrawFn) -> NodeState:
    built = []
    for i in range(draw(st.integers(1, 4))):
        slots = draw(st.sampled_from([1, 2, 4]))
        built.append(
            make_gpu(
                f"GPU-{i}",
                index=i,
                slots=slots,
                slots_used=draw(st.integers(0, slots + 1)),
                healthy=draw(st.booleans()),
                whole=draw(st.sampled_from([False, False, True])),
                tflops_used=f"{draw(st.sampled_from([0, 200, 310]))}",
                vram_used=f"{draw(st.sampled_from([0, 60, 79]))}Gi",
            )
        )
    extra = draw(st.integers(0, 3))  # IDs of pods on GPUs the inventory no longer lists
    return make_node("n", gpus=built, node_slots_used=sum(g.slots_used for g in built) + extra)


def fits(demand: Demand, node: NodeState, *, with_slots: bool) -> bool:
    """The rules written out once more, independently of fit.py."""
    s = demand.slots if with_slots else 0
    usable = 0
    for g in node.gpus:
        if not g.healthy or g.whole or (s > 0 and g.slots_used + s > g.slots):
            continue
        if demand.whole_gpu:
            usable += g.pods == 0 and g.tflops_used == 0 and g.vram_used == 0
        else:
            usable += g.tflops - g.tflops_used >= demand.tflops and g.vram - g.vram_used >= demand.vram
    ids = s * demand.gpu_count
    room = sum(g.slots for g in node.gpus if g.healthy) - node.slots_used
    return usable >= demand.gpu_count and (ids == 0 or ids <= room)


@given(slotted_nodes(), st.integers(1, 3), st.integers(0, 2), st.booleans(), st.sampled_from([1, 10, 200]))
@settings(max_examples=600, deadline=None)
def test_the_filter_passes_exactly_what_fits_and_blames_slots_only_when_they_are_short(
    node: NodeState, count: int, slots: int, whole: bool, tflops: int
) -> None:
    demand = make_demand(count=count, slots=slots, whole_gpu=whole, tflops=f"{tflops}", vram="10Gi")
    got = verdict(demand, node)
    assert (got is None) == fits(demand, node, with_slots=True)
    slots_short = fits(demand, node, with_slots=False) and not fits(demand, node, with_slots=True)
    assert (got is not None and got[0] is R.INSUFFICIENT_SLOTS) == slots_short, got
