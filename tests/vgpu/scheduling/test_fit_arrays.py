"""The filter's array pass (``fit_arrays.surely_fit``) passes exactly the plain nodes ``check_node`` passes.

Over random clusters — GPUs of two models and sizes, shared, whole-held, unhealthy and out-of-slot GPUs, nodes
without GPUs, with an inventory error, in another pool, with too few device IDs left, with and without free
CPU and memory — and random demands (one to three GPUs or none, whole GPUs, slots, a VRAM limit above the
request, CPU and memory, a pool, a model): every node the arrays pass, ``check_node`` passes; every node
``check_node`` passes whose GPUs are all of the demanded model, the arrays pass; and the filter gives the same
result, reasons and order included, with the arrays as without, on a first call and after some nodes changed.
"""

from __future__ import annotations

import random
import sys
import threading
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vgpu.scheduling.builders import CATALOG, make_demand, make_gpu, make_node, make_snapshot
from vgpu.scheduling.filter import BATCH, filter_nodes
from vgpu.scheduling.fit import ModelMatcher, check_node
from vgpu.scheduling.fit_arrays import surely_fit
from vgpu.scheduling.growth_arrays import node_terms
from vgpu.scheduling.model import Demand, NodeState
from vgpu.scheduling.packed import Columns, row

A100, L4 = "NVIDIA A100-SXM4-80GB", "NVIDIA L4"
USED = [(0, 0), (20, 4), (50, 10), (78, 20), (125, 32), (156, 40), (250, 70), (312, 80)]


def cluster(rng: random.Random, count: int, prefix: str = "n") -> list[NodeState]:
    nodes = []
    for i in range(count):
        gpus = []
        model = rng.choice([A100, A100, L4, None])  # None: a node of both models
        for j in range(rng.choice([0, 1, 2, 4, 8, 8])):
            small = (model or rng.choice([A100, L4])) == L4
            cap_t, cap_v = (121, 24) if small else (312, 80)
            t, v = rng.choice(USED)
            slots = rng.choice([2, 4])
            gpus.append(
                make_gpu(
                    f"GPU-{prefix}{i}-{j}",
                    index=j,
                    model=L4 if small else A100,
                    tflops=str(cap_t),
                    vram=f"{cap_v}Gi",
                    tflops_used=str(min(t, cap_t)),
                    vram_used=f"{min(v, cap_v)}Gi",
                    pods=rng.choice([None, None, 0, 2]),
                    whole=rng.random() < 0.05,
                    healthy=rng.random() > 0.05,
                    slots=slots,
                    slots_used=min(rng.choice([0, 0, 1, 2, 4]), slots),
                )
            )
        ids = sum(g.slots for g in gpus if g.healthy)  # the node's device IDs: some nodes have one or none left
        nodes.append(
            make_node(
                f"{prefix}{i}",
                gpus=gpus,
                pool=rng.choice(["default-pool", "default-pool", "other"]),
                inventory_error="unreadable" if rng.random() < 0.03 else None,
                cpu_free=rng.choice([None, 0, 4000, 64_000]),
                memory_free=rng.choice([None, "8Gi", "256Gi"]),
                node_slots_used=rng.choice([None, None, 0, max(ids - 1, 0), ids]),
            )
        )
    return nodes


