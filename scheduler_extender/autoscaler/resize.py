"""Changing a running pod's grants in place — autoSetRequests' new requests, autoSetLimits' new limits —
where its GPU has room.

New pods get the recommended requests at admission (the webhook). A running pod's grants change only
where its GPU can hold the new ones (:class:`InPlace`): its ledger entry (``cache.resize``, judged under
the cache's lock against everything the ledger holds, VRAM limits included) and its allocation on the
pod change together, claimed like a bind (on the node's claims Lease, then a patch conditional on the
pod's resourceVersion), so no placement ever sees one without the other, and a raised VRAM limit and a
bind that counted the old one never both stand. A failure at any step undoes what was done. The steps
and why: docs/autoscaling.md, section "How it is applied", "Changing a running pod's grants", and "A VRAM
request is guaranteed".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Final

from scheduler_extender.arbiter import Arbiter, ClaimFailed
from scheduler_extender.cache import ClusterCache
from scheduler_extender.events import EventRecorder
from scheduler_extender.gateway import KubeGateway
from scheduler_extender.objects import PodRef, as_version
from tf_shell.kube.api import GatewayError
from vgpu.autoscale.config import Resource
from vgpu.autoscale.evaluate import Workload
from vgpu.autoscale.recommend import Decision, Reason
from vgpu.contract import allocation as allocation_contract
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.contract.claims import Claim
from vgpu.errors import DomainError
from vgpu.names import SystemAnnotation
from vgpu.quantity import humanize_bytes, humanize_tflops

log = logging.getLogger(__name__)

RESIZED: Final = "RequestsResized"  # the pod's Event
CLAIM_TIMEOUT: Final = 5.0  # seconds for each call of a resize's claim
# A request decision with one of these has no recommendation to give: nothing is stamped or resized.
NO_RECOMMENDATION: Final = frozenset({Reason.WAITING_FOR_HISTORY, Reason.NO_SAMPLES, Reason.DISABLED})


def read_allocation(gateway: KubeGateway, ref: PodRef) -> tuple[PodAllocation, str | None] | None:
    """The pod's allocation as the API server has it now, with the resourceVersion it was read at (for a
    conditional write); None when the pod is gone, is another pod of that name, or carries no readable
    allocation. A failed read raises GatewayError."""
    pod = gateway.get_pod(ref.namespace, ref.name)
    meta = (pod or {}).get("metadata") or {}
    written = (meta.get("annotations") or {}).get(SystemAnnotation.ALLOCATION)
    if pod is None or meta.get("uid") != ref.uid or written is None:
        return None
    try:
        return allocation_contract.decode(written), str(meta.get("resourceVersion") or "") or None
    except DomainError:
        return None


def recommended(decision: Decision | None) -> int | None:
    """The request a decision recommends, or None when it has none to give (yet)."""
    return None if decision is None or decision.reason in NO_RECOMMENDATION else decision.value


def resized(alloc: PodAllocation, tflops: int | None, vram: int | None) -> PodAllocation | None:
    """``alloc`` with each grant's requests set to the recommendation (limits raised to them where lower);
    None when nothing would change (whole-GPU grants have no request to move)."""
    gpus = tuple(
        replace(
            g,
            tflops_request=tflops if tflops is not None else g.tflops_request,
            tflops_limit=max(g.tflops_limit, tflops or 0),
            vram_request=vram if vram is not None else g.vram_request,
            vram_limit=max(g.vram_limit, vram or 0),
        )
        for g in alloc.gpus
    )
    return None if gpus == alloc.gpus else replace(alloc, gpus=gpus)


class InPlace:
    """Changes one running pod's grants on its GPUs, in the ledger and on the pod together (see the module)."""

    def __init__(self, gateway: KubeGateway, cache: ClusterCache, arbiter: Arbiter) -> None:
        self._gateway, self._cache, self._arbiter = gateway, cache, arbiter

    def change(self, ref: PodRef, old: PodAllocation, new: PodAllocation, what: str) -> str:
        """Replace the pod's allocation ``old`` (as the decision read it) by ``new``; returns the outcome:
        ok, no-room (the GPU cannot hold ``new`` beside what the ledger holds now), stale (the pod or its
        allocation changed since), conflict (the write met another writer: a 409, or another extender's
        write in flight on the node) or api-error. ``what`` names the change in the log (requests, limits).

        1. the pod is read, and changed only if it still carries ``old``;
        2. with no other replica's write in flight on the node, the ledger swaps the pod's entry for
           ``new``'s grants under the cache's lock, only if they fit (VRAM held: each pod's larger of request
           and limit), and the change is claimed on the node's claims Lease (arbiter.py), as a bind's is;
        3. the allocation is written, conditional on the resourceVersion read at 1;
        4. the hold is committed."""
        try:
            read = read_allocation(self._gateway, ref)
        except GatewayError as exc:
            return self._undo(ref, what, "api-error", f"cannot read the pod: {exc}", held=False)
        if read is None:
            return self._undo(ref, what, "stale", "the pod is gone, or carries no readable allocation", held=False)
        current, version = read
        if current != old or version is None:
            return self._undo(ref, what, "stale", "its allocation changed since the decision", held=False)
        try:
            self._arbiter.claim(
                old.node,
                ref,
                as_version(version),
                lambda claims: self._hold(ref, new, claims),
                undo=lambda: self._cache.reaccount(ref.uid),
                timeout=lambda _step: CLAIM_TIMEOUT,
            )
        except _NotHeld as not_held:
            return self._undo(ref, what, not_held.outcome, str(not_held), held=False)
        except ClaimFailed as failed:
            outcome = "conflict" if failed.stage == "conflict" else "api-error"
            return self._undo(ref, what, outcome, str(failed), held=False)
        try:
            self._gateway.patch_pod_annotations(
                ref.namespace, ref.name, ref.uid, {SystemAnnotation.ALLOCATION: allocation_contract.encode(new)},
                resource_version=version,
            )  # fmt: skip
        except GatewayError as exc:
            if exc.status is None:  # no answer: it may have landed; the ledger keeps counting the new grants
                log.warning("autoscaler: %s of pod %s: the write got no answer (%s)", what, ref.key, exc)
                self._cache.commit(ref.key)
                return "api-error"
            return self._undo(ref, what, "conflict" if exc.status == 409 else "api-error", str(exc), held=True)
        self._cache.commit(ref.key)
        return "ok"

    def _hold(
        self, ref: PodRef, new: PodAllocation, claims: tuple[Claim, ...]
    ) -> tuple[None, tuple[GpuGrant, ...], int]:
        """Under the cache lock, beside the node's claims: hold ``new``'s grants in the ledger (see change, 2)."""
        if claims:
            raise _NotHeld("conflict", f"another extender is writing on {new.node} ({len(claims)} grants in flight)")
        slots = self._cache.resize(ref, new.gpus)
        if slots is None:
            raise _NotHeld("no-room", "the GPU cannot hold the new grants beside what it holds now")
        return None, new.gpus, slots

    def _undo(self, ref: PodRef, what: str, outcome: str, why: str, *, held: bool) -> str:
        """Count the pod's allocation as the watch shows it again (when the new grants were ``held``)."""
        log.info("autoscaler: %s of pod %s not changed this pass: %s", what, ref.key, why)
        if held:
            self._cache.reaccount(ref.uid)
        return outcome


