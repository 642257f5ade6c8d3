"""The per-node hand-off gate: between "allocation written" and "receipt seen", one pod per node and Allocate size.

kubelet's Allocate tells the device plugin only device IDs, not which pod they are for (DESIGN §6), so
two pods bound to one node may wait for Allocate at once only when their *Allocate sizes*
(:func:`~scheduler_extender.kubelet_devices.allocate_sizes`) are disjoint. Bind for node N takes N's
gate for its sizes; the gate stays taken until the device plugin's receipt, the pod's end or deletion
(after ``deletion_grace``), or ``ttl`` seconds after ``bound_at``. Waiting is event-driven: the cache
calls :meth:`HandoffGate.observe` on every pod change. The full rules are in
``scheduler_extender/HANDOFF.md``; the device plugin implements the node side from the same text.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from scheduler_extender.objects import PodRecord
from vgpu.timefmt import parse_rfc3339

log = logging.getLogger(__name__)


class GateBusy(Exception):
    """Another pod held the node's gate, or an earlier bind still waited for it, for longer than the bind may wait."""

    def __init__(self, node: str, holder: str, held_for: float, waited: float, *, queued: bool = False) -> None:
        why = (
            f"'s hand-off gate is still awaited by the bind of pod {holder}, which came first"
            if queued
            else f" is still handing GPUs over to pod {holder} (waiting for its device-plugin receipt for "
            f"{held_for:.1f}s)"
        )
        super().__init__(f"node {node}{why}; gave up after {waited:.1f}s, the scheduler will retry")
        self.node = node
        self.holder = holder
        self.waited = waited


@dataclass(frozen=True, slots=True)
class Hold:
    """One pod holding a node's gate. ``in_flight``: taken by a bind in progress, not yet seen on the pod."""

    uid: str
    pod_key: str
    since: float  # wall-clock seconds
    in_flight: bool
    sizes: frozenset[int] = frozenset()  # its Allocate sizes; empty: unknown, excludes every other pod


@dataclass(frozen=True, slots=True)
class Waiter:
    """A bind waiting for a node's gate; ``ticket`` orders the waiters of a node by arrival."""

    ticket: int
    pod_key: str
    sizes: frozenset[int]


def distinguishable(a: frozenset[int], b: frozenset[int]) -> bool:
    """Whether the device plugin can tell every Allocate of one pod from every Allocate of the other."""
    return bool(a) and bool(b) and not a & b


def bound_at(text: str, default: float) -> float:
    """Wall-clock seconds of an allocation's ``boundAt`` (``default`` when unreadable)."""
    try:
        return parse_rfc3339(text)
    except ValueError:
        return default


