"""What a node's claims mean to one replica: which to count beside its ledger, which to drop, which to check.

A claim (vgpu/contract/claims.py) is another write's grants in flight on the node. This replica counts it
until its own cache shows the outcome: the pod holding those grants (counted by the ledger from then on:
the claim is dropped and the horizon raised to that pod's version, so that no replica whose watch is
behind it places there), or the pod at a later version without them (the write, conditional on the
version the claim names, can never land: dropped). A claim older than a bind can last whose pod the cache
does not show is settled by reading the pod (:func:`after_reading`). Pure functions over plain data; the
Lease itself is claim_board.py's. Why this is airtight: scheduler_extender/HANDOFF.md, "Arbitration".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from scheduler_extender.objects import PodRecord, pod_record, pod_ref
from vgpu.contract.allocation import GpuGrant
from vgpu.contract.claims import Claim, NodeClaims


def counted_beside(
    board: NodeClaims,
    own_uid: str,
    counted: Mapping[str, tuple[GpuGrant, ...]],
    records: Mapping[str, PodRecord],
    versions: Mapping[str, int],
) -> tuple[Claim, ...]:
    """The claims to hold on the node beside what the ledger ``counted`` (per pod UID) for a write of pod
    ``own_uid``: not the pod's own (an older one can no longer land, one at the same version excludes this
    write, as both are conditional on it), not one the ledger already counts with its very grants, and not
    one whose pod the cache shows past its version without them (``records``: pods holding GPUs;
    ``versions``: the resourceVersion of every pod the cache shows, by UID)."""
    kept = []
    for claim in board.claims:
        if claim.pod_uid == own_uid or counted.get(claim.pod_uid) == claim.gpus:
            continue
        if _past(claim, records.get(claim.pod_uid), versions.get(claim.pod_uid), board.node):
            continue
        kept.append(claim)
    return tuple(kept)


@dataclass(frozen=True, slots=True)
class Settled:
    """The claims to write back (``board``) and those whose pods must be read first (``check``)."""

    board: NodeClaims
    check: tuple[Claim, ...]


def settle(
    board: NodeClaims,
    mine: Claim | None,
    records: Mapping[str, PodRecord],
    versions: Mapping[str, int],
    *,
    now: float,
    stale_after: float,
) -> Settled:
    """``board`` with ``mine`` added and what this replica's cache (``records``) has settled dropped: a claim
    whose pod holds exactly its grants here (the horizon rises to that pod's version) or is past its version
    without them, and any older claim of ``mine``'s pod. A claim older than ``stale_after`` seconds that the
    cache cannot settle is kept and listed in ``check``."""
    horizon = board.horizon
    kept: list[Claim] = []
    check: list[Claim] = []
    for claim in board.claims:
        if mine is not None and claim.pod_uid == mine.pod_uid and claim.version < mine.version:
            continue
        record = records.get(claim.pod_uid)
        if record is not None and _holds(record, board.node, claim):
            horizon = max(horizon, record.version)
            continue
        if _past(claim, record, versions.get(claim.pod_uid), board.node):
            continue
        if now - claim.at > stale_after:
            check.append(claim)
        kept.append(claim)
    if mine is not None:
        kept.append(mine)
    return Settled(replace(board, horizon=horizon, claims=tuple(kept)), tuple(check))


def after_reading(board: NodeClaims, claim: Claim, pod: Mapping[str, Any] | None) -> NodeClaims:
    """``board`` once ``claim``'s pod was read consistently (None: it does not exist): dropped when the pod
    is gone, holds the claim's grants (the horizon rising to the version read) or has moved past the
    claim's version; kept while the pod still sits at that version, where the claimed write may still land."""
    if pod is not None and pod_ref(pod).uid == claim.pod_uid:
        record = pod_record(pod)
        if _holds(record, board.node, claim):
            horizon = max(board.horizon, record.version)
        elif record.version <= claim.version:
            return board
        else:
            horizon = board.horizon
    else:
        horizon = board.horizon
    return replace(board, horizon=horizon, claims=tuple(c for c in board.claims if c != claim))


def _past(claim: Claim, record: PodRecord | None, version: int | None, node: str) -> bool:
    """Whether the cache shows the claim's pod at a later version than the claim's without its grants: the
    claimed write, conditional on that version, can never land."""
    if record is not None and _holds(record, node, claim):
        return False
    seen = max(record.version if record is not None else 0, version or 0)
    return seen > claim.version


def _holds(record: PodRecord, node: str, claim: Claim) -> bool:
    alloc = record.allocation
    return alloc is not None and alloc.node == node and alloc.gpus == claim.gpus
