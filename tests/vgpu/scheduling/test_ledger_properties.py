"""Property tests: any sequence of reserve/commit/release/expire keeps the ledger honest.

GPUs have few vGPU slots here (3, 2 and 1) so that slot limits, and allocations counted past them
(``past_slices``, for pods bound before the limit), are hit as often as TFLOPS and VRAM limits. Grants
carry VRAM limits of their own (above or below the request): the ledger holds the larger of the two on the
GPU, and never lets the sum pass the GPU's memory unless a reservation was counted ``past_limits`` (a
written allocation), whose requests alone must fit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vgpu.scheduling.builders import make_gpu, make_node
from vgpu.contract.allocation import GpuGrant
from vgpu.scheduling.ledger import GpuUsage, Ledger, LedgerRefusal
from vgpu.scheduling.model import NodeState

NODES = {
    "a": make_node(
        "a",
        gpus=[make_gpu("GPU-a0", tflops="10m", vram="8", slots=3), make_gpu("GPU-a1", tflops="10m", vram="8", slots=2)],
    ),
    "b": make_node("b", gpus=[make_gpu("GPU-b0", tflops="5m", vram="4", slots=1)]),
}
CAPACITY = {g.uuid: (g.tflops, g.vram, g.slots) for n in NODES.values() for g in n.gpus}
PODS = [f"ns/p{i}" for i in range(6)]


@dataclass(frozen=True)
class Reserve:
    pod: str
    node: str
    grants: tuple[GpuGrant, ...]
    expires_at: float | None
    whole: bool
    slots: int
    past_slices: bool
    past_limits: bool = False


@dataclass(frozen=True)
class Other:
    verb: str  # commit | release | expire
    pod: str
    now: float


def _grant(uuid: str, tflops: int, vram: int, vram_limit: int | None = None) -> GpuGrant:
    limit = vram if vram_limit is None else vram_limit
    return GpuGrant(
        uuid=uuid,
        index=0,
        tflops_request=tflops,
        tflops_limit=tflops,
        vram_request=vram,
        vram_limit=limit,
        gpu_tflops=0,
    )


@st.composite
def reserves(draw: st.DrawFn) -> Reserve:
    node = draw(st.sampled_from(sorted(NODES)))
    uuids = [g.uuid for g in NODES[node].gpus] + ["GPU-stranger"]
    picked = draw(st.lists(st.sampled_from(uuids), min_size=1, max_size=3))
    grants = tuple(
        _grant(u, draw(st.integers(0, 6)), draw(st.integers(0, 6)), draw(st.none() | st.integers(0, 8))) for u in picked
    )
    expires = draw(st.none() | st.floats(0, 10, allow_nan=False))
    slots, past = draw(st.integers(0, 2)), draw(st.sampled_from([False, False, False, True]))
    past_limits = draw(st.sampled_from([False, False, False, True]))
    return Reserve(draw(st.sampled_from(PODS)), node, grants, expires, draw(st.booleans()), slots, past, past_limits)


OPS = st.lists(
    st.one_of(
        reserves(),
        st.builds(Other, st.sampled_from(["commit", "release", "expire"]), st.sampled_from(PODS), st.floats(0, 10)),
    ),
    max_size=40,
)


def reference_accepts(ledger: Ledger, op: Reserve, node: NodeState) -> bool:
    """What a reservation may do, computed independently from the ledger's public view."""
    if ledger.entry(op.pod) is not None:
        existing = ledger.entry(op.pod)
        assert existing is not None
        return (existing.node, existing.grants, existing.whole, existing.slots) == (
            op.node,
            op.grants,
            op.whole,
            op.slots,
        )
    uuids = [g.uuid for g in op.grants]
    if len(set(uuids)) != len(uuids) or not set(uuids) <= {g.uuid for g in node.gpus}:
        return False
    for g in op.grants:
        used = ledger.usage(g.uuid)
        cap_t, cap_v, cap_s = CAPACITY[g.uuid]
        if used.whole or (op.whole and used.pods):
            return False
        if used.tflops + g.tflops_request > cap_t:
            return False
        # VRAM holds the larger of request and limit; counted past_limits, only the requests must fit.
        if op.past_limits and used.vram_requested + g.vram_request > cap_v:
            return False
        if not op.past_limits and used.vram + max(g.vram_request, g.vram_limit) > cap_v:
            return False
        if used.slots + op.slots > cap_s and not op.past_slices:
            return False
    return True