@st.composite
def demands(draw: st.DrawFn) -> Demand:
    t, v = draw(st.sampled_from(USED))
    demand = make_demand(
        tflops=str(t),
        vram=f"{v}Gi",
        count=draw(st.sampled_from([0, 1, 1, 1, 2, 3])),
        whole_gpu=draw(st.booleans()),
        cpu=draw(st.sampled_from([0, 2000, 8000])),
        memory=draw(st.sampled_from(["0", "16Gi"])),
        slots=draw(st.sampled_from([0, 1, 1, 2])),
        pool=draw(st.sampled_from([None, "default-pool"])),
        model=draw(st.sampled_from([None, None, "A100", "L4"])),
    )
    if draw(st.booleans()):
        demand = replace(demand, vram_limit=demand.vram + (8 << 30))  # held: the limit
    return demand


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32), demand=demands())
def test_the_arrays_pass_the_plain_nodes_check_node_passes(seed: int, demand: Demand) -> None:
    nodes = cluster(random.Random(seed), BATCH + 16)
    match = ModelMatcher(CATALOG, demand.gpu_model)
    packed = Columns()
    sure = surely_fit(demand, packed.of(nodes), packed, match).tolist()
    for node, passed in zip(nodes, sure, strict=True):
        fits = check_node(demand, node, match) is None
        plain = node.inventory_error is None and bool(node.gpus) and all(match(g.model) for g in node.gpus)
        assert passed == (fits and plain), node


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), demand=demands())
def test_the_filter_judges_alike_with_the_arrays_and_without(seed: int, demand: Demand) -> None:
    rng = random.Random(seed)
    nodes = cluster(rng, BATCH + 16)
    packed = Columns()
    names = [n.name for n in nodes] + ["unknown", nodes[3].name]  # a node the extender never saw, a name twice
    snapshot = make_snapshot(*nodes)
    assert filter_nodes(demand, snapshot, names, CATALOG, packed) == filter_nodes(demand, snapshot, names, CATALOG)
    # Some nodes changed since (reserved, released), offered in another order: repacked, the rest kept.
    changed = nodes[:]
    for i, node in enumerate(cluster(rng, 6)):
        changed[11 * i] = replace(node, name=nodes[11 * i].name)
    rng.shuffle(changed)
    names = [n.name for n in changed]
    snapshot = make_snapshot(*changed)
    assert filter_nodes(demand, snapshot, names, CATALOG, packed) == filter_nodes(demand, snapshot, names, CATALOG)


def test_kept_columns_are_those_packed_afresh() -> None:
    """Columns and their terms kept by name from call to call equal the nodes packed anew: after changes, for a
    subset in another order, for a node wider than any before (the others padded with all-zero GPUs), after so
    many changes that the live columns move to new arrays; the same nodes asked again get the same arrays."""
    rng = random.Random(7)
    nodes = cluster(rng, 100)
    packed = Columns(node_terms)
    packed.of(nodes)
    wide = make_node("n6", n_gpus=12, tflops_used="20", vram_used="4Gi")
    later = [wide if n.name == "n6" else n for n in nodes[::-3]]
    assert wide in later
    assert_packed_afresh(packed, later)
    for i in range(300):  # one node changed a call, the others kept: the room runs out, more than once
        at = rng.randrange(len(nodes))
        nodes[at] = replace(cluster(rng, 1, prefix=f"c{i}-")[0], name=nodes[at].name)
        assert_packed_afresh(packed, nodes)
    assert_packed_afresh(packed, [*nodes, replace(nodes[0], cpu_free=1)])  # two nodes of one name
    columns, terms = packed.gather(nodes)
    again = packed.gather(list(nodes))
    assert again[0] is columns and again[1] is terms


def test_concurrent_calls_each_get_their_own_nodes() -> None:
    """Calls in several threads, each offering its own state objects of some nodes (their snapshots), share the
    kept columns and each get the columns and terms of its own nodes."""
    rng = random.Random(11)
    nodes = cluster(rng, 120)
    packed = Columns(node_terms)
    calls = []
    for t in range(4):
        mine = [replace(node, name=nodes[80 + i].name) for i, node in enumerate(cluster(rng, 40, prefix=f"t{t}-"))]
        calls.append([nodes[:80] + mine[:k] + nodes[80 + k :] for k in range(0, 40, 4)])
    failures: list[BaseException] = []

    def run(lists: list[list[NodeState]]) -> None:
        try:
            for _ in range(5):
                for offered in lists:
                    assert_packed_afresh(packed, offered)
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, inside the packing too
    try:
        threads = [threading.Thread(target=run, args=(lists,)) for lists in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures, failures


def assert_packed_afresh(packed: Columns, nodes: list[NodeState]) -> None:
    columns, terms = packed.gather(nodes)
    kinds = dict(packed.kinds())
    for node, column in zip(nodes, columns.T, strict=True):
        kind = kinds[(node.inventory_error is None, node.pool, node.totals().models)]
        packed_row = row(node, kind)
        assert column[: len(packed_row) // 8].tobytes() == packed_row
        assert not column[len(packed_row) // 8 :].any()
    assert terms.tobytes() == node_terms(columns).tobytes()
