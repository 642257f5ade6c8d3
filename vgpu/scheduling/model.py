"""The plain values the scheduling core decides over: GPUs, nodes, a cluster snapshot, a pod's demand.

Everything here is a frozen dataclass built by the shell (from the cluster cache) or by the
benchmark (from a trace), so that filter/score/place/ledger are pure functions of these values
and the extender and the trace replay run exactly the same decisions.
Units: TFLOPS in milli-TFLOPS, VRAM in bytes, CPU in millicores, memory in bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Final

from vgpu.names import DEFAULT_SLICES_PER_GPU, IsolationMode, PlacementPolicy, Qos

EVERY_MODE: Final = frozenset(IsolationMode)  # a GPU whose modes nobody said (trace replay, benchmarks)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuState:
    """One physical GPU and what is already reserved on it: ``tflops_used`` sums the granted TFLOPS
    *requests* (compute may be over-subscribed by limits: it is shared by time), ``vram_used`` the VRAM the
    grants *hold*, each the larger of its request and its limit (memory cannot be taken back, so a pod's
    VRAM limit is room it holds: :func:`vgpu.scheduling.ledger.held_vram`).

    ``slots`` are the GPU's vGPU device IDs (the device plugin's slices): each container of a pod
    granted the GPU holds one, so they cap how many containers share it; ``slots_used`` is how many
    the ledger has placed on it.
    """

    uuid: str
    index: int
    model: str
    tflops: int
    vram: int
    healthy: bool = True
    numa: int | None = None
    tflops_used: int = 0
    vram_used: int = 0
    pods: int = 0  # pods holding a share of this GPU
    whole: bool = False  # held exclusively by a whole-GPU pod
    slots: int = DEFAULT_SLICES_PER_GPU
    slots_used: int = 0
    isolation: frozenset[IsolationMode] = EVERY_MODE  # the modes it serves (the inventory's; docs/isolation.md)

    @property
    def tflops_free(self) -> int:
        return self.tflops - self.tflops_used

    @property
    def vram_free(self) -> int:
        return self.vram - self.vram_used


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeTotals:
    """What scoring and rejection explanations read off a node state, computed once per state.

    Sums are over all GPUs (healthy or not). ``healthy``/``shared`` keep GPU order; ``most_*_free``
    are the first shared GPU with the most free room (as ``max`` picks it), None without shared GPUs;
    ``uniform`` is the (TFLOPS, VRAM) capacity every healthy GPU has, None when they differ or none is.
    ``slots`` counts the healthy GPUs' slots only: the kubelet admits against healthy device IDs.
    """

    tflops: int
    vram: int
    tflops_used: int
    vram_used: int
    all_healthy: bool
    models: tuple[str, ...]  # distinct product names, in GPU order
    healthy: tuple[GpuState, ...]
    shared: tuple[GpuState, ...]  # healthy and not held whole
    most_vram_free: GpuState | None
    most_tflops_free: GpuState | None
    uniform: tuple[int, int] | None
    slots: int
    isolation: frozenset[IsolationMode]  # the modes every GPU serves


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeState:
    """One node as the extender knows it. ``inventory_error`` is set when its inventory is corrupt.

    ``slots_used``: vGPU device IDs held by the pods the ledger has on this node, whichever GPU they
    were granted (one the inventory no longer lists included): the kubelet counts the node's total.
    """

    name: str
    pool: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[GpuState, ...] = ()
    inventory_error: str | None = None
    # Non-GPU resources, used by the trace replay (kube-scheduler checks them in-tree for real pods).
    cpu_free: int | None = None
    memory_free: int | None = None
    slots_used: int = 0
    # Lazily filled by totals() and state(); never passed, compared or copied by dataclasses.replace.
    _totals: NodeTotals | None = field(default=None, init=False, repr=False, compare=False)
    _state: int | None = field(default=None, init=False, repr=False, compare=False)

    def totals(self) -> NodeTotals:
        """This state's GPU sums, computed on first use and kept for the life of the (immutable) state.

        Scoring reads them for every fitting node and the filter for every rejected one on every cold
        request; a node's state object only changes when something is reserved or released on it, so
        most requests find them ready.
        Filling the cache slot is the one write to a frozen value: idempotent, so a race is harmless.
        """
        totals = self._totals
        if totals is None:
            gpus = self.gpus
            healthy = tuple(g for g in gpus if g.healthy)
            shared = tuple(g for g in healthy if not g.whole)
            sizes = {(g.tflops, g.vram) for g in healthy}
            totals = NodeTotals(
                tflops=sum(g.tflops for g in gpus),
                vram=sum(g.vram for g in gpus),
                tflops_used=sum(g.tflops_used for g in gpus),
                vram_used=sum(g.vram_used for g in gpus),
                all_healthy=len(healthy) == len(gpus),
                models=tuple(dict.fromkeys(g.model for g in gpus)),
                healthy=healthy,
                shared=shared,
                most_vram_free=max(shared, key=lambda g: g.vram - g.vram_used) if shared else None,
                most_tflops_free=max(shared, key=lambda g: g.tflops - g.tflops_used) if shared else None,
                uniform=sizes.pop() if len(sizes) == 1 else None,
                slots=sum(g.slots for g in healthy),
                isolation=EVERY_MODE.intersection(*(g.isolation for g in gpus)),
            )
            object.__setattr__(self, "_totals", totals)
        return totals

    def state(self) -> int:
        """A number shared by every node state with the same capacity and reservations, GPU by GPU in order.

        What it covers is everything the fit check and a state-scored policy read of a node, except
        its identity: the pool, the inventory error, free CPU and memory, the node's used device IDs
        and each GPU's model, size, health, NUMA node, reservations, pods, whole-holding, slots and
        isolation modes.
        Not the name, the labels or the GPU UUIDs. So two nodes of one state fit the same demands
        (node affinity aside) and get the same score from such a policy, so a cold decision judges a
        fitting state once (:func:`vgpu.scheduling.filter.filter_nodes`): large clusters have
        many nodes alike (empty ones, full ones, ones packed alike by the same workloads).
        Computed once per (immutable) state, like :meth:`totals`.
        """
        number = self._state
        if number is None:
            number = _state_number(
                (
                    self.pool,
                    self.inventory_error,
                    self.cpu_free,
                    self.memory_free,
                    self.slots_used,
                    *map(_gpu_state, self.gpus),
                )
            )
            object.__setattr__(self, "_state", number)
        return number


def _gpu_state(g: GpuState) -> tuple[object, ...]:
    return (
        g.model,
        g.tflops,
        g.vram,
        g.healthy,
        g.numa,
        g.tflops_used,
        g.vram_used,
        g.pods,
        g.whole,
        g.slots,
        g.slots_used,
        g.isolation,
    )


# Node states seen, numbered. A number is never given twice, so equal numbers always mean equal states;
# the table is dropped when it grows past its bound (a long-lived extender sees states come and go: every
# bind makes one), after which a state seen before gets a new number: a missed sharing, never a wrong one.
# The bound holds ~1.3 KB a key for 8-GPU nodes, ~20 MB at most; the cyclic GC stops walking these tuples of
# plain values after a collection or two (CPython untracks them).
_STATES: dict[tuple[object, ...], int] = {}
_STATES_BOUND: Final = 1 << 14
_numbers = count()


def _state_number(key: tuple[object, ...]) -> int:
    number = _STATES.get(key)
    if number is None:
        if len(_STATES) >= _STATES_BOUND:
            _STATES.clear()
        number = _STATES.setdefault(key, next(_numbers))
    return number


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """What one pod needs, per GPU, resolved from its GpuRequest (or a trace row)."""

    pod_key: str  # "<namespace>/<name>"
    gpu_count: int
    tflops: int  # per-GPU request (reserved)
    vram: int  # per-GPU request (reserved)
    tflops_limit: int
    vram_limit: int  # per-GPU; held on the GPU like the request (see vram_held)
    qos: Qos = Qos.MEDIUM
    pool: str | None = None
    gpu_model: str | None = None
    workload: str | None = None  # workload_key() of the workload the pod belongs to
    is_local_gpu: bool = False
    policy: PlacementPolicy | None = None
    node_affinity: Mapping[str, Any] | None = None
    whole_gpu: bool = False  # asks for entire GPUs (never shares with fractional pods)
    isolation: IsolationMode | None = None  # only GPUs serving this mode (None: any)
    gpu_indices: frozenset[int] | None = None  # only the node's GPUs of these indices (None: any)
    slots: int = 1  # vGPU device IDs per granted GPU: one per GPU container (demand.gpu_slots)
    cpu: int = 0
    memory: int = 0
    # Compute in thousandths of a percent of each GPU (both or neither): then ``tflops``/``tflops_limit`` are
    # the admission charge until compute_share.on_node converts them for one node's GPUs.
    compute_percent: int | None = None
    compute_percent_limit: int | None = None

    @property
    def vram_held(self) -> int:
        """The VRAM the pod takes on each granted GPU: the larger of its request and its limit. A pod may
        allocate up to its limit at any moment and memory is not taken back, so every fit, score and
        reservation counts this, not the request (vgpu/scheduling/README.md, "VRAM: the limit is held").
        Admission keeps request ≤ limit, so for a pod it is the limit."""
        return self.vram if self.vram >= self.vram_limit else self.vram_limit


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """An immutable view of the cluster for one decision."""

    nodes: Mapping[str, NodeState]
    # workload_key() -> node names where that workload already holds GPUs (local-GPU affinity)
    workload_nodes: Mapping[str, frozenset[str]] = field(default_factory=dict)


def workload_key(namespace: str, workload: str) -> str:
    """``<namespace>/<workload>``: a workload is named per namespace, so same-named ones elsewhere are others."""
    return f"{namespace}/{workload}"
