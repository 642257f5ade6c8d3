"""The extender's own account of what every GPU has promised, kept ahead of the API server.

kube-scheduler binds asynchronously, so capacity is reserved here when a placement is chosen,
committed when the allocation is written, released when the pod goes, and a reservation nobody
committed expires (``expire(now)`` — the caller owns the clock). The ledger is an immutable value:
each transition returns a new ledger, or raises :class:`LedgerRefusal` carrying a :class:`Reason`
and leaves the old one untouched. TFLOPS, VRAM and vGPU slots are counted per GPU, slots per node too.
TFLOPS count requests (compute is shared by time, so limits may over-subscribe it); VRAM counts what a
pod may hold, the larger of its request and its limit (:func:`held_vram`): memory cannot be taken back,
so on one GPU the pods' VRAM limits always fit beside each other.
Why, and what each operation costs: vgpu/scheduling/README.md, section "Ledger".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType

from vgpu.contract.allocation import GpuGrant
from vgpu.names import RESOURCE_VGPU, Qos
from vgpu.quantity import humanize_bytes, humanize_tflops
from vgpu.scheduling.model import NodeState, Snapshot
from vgpu.scheduling.reasons import Reason, ReasonCode

R = ReasonCode


def held_vram(grant: GpuGrant) -> int:
    """The VRAM a grant holds on its GPU: the larger of its request and its limit. A pod may allocate up to
    its limit at any moment and memory is not taken back, so the room it holds is its limit, never less
    than its request (vgpu/scheduling/README.md, "VRAM: the limit is held")."""
    return max(grant.vram_request, grant.vram_limit)


class EntryState(StrEnum):
    RESERVED = "reserved"  # chosen, not yet written on the pod; expires
    COMMITTED = "committed"  # written on the pod; lives until released


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerEntry:
    """One pod's hold on GPUs of one node."""

    pod_key: str
    node: str
    grants: tuple[GpuGrant, ...]
    whole: bool
    qos: Qos
    state: EntryState
    expires_at: float | None
    slots: int = 1  # vGPU device IDs on each granted GPU


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuUsage:
    """What the ledger holds on one GPU: summed TFLOPS requests, summed VRAM held (each grant's larger of
    request and limit: :func:`held_vram`), how many pods, whether one holds it whole, slots; and the summed
    VRAM requests (``vram_requested``), the rule an already written allocation is checked by."""

    tflops: int = 0
    vram: int = 0
    pods: int = 0
    whole: bool = False
    slots: int = 0
    vram_requested: int = 0


_IDLE = GpuUsage()


