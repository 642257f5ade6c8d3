"""The ledger: reserve → commit → release/expire, refusing over-commit, and applying usage to snapshots."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.vgpu.scheduling.builders import make_gpu, make_node, make_snapshot
from vgpu.contract.allocation import GpuGrant
from vgpu.quantity import parse_bytes
from vgpu.scheduling.ledger import EntryState, GpuUsage, Ledger, LedgerRefusal
from vgpu.scheduling.reasons import ReasonCode

GI = parse_bytes("1Gi")
NODE = make_node("n1", n_gpus=2, tflops="100", vram="10Gi")
R = ReasonCode


def grant(uuid: str = "GPU-n1-0", tflops: int = 10_000, vram_gi: int = 4) -> GpuGrant:
    return GpuGrant(
        uuid=uuid,
        index=int(uuid[-1]) if uuid[-1].isdigit() else 0,
        tflops_request=tflops,
        tflops_limit=tflops,
        vram_request=vram_gi * GI,
        vram_limit=vram_gi * GI,
        gpu_tflops=100_000,
    )


def refusal(action: object) -> ReasonCode:
    assert callable(action)
    with pytest.raises(LedgerRefusal) as caught:
        action()
    return caught.value.reason.code


def test_reserve_commit_release_round_trip_and_apply() -> None:
    ledger = Ledger().reserve("ns/a", NODE, [grant(vram_gi=4)], expires_at=30.0)
    ledger = ledger.reserve("ns/b", NODE, [grant(vram_gi=3), grant("GPU-n1-1", vram_gi=1)], expires_at=None)
    assert ledger.usage("GPU-n1-0") == GpuUsage(tflops=20_000, vram=7 * GI, pods=2, slots=2, vram_requested=7 * GI)
    applied = ledger.apply(make_snapshot(NODE)).nodes["n1"]
    used = [(g.tflops_used, g.vram_used, g.pods, g.slots_used) for g in applied.gpus]
    assert used == [(20_000, 7 * GI, 2, 2), (10_000, 1 * GI, 1, 1)] and applied.slots_used == 3
    committed = ledger.commit("ns/a")
    entry = committed.entry("ns/a")
    assert entry is not None and (entry.state, entry.expires_at) == (EntryState.COMMITTED, None)
    released = committed.release("ns/a").release("ns/b")
    assert released.entries() == {} and released.usage("GPU-n1-0") == GpuUsage()
    assert released.apply_node(NODE) is NODE


def test_over_commit_is_refused_with_a_reason_and_nothing_changes() -> None:
    ledger = Ledger().reserve("ns/a", NODE, [grant(vram_gi=8)], expires_at=None)
    with pytest.raises(LedgerRefusal) as caught:
        ledger.reserve("ns/b", NODE, [grant("GPU-n1-1", vram_gi=1), grant(vram_gi=3)], expires_at=None)
    reason = caught.value.reason
    assert reason.code is R.OVER_COMMIT
    assert reason.message == "ns/b would over-commit VRAM on GPU-n1-0: requested 3Gi, free 2Gi"
    assert (reason.requested, reason.free) == (3 * GI, 2 * GI)
    assert ledger.entry("ns/b") is None and ledger.usage("GPU-n1-1") == GpuUsage()
    tflops = refusal(lambda: ledger.reserve("ns/c", NODE, [grant(tflops=90_001, vram_gi=0)], expires_at=None))
    assert tflops is R.OVER_COMMIT


def test_a_vram_limit_is_held_like_a_request_and_a_tflops_limit_is_not() -> None:
    """On one GPU the pods' VRAM limits always fit beside each other: a pod may allocate up to its limit at
    any moment and memory is not taken back. TFLOPS limits over-subscribe the GPU as before."""
    hog = replace(grant(tflops=10_000, vram_gi=1), tflops_limit=100_000, vram_limit=8 * GI)
    ledger = Ledger().reserve("ns/hog", NODE, [hog], expires_at=None)
    assert ledger.usage("GPU-n1-0") == GpuUsage(tflops=10_000, vram=8 * GI, pods=1, slots=1, vram_requested=GI)
    assert [g.vram_used for g in ledger.apply_node(NODE).gpus] == [8 * GI, 0]
    with pytest.raises(LedgerRefusal) as caught:  # its request alone would leave 9Gi: the limit leaves 2Gi
        ledger.reserve("ns/neighbour", NODE, [grant(vram_gi=3)], expires_at=None)
    assert caught.value.reason.message == "ns/neighbour would over-commit VRAM on GPU-n1-0: requested 3Gi, free 2Gi"
    with pytest.raises(LedgerRefusal) as caught:  # a neighbour's limit counts the same way
        ledger.reserve("ns/n2", NODE, [replace(grant(vram_gi=1), vram_limit=3 * GI)], expires_at=None)
    assert "requested 3Gi (its VRAM limit, which a pod holds), free 2Gi" in caught.value.reason.message
    assert caught.value.reason.requested == 3 * GI
    fits = ledger.reserve("ns/n3", NODE, [replace(grant(tflops=90_000, vram_gi=1), vram_limit=2 * GI)], None)
    assert fits.usage("GPU-n1-0").vram == 10 * GI and fits.usage("GPU-n1-0").tflops == 100_000
    assert fits.release("ns/hog").usage("GPU-n1-0") == GpuUsage(
        tflops=90_000, vram=2 * GI, pods=1, slots=1, vram_requested=GI
    )


def test_a_written_allocation_is_counted_past_the_gpu_by_its_limits_but_not_by_its_requests() -> None:
    """``past_limits`` (an allocation already on a pod: written before limits were held, or a limit another
    replica raised): only the requests must fit, the limits are counted all the same, leaving no room."""
    ledger = Ledger().reserve("ns/a", NODE, [replace(grant(vram_gi=2), vram_limit=6 * GI)], expires_at=None)
    raised = replace(grant(vram_gi=2), vram_limit=8 * GI)
    assert refusal(lambda: ledger.reserve("ns/b", NODE, [raised], None)) is R.OVER_COMMIT
    written = ledger.reserve("ns/b", NODE, [raised], None, past_limits=True)
    assert written.usage("GPU-n1-0") == GpuUsage(tflops=20_000, vram=14 * GI, pods=2, slots=2, vram_requested=4 * GI)
    assert written.apply_node(NODE).gpus[0].vram_free == -4 * GI  # nothing else fits there until they go
    with pytest.raises(LedgerRefusal) as caught:  # requests past the GPU stay a conflict, as before
        ledger.reserve("ns/c", NODE, [grant(vram_gi=9)], None, past_limits=True)
    assert caught.value.reason.message == "ns/c would over-commit VRAM on GPU-n1-0: requested 9Gi, free 8Gi"


def test_refusals_for_malformed_or_conflicting_reservations() -> None:
    ledger = Ledger().reserve("ns/a", NODE, [grant()], expires_at=None)
    other_node = make_node("n2", gpus=[make_gpu("GPU-x", tflops="100", vram="10Gi")])
    assert refusal(lambda: ledger.reserve("ns/a", other_node, [grant("GPU-x")], None)) is R.POD_EXISTS
    assert refusal(lambda: ledger.reserve("ns/z", NODE, [grant("GPU-x")], None)) is R.UNKNOWN_GPU
    assert refusal(lambda: ledger.reserve("ns/z", NODE, [], None)) is R.INVALID_GRANT
    assert refusal(lambda: ledger.reserve("ns/z", NODE, [grant(), grant()], None)) is R.INVALID_GRANT
    assert refusal(lambda: ledger.reserve("ns/z", NODE, [grant(tflops=-1)], None)) is R.INVALID_GRANT
    assert refusal(lambda: ledger.reserve("ns/w", NODE, [grant(vram_gi=1)], None, whole=True)) is R.WHOLE_CONFLICT
    assert refusal(lambda: ledger.commit("ns/nobody")) is R.UNKNOWN_POD
    assert ledger.reserve("ns/a", NODE, [grant()], None) is ledger  # the identical reservation again


def test_a_gpu_held_whole_takes_no_one_else_until_released() -> None:
    whole = grant("GPU-n1-1", tflops=100_000, vram_gi=10)
    ledger = Ledger().reserve("ns/w", NODE, [whole], expires_at=None, whole=True)
    assert ledger.usage("GPU-n1-1").whole
    assert refusal(lambda: ledger.reserve("ns/f", NODE, [grant("GPU-n1-1", 0, 0)], None)) is R.WHOLE_CONFLICT
    freed = ledger.release("ns/w")
    assert not freed.usage("GPU-n1-1").whole
    freed.reserve("ns/f", NODE, [grant("GPU-n1-1")], None)


def test_expire_drops_due_reservations_only() -> None:
    ledger = (
        Ledger()
        .reserve("ns/due", NODE, [grant(vram_gi=1)], expires_at=10.0)
        .reserve("ns/later", NODE, [grant(vram_gi=1)], expires_at=10.5)
        .reserve("ns/kept", NODE, [grant(vram_gi=1)], expires_at=5.0)
        .commit("ns/kept")
    )
    assert ledger.expired(10.0) == ("ns/due",)
    after = ledger.expire(10.0)
    assert set(after.entries()) == {"ns/later", "ns/kept"}
    assert after.usage("GPU-n1-0").vram == 2 * GI
    assert after.expire(10.0) is after
    assert refusal(lambda: after.commit("ns/due")) is R.UNKNOWN_POD


def test_commit_and_release_are_idempotent_and_apply_is_per_node() -> None:
    ledger = Ledger().reserve("ns/a", NODE, [grant()], expires_at=1.0).commit("ns/a")
    assert ledger.commit("ns/a") is ledger
    assert ledger.release("ns/unknown") is ledger
    other = make_node("n2", gpus=[make_gpu("GPU-y")])
    assert ledger.apply_node(other) is other
    assert [e.pod_key for e in ledger.on_node("n1")] == ["ns/a"] and ledger.on_node("n2") == ()
