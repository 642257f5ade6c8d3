"""Changing a running pod's grants in place — autoSetRequests' new requests, autoSetLimits' new limits —
where its GPU has room.

New pods get the recommended requests at admission (the webhook). A running pod's grants change only
where its GPU can hold the new ones (:class:`InPlace`): its ledger entry (``cache.resize``, judged under
the cache's lock against everything the ledger holds, VRAM limits included) and its allocation on the
pod change together, checked like a bind (a patch conditional on the pod's resourceVersion, then a
consistent list of the node's allocations), so no placement ever sees one without the other, and a
raised VRAM limit and a bind that counted the old one never both stand. A failure at any step undoes
what was done. The steps and why: docs/autoscaling.md, section "How it is applied", "Changing a running
pod's grants", and "A VRAM request is guaranteed".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Final

from scheduler_extender.cache import ClusterCache
from scheduler_extender.events import EventRecorder
from scheduler_extender.gateway import KubeGateway
from scheduler_extender.objects import PodRef, allocated_on_selector, uncounted
from tf_shell.kube.api import GatewayError
from vgpu.autoscale.config import Resource
from vgpu.autoscale.evaluate import Workload
from vgpu.autoscale.recommend import Decision, Reason
from vgpu.contract import allocation as allocation_contract
from vgpu.contract.allocation import PodAllocation
from vgpu.errors import DomainError
from vgpu.names import SystemAnnotation
from vgpu.quantity import humanize_bytes, humanize_tflops

log = logging.getLogger(__name__)

RESIZED: Final = "RequestsResized"  # the pod's Event
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

    def __init__(self, gateway: KubeGateway, cache: ClusterCache) -> None:
        self._gateway, self._cache = gateway, cache

    def change(self, ref: PodRef, old: PodAllocation, new: PodAllocation, what: str) -> str:
        """Replace the pod's allocation ``old`` (as the decision read it) by ``new``; returns the outcome:
        ok, no-room (the GPU cannot hold ``new`` beside what the ledger holds now), stale (the pod or its
        allocation changed since), conflict (the write met another writer: a 409, or another extender's
        placement on the node) or api-error. ``what`` names the change in the log (requests, limits).

        1. the ledger swaps the pod's entry for ``new``'s grants under the cache's lock, only if they fit
           (VRAM held: each pod's larger of request and limit); from then on every filter and bind of this
           replica counts them;
        2. the pod is read, and written only if it still carries ``old``, conditional on the
           resourceVersion read;
        3. the node's allocations are listed consistently and compared with what the ledger counted at 1
           (the binder's write-then-list check, which counts limits too: any allocation that differs from
           what was counted, a neighbour placed or a limit raised by another replica): of two writers that
           missed each other the later lister sees the earlier one's write, and backs off;
        4. the hold is committed."""
        counted = self._cache.resize(ref, new.gpus)
        if counted is None:
            return "no-room"
        try:
            read = read_allocation(self._gateway, ref)
        except GatewayError as exc:
            return self._undo(ref, old, None, what, "api-error", f"cannot read the pod: {exc}")
        if read is None:
            return self._undo(ref, old, None, what, "stale", "the pod is gone, or carries no readable allocation")
        current, version = read
        if current != old:
            return self._undo(ref, old, None, what, "stale", "its allocation changed since the decision")
        text = allocation_contract.encode(new)
        try:
            self._gateway.patch_pod_annotations(
                ref.namespace, ref.name, ref.uid, {SystemAnnotation.ALLOCATION: text}, resource_version=version,
            )  # fmt: skip
        except GatewayError as exc:
            return self._undo(ref, old, None, what, "conflict" if exc.status == 409 else "api-error", str(exc))
        try:
            others = uncounted(self._gateway.list_pods(allocated_on_selector(old.node)), counted, old.node, ref.uid)
        except GatewayError as exc:
            return self._undo(ref, old, text, what, "api-error", f"cannot list the node's allocations: {exc}")
        if others:
            why = f"another extender placed {', '.join(sorted(others))} on {old.node} meanwhile"
            return self._undo(ref, old, text, what, "conflict", why)
        self._cache.commit(ref.key)
        return "ok"

    def _undo(self, ref: PodRef, old: PodAllocation, written: str | None, what: str, outcome: str, why: str) -> str:
        """Put the old allocation back on the pod (when the new one was written) and in the ledger."""
        log.info("autoscaler: %s of pod %s not changed this pass: %s", what, ref.key, why)
        if written is not None:
            try:
                self._gateway.patch_pod_annotations(
                    ref.namespace, ref.name, ref.uid, {SystemAnnotation.ALLOCATION: allocation_contract.encode(old)}
                )
            except GatewayError as exc:  # the new one stays on the pod, and the ledger keeps counting it
                log.error("autoscaler: could not put pod %s's allocation back: %s", ref.key, exc)
                self._cache.commit(ref.key)
                return outcome
        self._cache.reaccount(ref.uid)
        return outcome


class RequestResizer:
    """Applies a workload's request recommendation to its running pods, one pod at a time (see the module)."""

    def __init__(
        self, gateway: KubeGateway, cache: ClusterCache, events: EventRecorder, count: Callable[[str], None]
    ) -> None:
        """``count(result)``: one of ok, no-room, conflict, stale, api-error."""
        self._cache, self._events, self._count = cache, events, count
        self._in_place = InPlace(gateway, cache)

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