class LedgerRefusal(Exception):
    """A transition the ledger refused; ``reason`` says why in the core's usual vocabulary."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(reason.message)
        self.reason = reason


def _refuse(code: ReasonCode, message: str, *, requested: int = 0, free: int = 0) -> LedgerRefusal:
    return LedgerRefusal(Reason(code=code, message=message, requested=requested, free=free))


class Ledger:
    """Immutable allocations and reservations keyed by pod key (``<namespace>/<name>``)."""

    __slots__ = ("_entries", "_node_slots", "_usage")

    def __init__(self) -> None:
        self._entries: Mapping[str, LedgerEntry] = MappingProxyType({})
        self._usage: Mapping[str, GpuUsage] = MappingProxyType({})
        self._node_slots: Mapping[str, int] = MappingProxyType({})

    @classmethod
    def _of(
        cls, entries: dict[str, LedgerEntry], usage: Mapping[str, GpuUsage], node_slots: Mapping[str, int]
    ) -> Ledger:
        ledger = cls()
        ledger._entries = MappingProxyType(entries)
        ledger._usage = usage if isinstance(usage, MappingProxyType) else MappingProxyType(usage)
        ledger._node_slots = node_slots if isinstance(node_slots, MappingProxyType) else MappingProxyType(node_slots)
        return ledger

    # --- reading -------------------------------------------------------------------------------

    def entry(self, pod_key: str) -> LedgerEntry | None:
        return self._entries.get(pod_key)

    def entries(self) -> Mapping[str, LedgerEntry]:
        return self._entries

    def usage(self, uuid: str) -> GpuUsage:
        return self._usage.get(uuid, _IDLE)

    def node_slots(self, node: str) -> int:
        """vGPU device IDs the node's entries hold in all."""
        return self._node_slots.get(node, 0)

    def on_node(self, node: str) -> tuple[LedgerEntry, ...]:
        """The entries holding GPUs of this node (O(pods): for preemption, not the hot path)."""
        return tuple(e for e in self._entries.values() if e.node == node)

    def expired(self, now: float) -> tuple[str, ...]:
        """Pod keys of reservations whose time is up (``expires_at <= now``)."""
        return tuple(
            k
            for k, e in self._entries.items()
            if e.state is EntryState.RESERVED and e.expires_at is not None and e.expires_at <= now
        )

    def apply_node(self, node: NodeState) -> NodeState:
        """The node with each GPU's used TFLOPS/VRAM/slots, pod count and whole flag, and the node's used
        slots, taken from the ledger."""
        gpus = []
        changed = False
        for g in node.gpus:
            u = self._usage.get(g.uuid, _IDLE)
            if (g.tflops_used, g.vram_used, g.pods, g.whole, g.slots_used) != (
                u.tflops,
                u.vram,
                u.pods,
                u.whole,
                u.slots,
            ):
                g = replace(g, tflops_used=u.tflops, vram_used=u.vram, pods=u.pods, whole=u.whole, slots_used=u.slots)
                changed = True
            gpus.append(g)
        slots = self._node_slots.get(node.name, 0)
        if changed:
            return replace(node, gpus=tuple(gpus), slots_used=slots)
        return node if node.slots_used == slots else replace(node, slots_used=slots)

    def apply(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot with the ledger's usage on every GPU (O(GPUs); do it once per ledger change)."""
        return replace(snapshot, nodes={name: self.apply_node(n) for name, n in snapshot.nodes.items()})

    # --- transitions ---------------------------------------------------------------------------

    def reserve(
        self,
        pod_key: str,
        node: NodeState,
        grants: Iterable[GpuGrant],
        expires_at: float | None,
        *,
        whole: bool = False,
        qos: Qos = Qos.MEDIUM,
        slots: int = 1,
        past_slices: bool = False,
        past_limits: bool = False,
    ) -> Ledger:
        """Hold the grants' TFLOPS requests, their VRAM (the larger of request and limit: :func:`held_vram`)
        and ``slots`` device IDs on each of the node's granted GPUs; refused if any GPU would be
        over-committed (TFLOPS, VRAM or slots).

        ``past_slices``: count the slots even beyond a GPU's slices — for an allocation already written
        on a pod (bound before slots were counted, or before ``--slices-per-gpu`` was lowered): refusing
        it would count none of what the pod holds, while counting it leaves no room there until it goes.
        ``past_limits``: likewise for VRAM limits — only the VRAM *requests* must fit (the rule before
        limits were held), the limits are counted even past the GPU's memory: an allocation written before
        limits were held, or a limit raised by another extender replica that this one has not yet seen
        (that replica's write-then-list check settles which of the two writes stays).

        Capacity comes from ``node``'s GPUs, usage from the ledger itself (never from the node's
        ``*_used`` fields, so a node that already had the ledger applied is not counted twice).
        Re-reserving the identical entry is a no-op; ``expires_at=None`` never expires.
        """
        grants = tuple(grants)
        existing = self._entries.get(pod_key)
        if existing is not None:
            if (existing.node, existing.grants, existing.whole, existing.slots) == (node.name, grants, whole, slots):
                return self
            raise _refuse(R.POD_EXISTS, f"{pod_key} already holds GPUs on {existing.node}")
        if not grants:
            raise _refuse(R.INVALID_GRANT, f"{pod_key}: a reservation must grant at least one GPU")
        if len({g.uuid for g in grants}) != len(grants):
            raise _refuse(R.INVALID_GRANT, f"{pod_key}: a GPU is granted twice")
        if slots < 0:
            raise _refuse(R.INVALID_GRANT, f"{pod_key}: negative vGPU slots")
        by_uuid = {g.uuid: g for g in node.gpus}
        usage = dict(self._usage)
        for grant in grants:
            gpu = by_uuid.get(grant.uuid)
            if gpu is None:
                raise _refuse(R.UNKNOWN_GPU, f"{pod_key}: node {node.name} has no GPU {grant.uuid}")
            if min(grant.tflops_request, grant.vram_request, grant.vram_limit) < 0:
                raise _refuse(R.INVALID_GRANT, f"{pod_key}: negative request or limit on {grant.uuid}")
            u = usage.get(grant.uuid, _IDLE)
            if whole and u.pods:
                raise _refuse(R.WHOLE_CONFLICT, f"{grant.uuid} is shared by {u.pods} pods; {pod_key} needs it whole")
            if u.whole:
                raise _refuse(R.WHOLE_CONFLICT, f"{grant.uuid} is held whole by another pod")
            held = held_vram(grant)
            tflops, vram, requested = (
                u.tflops + grant.tflops_request,
                u.vram + held,
                u.vram_requested + grant.vram_request,
            )
            if tflops > gpu.tflops:
                free = gpu.tflops - u.tflops
                raise _refuse(
                    R.OVER_COMMIT,
                    f"{pod_key} would over-commit TFLOPS on {grant.uuid}: requested "
                    f"{humanize_tflops(grant.tflops_request)}, free {humanize_tflops(max(free, 0))}",
                    requested=grant.tflops_request,
                    free=free,
                )
            if requested > gpu.vram if past_limits else vram > gpu.vram:
                wanted, free = (
                    (grant.vram_request, gpu.vram - u.vram_requested) if past_limits else (held, gpu.vram - u.vram)
                )
                limit = "" if wanted == grant.vram_request else " (its VRAM limit, which a pod holds)"
                raise _refuse(
                    R.OVER_COMMIT,
                    f"{pod_key} would over-commit VRAM on {grant.uuid}: requested "
                    f"{humanize_bytes(wanted)}{limit}, free {humanize_bytes(max(free, 0))}",
                    requested=wanted,
                    free=free,
                )
            if u.slots + slots > gpu.slots and not past_slices:
                free = gpu.slots - u.slots
                raise _refuse(
                    R.OVER_COMMIT,
                    f"{pod_key} would over-commit {RESOURCE_VGPU} slots on {grant.uuid}: requested {slots}, "
                    f"free {max(free, 0)} of {gpu.slots}",
                    requested=slots,
                    free=free,
                )
            usage[grant.uuid] = GpuUsage(
                tflops=tflops, vram=vram, pods=u.pods + 1, whole=whole, slots=u.slots + slots, vram_requested=requested
            )
        entry = LedgerEntry(
            pod_key=pod_key,
            node=node.name,
            grants=grants,
            whole=whole,
            qos=qos,
            state=EntryState.RESERVED,
            expires_at=expires_at,
            slots=slots,
        )
        node_slots = dict(self._node_slots)
        if slots:
            node_slots[node.name] = self.node_slots(node.name) + slots * len(grants)
        return Ledger._of({**self._entries, pod_key: entry}, usage, node_slots)

    def commit(self, pod_key: str) -> Ledger:
        """Make a reservation permanent (no expiry). Idempotent; refused for a pod the ledger doesn't hold."""
        entry = self._entries.get(pod_key)
        if entry is None:
            raise _refuse(R.UNKNOWN_POD, f"{pod_key} holds no reservation (expired or never made)")
        if entry.state is EntryState.COMMITTED:
            return self
        committed = replace(entry, state=EntryState.COMMITTED, expires_at=None)
        return Ledger._of({**self._entries, pod_key: committed}, self._usage, self._node_slots)

    def release(self, pod_key: str) -> Ledger:
        """Give back everything the pod holds. Idempotent: releasing an unknown pod changes nothing."""
        return self._without((pod_key,)) if pod_key in self._entries else self

    def expire(self, now: float) -> Ledger:
        """Drop every reservation whose ``expires_at <= now``; committed entries never expire."""
        keys = self.expired(now)
        return self._without(keys) if keys else self

    def _without(self, keys: Iterable[str]) -> Ledger:
        entries = dict(self._entries)
        usage = dict(self._usage)
        node_slots = dict(self._node_slots)
        for key in keys:
            entry = entries.pop(key)
            for grant in entry.grants:
                u = usage[grant.uuid]
                if u.pods == 1:
                    del usage[grant.uuid]
                else:  # several pods share it, so none holds it whole
                    usage[grant.uuid] = GpuUsage(
                        tflops=u.tflops - grant.tflops_request,
                        vram=u.vram - held_vram(grant),
                        pods=u.pods - 1,
                        slots=u.slots - entry.slots,
                        vram_requested=u.vram_requested - grant.vram_request,
                    )
            left = node_slots.pop(entry.node, 0) - entry.slots * len(entry.grants)
            if left:
                node_slots[entry.node] = left
        return Ledger._of(entries, usage, node_slots)