def check_invariants(ledger: Ledger, past_slices: bool, past_limits: bool = False) -> None:
    """``past_slices``: some reservation so far was allowed past the GPUs' slots; ``past_limits``: past their
    memory by its VRAM limits."""
    totals: dict[str, GpuUsage] = {}
    node_slots: dict[str, int] = {}
    for entry in ledger.entries().values():
        node_slots[entry.node] = node_slots.get(entry.node, 0) + entry.slots * len(entry.grants)
        for g in entry.grants:
            u = totals.get(g.uuid, GpuUsage())
            totals[g.uuid] = GpuUsage(
                tflops=u.tflops + g.tflops_request,
                vram=u.vram + max(g.vram_request, g.vram_limit),
                pods=u.pods + 1,
                whole=u.whole or entry.whole,
                slots=u.slots + entry.slots,
                vram_requested=u.vram_requested + g.vram_request,
            )
    for uuid, (cap_t, cap_v, cap_s) in CAPACITY.items():
        usage = ledger.usage(uuid)
        assert usage == totals.get(uuid, GpuUsage())  # incremental totals equal the recount
        assert usage.tflops <= cap_t and usage.vram_requested <= cap_v  # requests never over-committed
        assert usage.vram <= cap_v or past_limits  # every pod's VRAM limit fits beside the others'
        assert usage.slots <= cap_s or past_slices  # no GPU shared by more containers than its slices
        assert not usage.whole or usage.pods == 1  # a whole GPU has exactly its holder
    for name, node in NODES.items():
        assert ledger.node_slots(name) == node_slots.get(name, 0)  # the kubelet's count, kept incrementally
        applied = ledger.apply_node(node)
        assert applied.slots_used == node_slots.get(name, 0)
        assert [g.slots_used for g in applied.gpus] == [ledger.usage(g.uuid).slots for g in node.gpus]


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_random_sequences_never_over_commit_and_decide_like_the_reference(ops: list[Reserve | Other]) -> None:
    ledger = Ledger()
    past = past_limits = False
    for op in ops:
        before = dict(ledger.entries())
        if isinstance(op, Reserve):
            expected = reference_accepts(ledger, op, NODES[op.node])
            try:
                ledger = ledger.reserve(
                    op.pod,
                    NODES[op.node],
                    op.grants,
                    op.expires_at,
                    whole=op.whole,
                    slots=op.slots,
                    past_slices=op.past_slices,
                    past_limits=op.past_limits,
                )
            except LedgerRefusal as refused:
                assert not expected, refused.reason
                assert dict(ledger.entries()) == before
                if op.pod not in before:  # a refused reservation leaves no trace to release
                    assert ledger.release(op.pod).entries() == ledger.entries()
            else:
                assert expected
                past = past or op.past_slices
                past_limits = past_limits or op.past_limits
        elif op.verb == "commit":
            try:
                ledger = ledger.commit(op.pod)
            except LedgerRefusal:
                assert op.pod not in before
        elif op.verb == "release":
            once = ledger.release(op.pod)
            assert once.release(op.pod).entries() == once.entries()  # idempotent
            assert op.pod not in once.entries()
            ledger = once
        else:
            ledger = ledger.expire(op.now)
            assert all(e.expires_at is None or e.expires_at > op.now for e in ledger.entries().values())
        check_invariants(ledger, past, past_limits)


@settings(max_examples=100, deadline=None)
@given(OPS)
def test_releasing_everything_returns_every_gpu_to_idle(ops: list[Reserve | Other]) -> None:
    ledger = Ledger()
    for op in ops:
        if isinstance(op, Reserve):
            with contextlib.suppress(LedgerRefusal):
                ledger = ledger.reserve(
                    op.pod, NODES[op.node], op.grants, op.expires_at, whole=op.whole, slots=op.slots
                )
    for pod in PODS:
        ledger = ledger.release(pod)
    assert all(ledger.usage(uuid) == GpuUsage() for uuid in CAPACITY)
    assert ledger.node_slots("a") == ledger.node_slots("b") == 0
    assert ledger.apply_node(NODES["a"]) is NODES["a"]