class _NotHeld(Exception):
    """The new grants were not held (``outcome``: no-room, or conflict with another replica's write in flight);
    nothing was written."""

    def __init__(self, outcome: str, why: str) -> None:
        super().__init__(why)
        self.outcome = outcome


class RequestResizer:
    """Applies a workload's request recommendation to its running pods, one pod at a time (see the module)."""

    def __init__(
        self, in_place: InPlace, cache: ClusterCache, events: EventRecorder, count: Callable[[str], None]
    ) -> None:
        """``count(result)``: one of ok, no-room, conflict, stale, api-error."""
        self._cache, self._events, self._count = cache, events, count
        self._in_place = in_place

    def apply(self, workload: Workload, tflops: Decision | None, vram: Decision | None) -> tuple[int, int]:
        """Resize what can be; returns (pods resized now, pods whose GPU has no room for the recommendation)."""
        targets = {
            Resource.TFLOPS: recommended(tflops) if workload.config.requests.target.covers(Resource.TFLOPS) else None,
            Resource.VRAM: recommended(vram) if workload.config.requests.target.covers(Resource.VRAM) else None,
        }
        if targets[Resource.TFLOPS] is None and targets[Resource.VRAM] is None:
            return 0, 0
        done = no_room = 0
        for member in workload.members:
            record = self._cache.record(member.uid)
            alloc = None if record is None else record.allocation
            if record is None or alloc is None or record.terminal or record.deleting:
                continue
            new = resized(alloc, targets[Resource.TFLOPS], targets[Resource.VRAM])
            if new is None:
                continue
            outcome = self._one(record.ref, alloc, new)
            self._count(outcome)
            done += outcome == "ok"
            no_room += outcome == "no-room"
        return done, no_room

    def _one(self, ref: PodRef, old: PodAllocation, new: PodAllocation) -> str:
        outcome = self._in_place.change(ref, old, new, "requests")
        if outcome != "ok":
            return outcome
        before, after = old.gpus[0], new.gpus[0]
        self._events.normal(
            ref,
            RESIZED,
            f"autoSetRequests: requests per GPU {humanize_tflops(before.tflops_request)} TFLOPS / "
            f"{humanize_bytes(before.vram_request)} -> {humanize_tflops(after.tflops_request)} TFLOPS / "
            f"{humanize_bytes(after.vram_request)}, in place (the GPU had room)",
        )
        return "ok"
