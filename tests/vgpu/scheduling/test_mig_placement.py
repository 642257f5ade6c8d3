"""MIG units in the scheduling core: a node whose A100-40GB is in MIG mode (7 × 1g.5gb) beside a plain
A100-80GB, read from the device plugin's inventory as the extender reads it."""

from __future__ import annotations

from scheduler_extender.objects import node_state
from tests.vgpu.scheduling.builders import CATALOG, make_demand
from vgpu import mig
from vgpu.contract import inventory
from vgpu.contract.inventory import GpuInfo, NodeInventory
from vgpu.names import EnforcementBackend, SystemAnnotation
from vgpu.scheduling.fit import ModelMatcher, check_node
from vgpu.scheduling.ledger import Ledger
from vgpu.scheduling.model import Demand, NodeState
from vgpu.scheduling.placement import place
from vgpu.scheduling.policy import Binpack
from vgpu.scheduling.reasons import ReasonCode

MIB = 1024 * 1024
PARENT = "GPU-40000000-0000-0000-0000-000000000000"
UNITS = [f"MIG-{i}0000000-0000-0000-0000-000000000000" for i in range(7)]
PLAIN = "GPU-80000000-0000-0000-0000-000000000000"


def mig_node_object(*units: str) -> dict[str, object]:
    """Node m as the device plugin publishes it: its A100-40GB with ``units`` (1g.5gb; in MIG mode when
    there are any) and a plain A100-80GB."""
    unit_model = mig.unit_product("A100-SXM4-40GB", mig.profile_name(1, 4864 * MIB))
    gpus = (
        GpuInfo(uuid=PARENT, index=0, model="A100-SXM4-40GB", tflops=312_000, vram=40960 * MIB, mig=bool(units)),
        *(
            GpuInfo(
                uuid=u, index=0, model=unit_model, tflops=mig.unit_tflops(312_000, 1, 7), vram=4864 * MIB, parent=PARENT
            )
            for u in units
        ),
        GpuInfo(uuid=PLAIN, index=1, model="A100-SXM4-80GB", tflops=312_000, vram=81251 * MIB),
    )
    inv = NodeInventory(
        node="m",
        pool="default-pool",
        gpus=gpus,
        slices_per_gpu=4,
        backend=EnforcementBackend.HAMI_CORE,
        heartbeat="2026-01-01T00:00:00Z",
    )
    return {"metadata": {"name": "m", "annotations": {SystemAnnotation.NODE_INVENTORY: inventory.encode(inv)}}}


def mig_node() -> NodeState:
    return node_state(mig_node_object(*UNITS), "default-pool")


def placed(demand: Demand, node: NodeState, ledger: Ledger) -> tuple[Ledger, str | None]:
    view = ledger.apply_node(node)
    placement = place(demand, view, Binpack(), CATALOG)
    if placement is None:
        return ledger, None
    return ledger.reserve(demand.pod_key, node, placement.grants, None).commit(demand.pod_key), placement.grants[0].uuid


def test_pods_naming_the_profile_get_distinct_units_whole_and_the_eighth_waits() -> None:
    node, ledger = mig_node(), Ledger()
    got = []
    for i in range(7):
        ledger, uuid = placed(make_demand(pod_key=f"ns/m{i}", tflops="10", vram="4Gi", model="1g.5gb"), node, ledger)
        got.append(uuid)
    assert sorted(got) == sorted(UNITS)  # seven distinct units, never the parent
    used = ledger.apply_node(node)
    assert all(g.tflops_used == g.tflops and g.vram_used == g.vram for g in used.gpus if g.uuid in UNITS)  # held whole
    late = make_demand(pod_key="ns/late", tflops="10", vram="4Gi", model="a100-1g.5gb")
    assert placed(late, node, ledger)[1] is None
    reason = check_node(late, used, ModelMatcher(CATALOG, late.gpu_model))
    assert reason is not None and not reason.unresolvable  # waits for a unit, Pending


def test_fractional_pods_land_on_the_plain_gpu_never_on_a_unit_or_the_parent() -> None:
    node, ledger = mig_node(), Ledger()
    for i, model in enumerate((None, "A100", "A100-40GB")):
        demand = make_demand(pod_key=f"ns/f{i}", tflops="10", vram="4Gi", model=model)
        ledger, uuid = placed(demand, node, ledger)
        assert uuid == (PLAIN if model != "A100-40GB" else None), (model, uuid)  # the 40GB one is in MIG mode


def test_a_request_larger_than_the_unit_or_of_a_profile_no_node_has_is_a_filter_reason() -> None:
    node = mig_node()
    big = make_demand(tflops="10", vram="8Gi", model="1g.5gb")
    reason = check_node(big, node, ModelMatcher(CATALOG, big.gpu_model))
    assert reason is not None and reason.code is ReasonCode.GPU_TOO_SMALL, reason
    other = make_demand(model="3g.20gb")
    reason = check_node(other, node, ModelMatcher(CATALOG, other.gpu_model))
    assert reason is not None and reason.code is ReasonCode.GPU_MODEL and "3g.20gb" in reason.message
