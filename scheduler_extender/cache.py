"""The cluster cache: watched Nodes and Pods turned into the core's Snapshot, plus the live Ledger.

State comes only from the API server (inventories from Node annotations, allocations from pods'
annotations), plus in-memory reservations for binds in progress and for the node a pending pod is
expected to land on. Every transition is a method here with no I/O, serialised by one re-entrant
lock, so a bind's read-decide-reserve is atomic. A relist (after a 410 Gone) is the new truth. Per-node
views are kept current on each change, and the ledger is kept one per node. Pods bound without an
allocation still count their vGPU IDs; workload pods and pending pods' pools are remembered for status
and metrics. Details and why: scheduler_extender/README.md, section "The cache".
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Final

from scheduler_extender.gateway import Kind
from scheduler_extender.handoff import HandoffGate
from scheduler_extender.in_tree import Taint, Toleration, prefer_no_schedule, tolerated
from scheduler_extender.kubelet_devices import vgpu_device_ids
from scheduler_extender.objects import (
    PodRecord,
    PodRef,
    WorkloadPod,
    is_relevant,
    node_state,
    object_version,
    pending_pool,
    pod_record,
    pod_ref,
    workload_pod,
)
from tf_shell.kube.api import RawObject, WatchEvent
from vgpu.contract.allocation import GpuGrant
from vgpu.contract.claims import Claim
from vgpu.names import Qos
from vgpu.scheduling.ledger import EntryState, Ledger, LedgerEntry, LedgerRefusal, held_vram
from vgpu.scheduling.model import NodeState, Snapshot, workload_key

log = logging.getLogger(__name__)
# pod_version of a pod whose deletion the watch showed: beyond any version a claim can be conditional on.
GONE: Final = sys.maxsize
GONE_KEPT: Final = 1 << 16  # UIDs of deleted pods remembered (~5 MB); an older one's claim is read instead


@dataclass(frozen=True, slots=True)
class Nomination:
    """GPUs promised to a preemptor on a node: taken as its reservation once free, or dropped at expiry."""

    uid: str
    node: str
    grants: tuple[GpuGrant, ...]
    qos: Qos
    slots: int
    expires_at: float


class ClusterCache:
    """Thread-safe. ``clock`` gives wall-clock seconds (reservation expiry)."""

    def __init__(self, *, default_pool: str, gate: HandoffGate, clock: Callable[[], float] = time.time) -> None:
        self.default_pool = default_pool
        self.gate = gate
        self.clock = clock
        self.lock = threading.RLock()
        self.synced: set[Kind] = set()
        self._base: dict[str, NodeState] = {}
        self._view: dict[str, NodeState] = {}
        self._ledgers: dict[str, Ledger] = {}  # node -> that node's ledger
        self._entry_node: dict[str, str] = {}  # ledger key -> node of its entry
        self._records: dict[str, PodRecord] = {}  # uid -> pod holding an allocation
        self._owner: dict[str, str] = {}  # ledger key -> uid of the pod that owns the entry
        self._tentative: dict[str, float] = {}  # ledger key -> expiry, for filter/prioritize reservations
        self._conflicts: dict[str, str] = {}  # uid -> why its allocation could not be accounted
        self._accounting = False  # inside _account_conflicts (it must not re-enter itself)
        self._pods_version = 0  # the highest pod resourceVersion delivered (seen_version)
        self._versions: dict[str, int] = {}  # uid -> resourceVersion, of every live pod (pod_version)
        self._gone: OrderedDict[str, None] = OrderedDict()  # uids of pods the watch saw go, newest last
        self._node_uids: dict[str, str] = {}  # node name -> its UID (node_uid)
        self._avoid: dict[str, tuple[Taint, ...]] = {}  # node name -> its PreferNoSchedule taints (avoided_by)
        self._since_listing: set[str] | None = None  # keys reserved/committed since a pod LIST was requested
        self._workloads: dict[str, Counter[str]] = {}  # workload_key -> node -> pods
        # Pods bound to a node and holding vGPU device IDs there without an allocation of their own
        # (bound by hand, static): the kubelet counts their IDs, so the node's free slots must too.
        self._foreign: dict[str, tuple[str, int]] = {}  # uid -> (node, device IDs)
        self._foreign_ids: Counter[str] = Counter()  # node -> device IDs held by foreign pods
        self._workload_view: Mapping[str, frozenset[str]] | None = None
        # Live pods naming a TensorFusionWorkload, allocated or not: its status names those still waiting.
        self._members: dict[str, WorkloadPod] = {}  # uid -> member
        self._pending: dict[str, str] = {}  # uid -> pool, of each GPU pod waiting for a node (pending_pool)
        # Room promised to a preemptor (preemptor.py) on a node whose victims are still leaving: taken as
        # the pod's tentative reservation the moment it fits, before any other pod can take it.
        self._nominated: dict[str, Nomination] = {}  # ledger key -> nomination

    # --- informer sink ----------------------------------------------------------------------------
    def listing(self, kind: Kind) -> None:
        if kind is Kind.POD:
            with self.lock:
                self._since_listing = set()

    def replace(self, kind: Kind, items: list[RawObject]) -> None:
        with self.lock:
            if kind is Kind.NODE:
                self._replace_nodes(items)
            else:
                self._replace_pods(items)
                self._pods_version = max((object_version(i) for i in items), default=0)
            self.synced.add(kind)

    def apply(self, kind: Kind, event: WatchEvent) -> None:
        with self.lock:
            if kind is Kind.NODE:
                meta = event.object.get("metadata") or {}
                name = str(meta.get("name") or "")
                if event.type == "DELETED":
                    self._base.pop(name, None)
                    self._view.pop(name, None)
                    self._node_uids.pop(name, None)
                    self._avoid.pop(name, None)
                else:
                    self._node_uids[name] = str(meta.get("uid") or "")
                    self._note_taints(name, event.object)
                    self._set_node(node_state(event.object, self.default_pool))
            elif event.type == "DELETED":
                self._saw_pod_version(event.object)
                ref = pod_ref(event.object)
                self._note_foreign(ref.uid, None)
                self._members.pop(ref.uid, None)
                self._pending.pop(ref.uid, None)
                self._versions.pop(ref.uid, None)
                self._saw_go(ref.uid)
                self._pod_gone(ref)
            else:
                self._saw_pod_version(event.object)
                self._pod_changed(event.object)

    def node_uid(self, name: str) -> str | None:
        """The UID of node ``name`` as the watch shows it (None: unknown)."""
        with self.lock:
            return self._node_uids.get(name) or None

    def pod_version(self, uid: str) -> int | None:
        """The resourceVersion of live pod ``uid`` as the watch last showed it; :data:`GONE` for a pod whose
        deletion it showed (a UID is never reused, so no write conditional on that pod can land any more: a
        claim for it is settled without reading it); None for a pod it does not show."""
        with self.lock:
            return GONE if uid in self._gone else self._versions.get(uid)

    def _saw_go(self, uid: str) -> None:
        self._gone[uid] = None
        self._gone.move_to_end(uid)
        while len(self._gone) > GONE_KEPT:  # the oldest forgotten: a claim of theirs is then read, as before
            self._gone.popitem(last=False)

    def seen_version(self) -> int:
        """The highest pod resourceVersion the watch delivered: everything the cache shows of pods is at least
        this recent (the informer's own resourceVersion, after a list or a bookmark, may be ahead of it)."""
        with self.lock:
            return self._pods_version

    def _saw_pod_version(self, pod: RawObject) -> None:
        self._pods_version = max(self._pods_version, object_version(pod))

    # --- reads ----------------------------------------------------------------------------------
    def snapshot(
        self,
        *,
        drop_tentative_of: str | None = None,
        scheduling: PodRef | None = None,
        extra: Sequence[RawObject] = (),
    ) -> Snapshot:
        """The cluster for one decision.

        ``drop_tentative_of``: a new scheduling attempt of that pod, so its old tentative reservation
        goes. ``scheduling``: the pod the decision is for. kube-scheduler schedules only unbound pods, so
        an allocation the watch shows on it is a bind that died between its write and its Binding (a
        crashed extender replica) or one still running elsewhere: the pod's own room, not another's.
        It is left out of this snapshot (the cache keeps counting it for every other pod), so the pod
        fits where it fitted, even in a full pool; its bind then undoes the stale allocation or backs
        off for a live one (binder.py). ``extra``: Node objects the scheduler sent in full; used for
        nodes the watch has not delivered yet, so a lagging cache does not reject a node it could judge.
        """
        with self.lock:
            self._expire()
            if drop_tentative_of is not None and drop_tentative_of in self._tentative:
                self._release(drop_tentative_of)
            nodes = dict(self._view)
            own = self._records.get(scheduling.uid) if scheduling is not None else None
            if own is not None and own.allocation is not None and own.node_name is None:
                held_on, key = own.allocation.node, own.ref.key
                base = self._base.get(held_on)
                if base is not None and self._owner.get(key) == own.ref.uid and key not in self._tentative:
                    nodes[held_on] = self._view_of(base, self._ledger(held_on).release(key))
            for item in extra:
                node = node_state(item, self.default_pool)
                if node.name and node.name not in nodes:
                    nodes[node.name] = self._ledger(node.name).apply_node(node)
            return Snapshot(nodes=MappingProxyType(nodes), workload_nodes=self._workload_nodes())

    def avoided_by(self, names: Sequence[str], tolerations: Sequence[Toleration]) -> bool:
        """Whether one of the nodes ``names`` has a PreferNoSchedule taint these tolerations do not tolerate
        (kube-scheduler's TaintToleration scores it lower: in_tree.py)."""
        with self.lock:
            if not self._avoid:
                return False
            among = set(names)
            return any(
                not tolerated(taint, tolerations)
                for name, taints in self._avoid.items()
                if name in among
                for taint in taints
            )

    def node(self, name: str) -> NodeState | None:
        with self.lock:
            return self._view.get(name)

    def node_with(self, name: str, claims: Sequence[Claim]) -> NodeState | None:
        """The node's view with ``claims`` held too (other replicas' writes in flight there: arbiter.py).
        Raises LedgerRefusal when they do not fit beside what the ledger holds."""
        with self.lock:
            base = self._base.get(name)
            if base is None or not claims:
                return self._view.get(name)
            ledger = self._ledger(name)
            for i, claim in enumerate(claims):  # a key no pod has: "<namespace>/<name>" never holds a space
                key = f"claim {i} {claim.pod}"
                ledger = ledger.reserve(
                    key, base, claim.gpus, None, slots=claim.slots, past_slices=True, past_limits=True
                )
            return self._view_of(base, ledger)

    def base_node(self, name: str) -> NodeState | None:
        with self.lock:
            return self._base.get(name)

    def nodes(self) -> tuple[NodeState, ...]:
        with self.lock:
            return tuple(self._view.values())

    def entry(self, key: str) -> LedgerEntry | None:
        with self.lock:
            return self._entry(key)

    def entries(self) -> dict[str, LedgerEntry]:
        """Every ledger entry (reserved and committed), by pod key."""
        with self.lock:
            return {k: e for ledger in self._ledgers.values() for k, e in ledger.entries().items()}

    def records_on(self, node: str) -> tuple[PodRecord, ...]:
        """Pods holding GPUs on ``node`` (for preemption)."""
        with self.lock:
            return tuple(r for r in self._records.values() if r.allocation and r.allocation.node == node)

    def counted_on(self, node: str) -> dict[str, tuple[GpuGrant, ...]]:
        """Per pod UID, the grants ``node``'s ledger counts for it: written allocations and binds' holds,
        not filter/prioritize guesses."""
        with self.lock:
            entries = self._ledger(node).entries()
            return {self._owner[k]: e.grants for k, e in entries.items() if k not in self._tentative}

    def records(self) -> tuple[PodRecord, ...]:
        """Every pod that holds GPUs."""
        with self.lock:
            return tuple(self._records.values())

    def workload_pods(self) -> tuple[tuple[PodRecord, ...], tuple[WorkloadPod, ...]]:
        """Read together: every pod that holds GPUs, and the live pods naming a workload that hold none."""
        with self.lock:
            waiting = tuple(m for uid, m in self._members.items() if uid not in self._records)
            return tuple(self._records.values()), waiting

    def record(self, uid: str) -> PodRecord | None:
        with self.lock:
            return self._records.get(uid)

    def conflicts(self) -> Mapping[str, str]:
        with self.lock:
            return dict(self._conflicts)

    def pending_by_pool(self) -> Counter[str]:
        """GPU pods waiting for a node (unbound, unallocated, alive), per pool of their request."""
        with self.lock:
            return Counter(self._pending.values())

    def handing_over(self, ref: PodRef, sizes: frozenset[int] = frozenset()) -> set[str]:
        """Nodes about to hand GPUs over to a pod other than ``ref`` (of Allocate ``sizes``): another pod holds
        a tentative reservation there (the node the scheduler most likely binds it to) or the node's hand-off
        gate for a size ``ref``'s bind would wait on."""
        with self.lock:
            likely = {self._entry_node[k] for k in self._tentative if k != ref.key and k in self._entry_node}
        return likely | self.gate.busy_nodes(ref.uid, sizes)

    def tentative_count(self) -> int:
        with self.lock:
            return len(self._tentative)

    # --- reservations -----------------------------------------------------------------------------
    def reserve(
        self, ref: PodRef, node: str, grants: Sequence[GpuGrant], *, qos: Qos, expires_at: float | None, slots: int = 1
    ) -> None:
        """Reserve ``grants`` (and ``slots`` vGPU device IDs on each) on ``node`` for the pod, replacing its
        own uncommitted reservation.

        ``expires_at`` None: a bind's reservation (released or committed by the binder); a time: a
        tentative one from filter/prioritize. Raises LedgerRefusal and changes nothing when it does not fit.
        A tentative reservation leaves a pod's bind hold or committed allocation as it is: kube-scheduler
        may schedule a pod again while a bind of it still runs (it gave up waiting), and turning that
        bind's hold into a reservation that expires let the hold vanish under the bind — whose commit
        then failed after its Binding was posted, and whose GPUs were counted free.
        """
        with self.lock:
            base = self._base.get(node)
            if base is None:
                raise KeyError(node)
            key = ref.key
            entry = self._entry(key)
            if expires_at is not None and entry is not None and key not in self._tentative:
                return
            changed = entry is not None and (entry.node, entry.grants, entry.slots) != (node, tuple(grants), slots)
            if changed and key in self._tentative:
                self._release(key)
            self._put(node, self._ledger(node).reserve(key, base, grants, expires_at, qos=qos, slots=slots))
            self._note_since_listing(key)
            self._entry_node[key] = node
            self._owner[key] = ref.uid
            if expires_at is None:
                self._tentative.pop(key, None)
            else:
                self._tentative[key] = expires_at
            self._refresh({node} | ({entry.node} if entry is not None else set()))

    def nominate(
        self, ref: PodRef, node: str, grants: Sequence[GpuGrant], *, qos: Qos, slots: int, expires_at: float
    ) -> None:
        """Hold ``grants`` on ``node`` for the pod once they are free (its victims gone), until ``expires_at``:
        a tentative reservation as soon as they fit, so the pod's next filter finds them and no other
        pod's does. Replaces the pod's earlier nomination."""
        with self.lock:
            self._nominated[ref.key] = Nomination(ref.uid, node, tuple(grants), qos, slots, expires_at)
            self._claim_nominations(node)

    def resize(self, ref: PodRef, grants: Sequence[GpuGrant]) -> int | None:
        """Hold ``grants`` in place of the pod's allocation on its node (the autoscaler changing a running
        pod's requests), when they fit beside everything else the node's ledger holds; the hold is a bind's
        (no expiry) until :meth:`commit`, or until the watch delivers the allocation written for it. Returns
        the device IDs it holds per GPU (its claim's), or None, changing nothing, when it does not fit or
        the pod holds no allocation (or only a filter's guess) here.

        A change that holds no more VRAM on any GPU than the entry did (a lowered limit, a TFLOPS change) is
        never refused for VRAM limits: on a GPU that written allocations already over-commit by their limits
        it makes things no worse, and refusing it would keep the over-commitment. Its slots are the entry's
        own, so they are counted as they were."""
        with self.lock:
            key = ref.key
            entry, node = self._entry(key), self._entry_node.get(key)
            base = None if node is None else self._base.get(node)
            if entry is None or node is None or base is None or self._owner.get(key) != ref.uid:
                return None
            if key in self._tentative:
                return None
            old = {g.uuid: held_vram(g) for g in entry.grants}
            grows = any(held_vram(g) > old.get(g.uuid, 0) for g in grants)
            try:
                ledger = (
                    self._ledger(node)
                    .release(key)
                    .reserve(
                        key,
                        base,
                        grants,
                        None,
                        whole=entry.whole,
                        qos=entry.qos,
                        slots=entry.slots,
                        past_slices=True,
                        past_limits=not grows,
                    )
                )
            except LedgerRefusal:
                return None
            self._put(node, ledger)
            self._note_since_listing(key)
            self._refresh((node,))
            return entry.slots

    def reaccount(self, uid: str) -> None:
        """Enter the pod's allocation as the watch last showed it again, over whatever this replica holds for
        it (a resize's hold being undone); an allocation that does not fit is a conflict, accounted again when
        room frees, as one the watch delivered."""
        with self.lock:
            record = self._records.get(uid)
            if record is not None and record.allocation is not None:
                self._account(record)

    def commit(self, key: str) -> bool:
        """Make a bind's reservation permanent. False, changing nothing, when the pod holds none any more:
        it went away while its bind ran (the watch released its hold), so there is nothing to keep."""
        with self.lock:
            node = self._entry_node.get(key)
            if node is None:
                return False
            self._put(node, self._ledger(node).commit(key))
            self._note_since_listing(key)
            self._tentative.pop(key, None)
            return True

    def expire(self) -> int:
        """Release every tentative reservation whose time is up; returns how many."""
        with self.lock:
            return self._expire()

    def release(self, key: str, uid: str) -> None:
        """Drop the pod's ledger entry if that pod still owns it (idempotent)."""
        with self.lock:
            if self._owner.get(key, uid) == uid:
                self._release(key)

    def release_reserved(self, key: str, uid: str) -> None:
        """Drop the pod's entry only while it is a reservation (a bind's own hold): a committed one is an
        allocation the watch saw on the pod, written by whoever wrote it, and stays until the watch says."""
        with self.lock:
            entry = self._entry(key)
            if entry is not None and entry.state is EntryState.RESERVED:
                self.release(key, uid)

    # --- internals (caller holds the lock) ------------------------------------------------------------
    def _note_since_listing(self, key: str) -> None:
        if self._since_listing is not None:
            self._since_listing.add(key)

    def _expire(self) -> int:
        now = self.clock()
        due = [k for k, at in self._tentative.items() if at <= now]
        for key in due:
            self._release(key)
        return len(due)

    def _ledger(self, node: str) -> Ledger:
        return self._ledgers.get(node) or Ledger()

    def _put(self, node: str, ledger: Ledger) -> None:
        if ledger.entries():
            self._ledgers[node] = ledger
        else:
            self._ledgers.pop(node, None)

    def _entry(self, key: str) -> LedgerEntry | None:
        node = self._entry_node.get(key)
        return None if node is None else self._ledger(node).entry(key)

    def _release(self, key: str) -> None:
        node = self._entry_node.pop(key, None)
        self._tentative.pop(key, None)
        self._owner.pop(key, None)
        if node is not None:
            self._put(node, self._ledger(node).release(key))
            self._refresh((node,))
            self._account_conflicts(node)
            self._claim_nominations(node)

    def _account_conflicts(self, node: str) -> None:
        """Account again the written allocations on ``node`` that did not fit its ledger when they were seen
        (a bind's hold or another replica's stale allocation held their room): room was just freed there.
        Left uncounted, such an allocation is room the placement offers but the API server's list shows
        taken — a bind that retries the same place backs off for ever (the arbitration in binder.py)."""
        if self._accounting:
            return  # _account releases entries itself; the outer pass goes on with the rest
        self._accounting = True
        try:
            for uid in list(self._conflicts):
                record = self._records.get(uid)
                if record is not None and record.allocation is not None and record.allocation.node == node:
                    self._account(record)
        finally:
            self._accounting = False

    def _claim_nominations(self, node: str) -> None:
        """Turn the nominations on ``node`` that fit now into their pods' tentative reservations."""
        now = self.clock()
        base = self._base.get(node)
        for key, held in list(self._nominated.items()):
            if held.expires_at <= now:
                del self._nominated[key]
            elif held.node == node and base is not None and key not in self._entry_node:
                try:
                    ledger = self._ledger(node).reserve(
                        key, base, held.grants, held.expires_at, qos=held.qos, slots=held.slots
                    )
                except LedgerRefusal:
                    continue
                del self._nominated[key]
                self._put(node, ledger)
                self._entry_node[key] = node
                self._owner[key] = held.uid
                self._tentative[key] = held.expires_at
                self._refresh((node,))

    def _refresh(self, nodes: Iterable[str]) -> None:
        for name in nodes:
            base = self._base.get(name)
            if base is not None:
                self._view[name] = self._view_of(base, self._ledger(name))

    def _view_of(self, base: NodeState, ledger: Ledger) -> NodeState:
        """The node as decisions see it: ``ledger``'s usage, and the device IDs pods without allocations hold."""
        view = ledger.apply_node(base)
        foreign = self._foreign_ids.get(base.name, 0)
        return replace(view, slots_used=view.slots_used + foreign) if foreign else view

    def _note_foreign(self, uid: str, held: tuple[str, int] | None) -> None:
        """Track pod ``uid`` as holding ``held`` = (node, device IDs) without an allocation, or (None) not."""
        old = self._foreign.get(uid)
        if old == held:
            return
        if old is not None:
            del self._foreign[uid]
            self._foreign_ids[old[0]] -= old[1]
            if self._foreign_ids[old[0]] <= 0:
                del self._foreign_ids[old[0]]
        if held is not None:
            self._foreign[uid] = held
            self._foreign_ids[held[0]] += held[1]
        self._refresh({pair[0] for pair in (old, held) if pair is not None})

    def _note_taints(self, name: str, node: RawObject) -> None:
        taints = prefer_no_schedule(node)
        if taints:
            self._avoid[name] = taints
        else:
            self._avoid.pop(name, None)

    def _set_node(self, node: NodeState) -> None:
        if self._base.get(node.name) == node:
            return
        self._base[node.name] = node
        for record in self._records.values():
            if record.allocation and record.allocation.node == node.name and record.ref.uid in self._conflicts:
                self._account(record)
        self._refresh((node.name,))

    def _replace_nodes(self, items: list[RawObject]) -> None:
        metas = [item.get("metadata") or {} for item in items]
        self._node_uids = {str(m.get("name") or ""): str(m.get("uid") or "") for m in metas}
        self._avoid = {}
        for meta, item in zip(metas, items, strict=True):
            self._note_taints(str(meta.get("name") or ""), item)
        fresh = {n.name: n for n in (node_state(item, self.default_pool) for item in items) if n.name}
        for gone in set(self._base) - set(fresh):
            self._base.pop(gone)
            self._view.pop(gone, None)
        for node in fresh.values():
            self._set_node(node)

    def _replace_pods(self, items: list[RawObject]) -> None:
        held: dict[str, tuple[str, int] | None] = {}
        records: dict[str, PodRecord] = {}
        for item in items:
            ids = vgpu_device_ids(item) or 0
            relevant = is_relevant(item)
            record = pod_record(item) if relevant or ids else None
            held[pod_ref(item).uid] = _foreign_hold(record, ids)
            if relevant and record is not None:
                records[record.ref.uid] = record
        self._members = {m.ref.uid: m for m in map(workload_pod, items) if m is not None}
        self._pending = {pod_ref(item).uid: pool for item in items if (pool := pending_pool(item)) is not None}
        listed = {pod_ref(item).uid: object_version(item) for item in items}
        for uid in self._versions.keys() - listed.keys():  # deleted while the watch was down
            self._saw_go(uid)
        self._versions = listed
        for uid in set(self._foreign) - held.keys():
            self._note_foreign(uid, None)
        for uid, hold in held.items():
            self._note_foreign(uid, hold)
        for uid, old in list(self._records.items()):
            if uid not in records:
                self._pod_gone(old.ref)
        for record in records.values():
            self._record_changed(record)
        self.gate.replace(records.values())
        self._drop_unlisted(set(held))

    def _drop_unlisted(self, listed: set[str]) -> None:
        """After a relist, release what the LIST contradicts.

        A committed entry whose pod the LIST does not show holding GPUs (gone, finished, unallocated),
        and a tentative one whose pod it does not show at all. Binds in progress keep their reservation,
        and whatever was reserved or committed after the LIST was requested stays.
        """
        recent, self._since_listing = self._since_listing or set(), None
        for key, uid in list(self._owner.items()):
            if key in recent or uid in self._records:
                continue
            if key in self._tentative:
                stale = uid not in listed
            else:
                entry = self._entry(key)
                stale = entry is not None and entry.state is EntryState.COMMITTED
            if stale:
                log.info("relist: pod %s holds no GPUs any more; releasing what the extender held for it", key)
                self._release(key)
                self.gate.forget(uid)

    def _pod_changed(self, obj: RawObject) -> None:
        ref = pod_ref(obj)
        self._versions[ref.uid] = object_version(obj)
        ids = vgpu_device_ids(obj) or 0
        relevant = is_relevant(obj) or ref.uid in self._records
        record = pod_record(obj) if relevant or ids else None
        if relevant and record is not None:
            self._record_changed(record)
            self.gate.observe(record)
        self._note_foreign(ref.uid, _foreign_hold(record, ids))
        member = workload_pod(obj)
        if member is None:
            self._members.pop(ref.uid, None)
        else:
            self._members[ref.uid] = member
        pool = pending_pool(obj)
        if pool is None:
            self._pending.pop(ref.uid, None)
        else:
            self._pending[ref.uid] = pool

    def _pod_gone(self, ref: PodRef) -> None:
        old = self._records.pop(ref.uid, None)
        if old is not None:
            self._track_workload(old, -1)
        self._conflicts.pop(ref.uid, None)
        held = self._nominated.get(ref.key)
        if held is not None and held.uid == ref.uid:
            del self._nominated[ref.key]
        if self._owner.get(ref.key) == ref.uid:
            self._release(ref.key)
        self.gate.forget(ref.uid)

    def _record_changed(self, record: PodRecord) -> None:
        uid = record.ref.uid
        old = self._records.get(uid)
        if not record.holds_gpus:
            if old is not None:
                self._pod_gone(record.ref)
            if record.allocation_error:
                log.warning("pod %s: ignoring its allocation: %s", record.ref.key, record.allocation_error)
            return
        self._records[uid] = record
        if old is None or old.workload != record.workload or old.allocation != record.allocation:
            if old is not None:
                self._track_workload(old, -1)
            self._track_workload(record, +1)
        if old is None or old.allocation != record.allocation or uid in self._conflicts:
            self._account(record)

    def _account(self, record: PodRecord) -> None:
        """Enter a pod's allocation annotation into the ledger as committed. A written allocation is counted
        even past a GPU's slices, and past its memory by its VRAM limits (only its requests must fit): one
        written before limits were held, or a limit another replica raised while this one's bind holds the
        room (whichever of the two writers lists the node's allocations last backs off: binder.py,
        autoscaler/resize.py). Counted, it leaves no room there until it goes; refused, none of it would count."""
        alloc = record.allocation
        assert alloc is not None
        key, uid = record.ref.key, record.ref.uid
        base = self._base.get(alloc.node)
        if base is None:
            self._conflicts[uid] = f"node {alloc.node} is not known (yet)"
            return
        entry = self._entry(key)
        if entry is not None and (
            self._owner.get(key) != uid
            or (entry.node, entry.grants, entry.slots) != (alloc.node, alloc.gpus, record.slots)
        ):
            self._release(key)
        try:
            ledger = (
                self._ledger(alloc.node)
                .reserve(
                    key, base, alloc.gpus, None, qos=alloc.qos, slots=record.slots, past_slices=True, past_limits=True
                )
                .commit(key)
            )
        except LedgerRefusal:
            # A written allocation is a fact; tentative reservations on that node are only guesses.
            for guess in [k for k in self._tentative if self._entry_node.get(k) == alloc.node]:
                self._release(guess)
            try:
                ledger = (
                    self._ledger(alloc.node)
                    .reserve(
                        key,
                        base,
                        alloc.gpus,
                        None,
                        qos=alloc.qos,
                        slots=record.slots,
                        past_slices=True,
                        past_limits=True,
                    )
                    .commit(key)
                )
            except LedgerRefusal as refusal:
                if self._conflicts.get(uid) != str(refusal.reason):  # said once per reason, not per retry
                    log.error("pod %s: its allocation does not fit the ledger: %s", key, refusal.reason)
                self._conflicts[uid] = str(refusal.reason)
                return
        self._conflicts.pop(uid, None)
        self._put(alloc.node, ledger)
        self._entry_node[key] = alloc.node
        self._owner[key] = uid
        self._tentative.pop(key, None)
        self._refresh((alloc.node,))

    def _track_workload(self, record: PodRecord, delta: int) -> None:
        if record.workload is None or record.allocation is None:
            return
        key = workload_key(record.ref.namespace, record.workload)
        counts = self._workloads.setdefault(key, Counter())
        counts[record.allocation.node] += delta
        if counts[record.allocation.node] <= 0:
            del counts[record.allocation.node]
        if not counts:
            del self._workloads[key]
        self._workload_view = None

    def _workload_nodes(self) -> Mapping[str, frozenset[str]]:
        if self._workload_view is None:
            self._workload_view = MappingProxyType({w: frozenset(c) for w, c in self._workloads.items()})
        return self._workload_view


def _foreign_hold(record: PodRecord | None, ids: int) -> tuple[str, int] | None:
    """(node, device IDs) a pod holds there without an allocation of its own, the kubelet having bound it
    and given it IDs; None when it holds none that way (unbound, finished, or allocated by us)."""
    if record is None or ids <= 0 or not record.node_name or record.terminal or record.allocation is not None:
        return None
    return record.node_name, ids