class HandoffGate:
    """Node → holders. Thread-safe; ``clock`` is wall-clock seconds (``bound_at`` is wall time)."""

    def __init__(self, *, ttl: float, deletion_grace: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        self.ttl = ttl
        self.deletion_grace = deletion_grace
        self.clock = clock
        self._cond = threading.Condition()
        self._holds: dict[str, dict[str, Hold]] = {}
        self._node_of: dict[str, str] = {}
        self._shared = 0  # gates taken beside another pod in hand-off of other Allocate sizes
        self._waiting: dict[str, dict[str, Waiter]] = {}  # node → binds waiting for its gate, by pod UID
        self._tickets = itertools.count()

    # --- fed by the cache ----------------------------------------------------------------------
    def observe(self, record: PodRecord) -> None:
        """A pod changed. Takes or releases the gate as its allocation/receipt/life says."""
        with self._cond:
            self._observe(record)
            self._cond.notify_all()

    def forget(self, uid: str) -> None:
        """The pod is gone from the API server."""
        with self._cond:
            self._retire(uid)
            self._cond.notify_all()

    def replace(self, records: Iterable[PodRecord]) -> None:
        """A relist: observed holds are rebuilt from ``records``; holds of binds in progress survive."""
        with self._cond:
            for uid, node in list(self._node_of.items()):
                if not self._holds[node][uid].in_flight:
                    self._drop(uid)
            for record in records:
                self._observe(record)
            self._cond.notify_all()

    def _observe(self, record: PodRecord) -> None:
        uid = record.ref.uid
        if record.in_handoff and record.allocation is not None and record.node_name is not None:
            node = record.allocation.node
            if self._node_of.get(uid, node) != node:
                self._drop(uid)
            since = bound_at(record.allocation.bound_at, self.clock())
            self._set(node, Hold(uid, record.ref.key, since, False, record.allocate_sizes))
            return
        current = self._current(uid)
        if current is None:
            return
        if record.deleting and not record.handed_over and not record.terminal:
            self._retire(uid)
        elif record.handed_over or record.terminal or not current.in_flight:
            self._drop(uid)

    # --- used by bind ---------------------------------------------------------------------------
    def acquire(self, node: str, uid: str, pod_key: str, wait: float, sizes: frozenset[int] = frozenset()) -> float:
        """Take ``node``'s gate for pod ``uid`` of Allocate ``sizes``, waiting at most ``wait`` seconds while
        a pod the device plugin could mistake for it holds it. Returns seconds waited.

        Binds of one size take a node's gate in the order they came: a burst queued at one node drains in
        ``handoff_wait`` if each hand-off is quick enough, instead of a late-comer overtaking an early bind
        until the early one gives up into kube-scheduler's backoff (up to 10 s). Raises :class:`GateBusy`
        when such a pod still holds the gate, or an earlier bind still waits for it, after ``wait``.
        """
        start = time.monotonic()
        with self._cond:
            queue = self._waiting.setdefault(node, {})
            me = queue[uid] = Waiter(next(self._tickets), pod_key, sizes)
            try:
                while True:
                    now = self.clock()
                    blockers = [h for h in self._holds.get(node, {}).values() if h.uid != uid]
                    for hold in blockers:
                        if hold.since + self.ttl <= now:
                            log.warning("hand-off gate of %s: %s held it past the TTL; releasing", node, hold.pod_key)
                            self._drop(hold.uid)
                    beside = [h for h in blockers if h.since + self.ttl > now]
                    blockers = [h for h in beside if not distinguishable(h.sizes, sizes)]
                    ahead = [w for w in queue.values() if w.ticket < me.ticket and not distinguishable(w.sizes, sizes)]
                    waited = time.monotonic() - start
                    if not blockers and not ahead:
                        self._set(node, Hold(uid, pod_key, now, True, sizes))
                        self._shared += bool(beside)
                        return waited
                    remaining = wait - waited
                    if remaining <= 0:
                        if blockers:
                            oldest = min(blockers, key=lambda h: h.since)
                            raise GateBusy(node, oldest.pod_key, now - oldest.since, waited)
                        first = min(ahead, key=lambda w: w.ticket)
                        raise GateBusy(node, first.pod_key, 0.0, waited, queued=True)
                    next_expiry = min((h.since + self.ttl for h in blockers), default=now + remaining) - now
                    self._cond.wait(max(0.0, min(remaining, next_expiry)))
            finally:
                del queue[uid]
                if not queue:
                    del self._waiting[node]
                self._cond.notify_all()  # the next waiter may go now

    def release(self, node: str, uid: str) -> None:
        """Give the gate back after a failed bind (idempotent)."""
        with self._cond:
            if self._node_of.get(uid) == node:
                self._drop(uid)
            self._cond.notify_all()

    # --- read-only views ------------------------------------------------------------------------
    def holders(self, node: str) -> tuple[Hold, ...]:
        with self._cond:
            return tuple(self._holds.get(node, {}).values())

    def busy_nodes(self, uid: str, sizes: frozenset[int] = frozenset()) -> set[str]:
        """Nodes where a bind of pod ``uid`` of Allocate ``sizes`` would wait: another pod the device plugin
        could mistake for it holds the gate (within the TTL)."""
        with self._cond:
            now = self.clock()
            return {
                node
                for node, holds in self._holds.items()
                if any(
                    h.uid != uid and h.since + self.ttl > now and not distinguishable(h.sizes, sizes)
                    for h in holds.values()
                )
            }

    def held_nodes(self) -> int:
        with self._cond:
            return len(self._holds)

    def shared(self) -> int:
        """How many times a bind took a gate while another pod, of other Allocate sizes, held it."""
        with self._cond:
            return self._shared

    # --- internals (caller holds the lock) --------------------------------------------------------
    def _current(self, uid: str) -> Hold | None:
        node = self._node_of.get(uid)
        return None if node is None else self._holds[node][uid]

    def _set(self, node: str, hold: Hold) -> None:
        self._holds.setdefault(node, {})[hold.uid] = hold
        self._node_of[hold.uid] = node

    def _retire(self, uid: str) -> None:
        """A holder is being deleted without a receipt: keep its hold until ``deletion_grace`` from now."""
        current = self._current(uid)
        if current is None or current.in_flight or self.deletion_grace <= 0:
            self._drop(uid)
            return
        until = self.clock() + self.deletion_grace
        if current.since + self.ttl > until:  # expire through the TTL path, never later than the TTL would
            self._set(self._node_of[uid], Hold(uid, current.pod_key, until - self.ttl, False, current.sizes))

    def _drop(self, uid: str) -> None:
        node = self._node_of.pop(uid, None)
        if node is None:
            return
        holds = self._holds[node]
        holds.pop(uid, None)
        if not holds:
            del self._holds[node]
