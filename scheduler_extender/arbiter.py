"""The one way a write adds grants on a node: decide it beside the node's claims, then claim it by CAS.

A bind (binder.py) and an in-place resize (autoscaler/resize.py) both place from this replica's cache,
which may not yet show what another replica wrote on the node. Each decides beside the node's claims
(claims.py: what others are writing there), adds its own claim to the node's claims Lease on the
condition that nobody wrote it since it was read (claim_board.py), and only then makes its write, itself
conditional on the pod's resourceVersion the claim names. The API server orders the Lease writes, so of
two writes that missed each other the later one fails its CAS and decides again. Why this is airtight,
also for a replica that stalls and resumes: scheduler_extender/HANDOFF.md, "Arbitration".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final, TypeVar

from scheduler_extender.cache import ClusterCache
from scheduler_extender.claim_board import ClaimBoard, ClaimsContended, ClaimsUnreadable
from scheduler_extender.claims import after_reading, counted_beside, settle
from scheduler_extender.gateway import KubeGateway
from scheduler_extender.objects import PodRecord, PodRef
from tf_shell.kube.api import GatewayError
from vgpu.contract.allocation import GpuGrant
from vgpu.contract.claims import Claim, NodeClaims

T = TypeVar("T")

ATTEMPTS: Final = 3  # decisions per write when other replicas keep writing the node's claims meanwhile
CATCH_UP_WAIT: Final = 1.0  # seconds the pod watch may take to reach a node's horizon before the write backs off
CATCH_UP_POLL: Final = 0.01


class ClaimFailed(Exception):
    """No claim was made (whatever ``decide`` reserved was undone); ``stage`` labels the metric:
    ``conflict`` (other replicas' writes) or ``claim`` (the API server)."""

    def __init__(self, message: str, stage: str) -> None:
        super().__init__(message)
        self.stage = stage


# decide(claims to hold beside the ledger) -> (what the caller keeps, the grants written, device IDs per GPU)
Decide = Callable[[tuple[Claim, ...]], tuple[T, tuple[GpuGrant, ...], int]]


class Arbiter:
    """Claims grants on a node before they are written. Thread-safe."""

    def __init__(
        self,
        board: ClaimBoard,
        cache: ClusterCache,
        gateway: KubeGateway,
        pods_seen: Callable[[], int],
        *,
        stale_after: float,
        clock: Callable[[], float],
        monotonic: Callable[[], float] = time.monotonic,
        count: Callable[[str], None] = lambda _result: None,
    ) -> None:
        """``count(result)``: written, contended or stale-read (the metric)."""
        self.count = count
        self.board = board
        self.cache = cache
        self.gateway = gateway
        self.pods_seen = pods_seen
        self.stale_after = stale_after
        self.clock = clock
        self.monotonic = monotonic
        # node -> its stale claims read and kept: when (monotonic); a node's own map is touched only in its turn
        self._checked: dict[str, dict[tuple[str, int], float]] = {}

    def claim(
        self,
        node: str,
        ref: PodRef,
        version: int,
        decide: Decide[T],
        undo: Callable[[], None],
        timeout: Callable[[str], float],
    ) -> T:
        """Decide (under the cache lock) beside ``node``'s claims and claim the grants for pod ``ref`` at
        resourceVersion ``version``; returns what ``decide`` gave. ``undo`` gives back what ``decide``
        reserved, when the claim is contended or fails. ``timeout(step)`` is each call's timeout (it may
        raise GatewayError when no time is left). Errors ``decide`` raises pass through, after nothing was
        written; ClaimFailed otherwise."""
        with self.board.writing(node):
            try:
                board = self.board.current(node, timeout=timeout("read the node's GPU claims"))
                for _ in range(ATTEMPTS):
                    self._catch_up(node, board.horizon, timeout)
                    board = self._without_stale(node, board, timeout)
                    with self.cache.lock:
                        seen, versions = self._seen(board)
                        counted = self.cache.counted_on(node)
                        kept, grants, slots = decide(counted_beside(board, ref.uid, counted, seen, versions))
                    now = self.clock()
                    mine = Claim(pod_uid=ref.uid, pod=ref.key, version=version, gpus=grants, slots=slots, at=now)
                    settled = settle(board, mine, seen, versions, now=now, stale_after=self.stale_after)
                    try:
                        owner = self.cache.node_uid(node)
                        self.board.write(settled.board, timeout=timeout("claim the GPUs"), node_uid=owner)
                        self.count("written")
                        return kept
                    except ClaimsContended:
                        self.count("contended")
                        undo()
                        board = self.board.read(node, timeout=timeout("read the node's GPU claims"))
                    except BaseException:
                        undo()
                        raise
            except ClaimsUnreadable as exc:
                raise ClaimFailed(str(exc), "claim") from None
            except GatewayError as exc:
                raise ClaimFailed(f"could not claim the GPUs on node {node}: {exc}", "claim") from None
        raise ClaimFailed(
            f"other extenders kept claiming GPUs on node {node} while pod {ref.key} was placed there ({ATTEMPTS} "
            "times); this write backed off so that no GPU is promised twice",
            "conflict",
        )

    def _seen(self, board: NodeClaims) -> tuple[dict[str, PodRecord], dict[str, int]]:
        """What the cache shows of the claims' pods: their records (those holding GPUs) and resourceVersions
        (every pod it shows); a few lookups, not every pod."""
        records, versions = {}, {}
        for claim in board.claims:
            record = self.cache.record(claim.pod_uid)
            if record is not None:
                records[claim.pod_uid] = record
            version = self.cache.pod_version(claim.pod_uid)
            if version is not None:
                versions[claim.pod_uid] = version
        return records, versions

    def _without_stale(self, node: str, board: NodeClaims, timeout: Callable[[str], float]) -> NodeClaims:
        """``board`` without what the cache settles, and without each claim older than a write can last that
        the cache cannot settle, once its pod, read, says it can never land (rare: a write that failed, or a
        pod deleted before it was bound; each such claim is read at most once per ``stale_after``)."""
        with self.cache.lock:
            seen, versions = self._seen(board)
        settled = settle(board, None, seen, versions, now=self.clock(), stale_after=self.stale_after)
        claims = settled.board
        now = self.monotonic()
        checked = self._checked.setdefault(node, {})
        for stale in settled.check:
            key = (stale.pod_uid, stale.version)
            if now - checked.get(key, -math.inf) < self.stale_after:
                continue
            namespace, _, name = stale.pod.partition("/")
            pod = self.gateway.get_pod(namespace, name, timeout=timeout("read a stale claim's pod"))
            self.count("stale-read")
            checked[key] = now
            claims = after_reading(claims, stale, pod)
        live = {(c.pod_uid, c.version) for c in claims.claims}
        for key in [k for k in checked if k not in live]:
            del checked[key]
        if not checked:
            del self._checked[node]
        return claims

    def _catch_up(self, node: str, horizon: int, timeout: Callable[[str], float]) -> None:
        """Wait (briefly) until this replica's pod watch has reached ``horizon``: a claim dropped from the node
        was counted by its dropper's cache, and must be by this one's before it places there."""
        if self.pods_seen() >= horizon:
            return
        end = self.monotonic() + min(CATCH_UP_WAIT, timeout("catch up with the node's claims"))
        while self.pods_seen() < horizon:
            if self.monotonic() >= end:
                raise ClaimFailed(
                    f"this extender's pod watch (resourceVersion {self.pods_seen()}) is behind what another "
                    f"extender counted on node {node} ({horizon}); it places there once it has caught up",
                    "conflict",
                )
            time.sleep(CATCH_UP_POLL)
