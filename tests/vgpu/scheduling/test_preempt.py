"""Victim selection for the preempt verb: strictly lower QoS, lowest level first, fewest victims."""

from __future__ import annotations

from dataclasses import replace

from tests.vgpu.scheduling.builders import CATALOG, T4, make_demand, make_gpu, make_node
from vgpu.contract.allocation import GpuGrant
from vgpu.names import IsolationMode, Qos
from vgpu.quantity import parse_bytes
from vgpu.scheduling.ledger import Ledger
from vgpu.scheduling.model import Demand, NodeState
from vgpu.scheduling.preempt import Victim, select_victims

GI = parse_bytes("1Gi")


def victim(key: str, qos: Qos, *shares: tuple[str, int], whole: bool = False) -> Victim:
    grants = tuple(
        GpuGrant(
            uuid=uuid,
            index=0,
            tflops_request=1_000,
            tflops_limit=1_000,
            vram_request=gi * GI,
            vram_limit=gi * GI,
            gpu_tflops=312_000,
        )
        for uuid, gi in shares
    )
    return Victim(pod_key=key, qos=qos, grants=grants, whole=whole)


def loaded(node: NodeState, *victims: Victim) -> NodeState:
    """The node as the extender sees it: the victims' grants applied through the ledger."""
    ledger = Ledger()
    for v in victims:
        ledger = ledger.reserve(v.pod_key, node, v.grants, None, whole=v.whole, qos=v.qos, slots=v.slots)
    return ledger.apply_node(node)


def choose(demand: Demand, node: NodeState, *victims: Victim) -> tuple[str, ...] | None:
    return select_victims(demand, loaded(node, *victims), victims, CATALOG)


ONE = make_node("n", gpus=[make_gpu("GPU-0")])  # 80Gi


def test_nothing_to_evict_when_the_pod_fits_already() -> None:
    assert choose(make_demand(vram="10Gi"), ONE, victim("ns/low", Qos.LOW, ("GPU-0", 40))) == ()


def test_a_node_that_can_never_fit_is_vetoed() -> None:
    t4 = make_node("t", gpus=[make_gpu("GPU-t", model=T4, tflops="65", vram="16Gi")])
    assert choose(make_demand(model="A100"), t4, victim("ns/low", Qos.LOW, ("GPU-t", 16))) is None


def test_a_victim_frees_the_vram_it_holds_its_limit_not_just_its_request() -> None:
    """Each pod holds the larger of its VRAM request and limit: evicting a 10Gi-requested, 50Gi-limited pod frees
    50Gi, and is the one victim that makes room for 45Gi (the 40Gi pod alone would not)."""
    bursty = replace(victim("ns/bursty", Qos.LOW, ("GPU-0", 10)), grants=(
        replace(victim("ns/x", Qos.LOW, ("GPU-0", 10)).grants[0], vram_limit=50 * GI),
    ))  # fmt: skip
    steady = victim("ns/steady", Qos.LOW, ("GPU-0", 25))
    assert loaded(ONE, bursty, steady).gpus[0].vram_free == 5 * GI
    assert choose(make_demand(vram="45Gi", qos=Qos.HIGH), ONE, bursty, steady) == ("ns/bursty",)


def test_only_strictly_lower_qos_may_be_evicted() -> None:
    peers = (victim("ns/m1", Qos.MEDIUM, ("GPU-0", 40)), victim("ns/m2", Qos.MEDIUM, ("GPU-0", 40)))
    assert choose(make_demand(vram="10Gi", qos=Qos.MEDIUM), ONE, *peers) is None
    assert choose(make_demand(vram="10Gi", qos=Qos.HIGH), ONE, *peers) == ("ns/m1",)
    assert choose(make_demand(vram="10Gi", qos=Qos.LOW), ONE, *peers) is None


def test_the_lowest_qos_that_suffices_goes_first_even_if_a_higher_one_is_bigger() -> None:
    got = choose(
        make_demand(vram="30Gi", qos=Qos.CRITICAL),
        ONE,
        victim("ns/medium", Qos.MEDIUM, ("GPU-0", 50)),
        victim("ns/low", Qos.LOW, ("GPU-0", 30)),
    )
    assert got == ("ns/low",)


def test_fewest_victims_within_a_level() -> None:
    smalls = [victim(f"ns/s{i}", Qos.LOW, ("GPU-0", 10)) for i in range(5)]
    big = victim("ns/big", Qos.LOW, ("GPU-0", 30))
    assert choose(make_demand(vram="30Gi", qos=Qos.HIGH), ONE, *smalls, big) == ("ns/big",)


def test_climbs_to_the_next_level_only_when_the_lower_one_is_not_enough() -> None:
    got = choose(
        make_demand(vram="45Gi", qos=Qos.CRITICAL),
        ONE,
        victim("ns/high", Qos.HIGH, ("GPU-0", 30)),
        victim("ns/medium", Qos.MEDIUM, ("GPU-0", 40)),
        victim("ns/low", Qos.LOW, ("GPU-0", 10)),
    )
    assert got == ("ns/low", "ns/medium")


def test_veto_when_even_every_lower_qos_pod_is_not_enough() -> None:
    got = choose(
        make_demand(vram="60Gi", qos=Qos.HIGH),
        ONE,
        victim("ns/high", Qos.HIGH, ("GPU-0", 40)),
        victim("ns/low", Qos.LOW, ("GPU-0", 40)),
    )
    assert got is None


def test_multi_gpu_demand_prefers_one_victim_spanning_both_gpus() -> None:
    two = make_node("n", gpus=[make_gpu("GPU-0"), make_gpu("GPU-1", index=1)])
    got = choose(
        make_demand(vram="30Gi", count=2, qos=Qos.HIGH),
        two,
        victim("ns/a", Qos.LOW, ("GPU-0", 50)),
        victim("ns/b", Qos.LOW, ("GPU-1", 50)),
        victim("ns/both", Qos.LOW, ("GPU-0", 30), ("GPU-1", 30)),
    )
    assert got == ("ns/both",)


def test_a_gpu_held_whole_is_freed_by_evicting_its_holder() -> None:
    holder = victim("ns/whole", Qos.LOW, ("GPU-0", 80), whole=True)
    assert choose(make_demand(vram="1Gi", qos=Qos.MEDIUM), ONE, holder) == ("ns/whole",)


def test_pods_on_gpus_the_demand_cannot_use_are_never_victims() -> None:
    mixed = make_node("n", gpus=[make_gpu("GPU-0"), make_gpu("GPU-t", index=1, model=T4, tflops="65", vram="16Gi")])
    got = choose(
        make_demand(vram="30Gi", model="A100", qos=Qos.HIGH),
        mixed,
        victim("ns/on-t4", Qos.LOW, ("GPU-t", 16)),
        victim("ns/on-a100", Qos.MEDIUM, ("GPU-0", 80)),
    )
    assert got == ("ns/on-a100",)


def test_past_the_search_budget_the_set_is_still_minimal() -> None:
    many = [victim(f"ns/p{i:02}", Qos.LOW, ("GPU-0", 2)) for i in range(40)]
    demand = make_demand(vram="10Gi", qos=Qos.HIGH)
    node = loaded(make_node("n", gpus=[make_gpu("GPU-0", slots=64)]), *many)
    got = select_victims(demand, node, many, CATALOG)
    assert got is not None and len(got) == 5
    chosen = [v for v in many if v.pod_key in got]
    for spared in chosen:  # no victim can be spared
        rest = [v for v in chosen if v is not spared]
        freed = sum(g.vram_request for v in rest for g in v.grants)
        assert node.gpus[0].vram_free + freed < demand.vram


def test_no_victim_is_taken_from_a_gpu_that_does_not_serve_the_pods_mode() -> None:
    """The critical pod asks for hard isolation: only the MPS GPU can take it, so the low pod there goes, and the
    (lower, bigger) pod on the HAMi-core GPU stays, though evicting it would free more."""
    node = make_node(
        "n",
        gpus=[
            make_gpu("GPU-soft", isolation=(IsolationMode.SHARED, IsolationMode.SOFT)),
            make_gpu("GPU-hard", index=1, isolation=(IsolationMode.HARD,)),
        ],
    )
    soft, hard = victim("ns/on-soft", Qos.LOW, ("GPU-soft", 79)), victim("ns/on-hard", Qos.MEDIUM, ("GPU-hard", 79))
    assert choose(make_demand(vram="10Gi", qos=Qos.CRITICAL, isolation=IsolationMode.HARD), node, soft, hard) == (
        "ns/on-hard",
    )
