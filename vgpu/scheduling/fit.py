"""Whether one node can hold one pod's GPU demand now, and if not, the single most useful reason.

The rules (DESIGN §4): per GPU, free TFLOPS ≥ request and free VRAM ≥ the larger of the VRAM request and
limit (TFLOPS limits are not reserved: compute is shared by time; a VRAM limit is held, since memory cannot
be taken back: ``Demand.vram_held``, and a GPU's ``vram_used`` counts its pods' alike); ``gpu_count`` such
GPUs on one node; unhealthy GPUs never count; a whole-GPU demand
needs idle GPUs; a fractional demand never shares a GPU held whole; each GPU needs ``demand.slots``
free vGPU slots, and the node's healthy GPUs ``slots × gpu_count`` in all (the kubelet's own check).
This is the inner loop of every filter call, so the happy path is one flat pass over the GPUs and only
a rejected node pays for the explanation; unresolvable reasons come before capacity ones. A demand naming an
isolation mode, or pinning GPU indices, sees only the GPUs it may have (:func:`serving`).
Why, and the budget: vgpu/scheduling/README.md, section "Filter".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache

from vgpu import mig
from vgpu.catalog import Catalog
from vgpu.names import RESOURCE_VGPU
from vgpu.quantity import humanize_bytes, humanize_tflops
from vgpu.scheduling.affinity import node_affinity_matches
from vgpu.scheduling.compute_share import share_on
from vgpu.scheduling.model import Demand, GpuState, NodeState
from vgpu.scheduling.reasons import Reason, ReasonCode

R = ReasonCode
# Rejection messages repeat the same few figures across a thousand nodes; the exact (Fraction-based)
# humanisers are pure, so memoise them.
_bytes = lru_cache(maxsize=4096)(humanize_bytes)
_tflops = lru_cache(maxsize=4096)(humanize_tflops)


class ModelMatcher:
    """``Catalog.matches`` for one requested model, memoised per product name (None: every GPU matches)."""

    __slots__ = ("_catalog", "_every", "_mismatch", "_short", "memo", "requested")

    def __init__(self, catalog: Catalog, requested: str | None) -> None:
        self._catalog = catalog
        self.requested = requested
        self.memo: dict[str, bool] = {}  # product name -> matches; read directly in hot loops
        self._every: dict[tuple[str, ...], bool] = {}
        self._short: dict[str, str] = {}
        self._mismatch: dict[tuple[str, ...], Reason] = {}

    def __call__(self, product: str) -> bool:
        hit = self.memo.get(product)
        if hit is None:
            if self.requested is None:  # any GPU, but a MIG unit only for a pod naming its profile
                hit = mig.split_product(product) is None
            else:
                hit = self._catalog.matches(self.requested, product)
            self.memo[product] = hit
        return hit

    def every(self, products: tuple[str, ...]) -> bool:
        """Whether all of ``products`` match (a node's distinct models: one lookup per node, not per GPU)."""
        hit = self._every.get(products)
        if hit is None:
            hit = self._every[products] = all(map(self, products))
        return hit

    def mismatch(self, node: NodeState) -> Reason:
        """The wrong-model reason for a node none of whose GPUs match (shared by nodes with the same models)."""
        key = tuple(g.model for g in node.gpus)
        reason = self._mismatch.get(key)
        if reason is None:
            models = tuple(sorted({self.short(m) for m in key}))
            reason = self._mismatch[key] = Reason(
                code=R.GPU_MODEL, message=f"no {self.requested} GPU on node (it has {', '.join(models)})", values=models
            )
        return reason

    def short(self, product: str) -> str:
        """The catalog key for a product name (``A100-80GB``), or the name itself when unknown."""
        name = self._short.get(product)
        if name is None:
            model = self._catalog.lookup(product)
            name = self._short[product] = model.key if model is not None else product
        return name


def serving(demand: Demand, node: NodeState) -> NodeState:
    """The node narrowed to the GPUs the demand may have: those serving its isolation mode and, where it pins
    indices, those indices (the same object when every GPU qualifies)."""
    mode, pinned = demand.isolation, demand.gpu_indices
    if (mode is None or mode in node.totals().isolation) and pinned is None:
        return node
    return replace(
        node,
        gpus=tuple(
            g for g in node.gpus if (mode is None or mode in g.isolation) and (pinned is None or g.index in pinned)
        ),
    )


def _unserved_reason(demand: Demand, node: NodeState) -> Reason:
    """Why a node none of whose GPUs the demand may have was rejected: the mode, else the pinned indices."""
    if demand.isolation is not None and not any(demand.isolation in g.isolation for g in node.gpus):
        served = sorted({m.value for g in node.gpus for m in g.isolation})
        listed = ", ".join(served) or "none"
        return Reason(
            code=R.ISOLATION,
            message=f"no GPU on node serves isolation {demand.isolation} (its GPUs serve {listed})",
            values=tuple(served),
        )
    wanted = ",".join(map(str, sorted(demand.gpu_indices or ())))
    have = ",".join(str(g.index) for g in node.gpus)
    return Reason(code=R.GPU_INDICES, message=f"node has no GPU {wanted} serving the pod (its GPUs: {have})")


def eligible_node(demand: Demand, node: NodeState, catalog: Catalog | ModelMatcher) -> NodeState:
    """The node narrowed to its healthy GPUs of the demanded model and isolation mode (the same object if
    none is dropped)."""
    match = catalog if isinstance(catalog, ModelMatcher) else ModelMatcher(catalog, demand.gpu_model)
    node = serving(demand, node)
    totals = node.totals()  # the common case, all healthy and of matching models, without a GPU loop
    if totals.all_healthy and match.every(totals.models):
        return node
    memo = match.memo
    for g in node.gpus:
        ok = memo.get(g.model)
        if not g.healthy or not (match(g.model) if ok is None else ok):
            return replace(node, gpus=tuple(g for g in node.gpus if g.healthy and match(g.model)))
    return node


def gpu_fits(demand: Demand, gpu: GpuState) -> bool:
    """Whether this GPU can take one share of the demand now."""
    s = demand.slots
    if not gpu.healthy or gpu.whole or (s and gpu.slots - gpu.slots_used < s):
        return False
    if demand.whole_gpu:
        return gpu.pods == 0 and gpu.tflops_used == 0 and gpu.vram_used == 0
    return gpu.tflops - gpu.tflops_used >= demand.tflops and gpu.vram - gpu.vram_used >= demand.vram_held


def fitting_gpus(demand: Demand, node: NodeState) -> tuple[GpuState, ...]:
    """The node's GPUs that can take one share of the demand now (model matching is the caller's: use
    an :func:`eligible_node` view)."""
    return tuple(g for g in node.gpus if gpu_fits(demand, g))


def fits(demand: Demand, node: NodeState) -> bool:
    """Whether at least ``gpu_count`` GPUs of an eligible node can take the demand now."""
    return len(fitting_gpus(demand, node)) >= demand.gpu_count


def check_node(demand: Demand, node: NodeState, match: ModelMatcher) -> Reason | None:
    """None when the node can take the demand now, else why not (unresolvable reasons first)."""
    if node.inventory_error is not None:
        return Reason(code=R.INVENTORY_ERROR, message=f"GPU inventory unreadable: {node.inventory_error}")
    if demand.pool is not None and node.pool != demand.pool:
        return Reason(
            code=R.POOL_MISMATCH,
            message=f"node is in GPU pool {node.pool}, pod asks for pool {demand.pool}",
            values=(node.pool,),
        )
    if demand.node_affinity is not None and not node_affinity_matches(demand.node_affinity, node.name, node.labels):
        return Reason(code=R.NODE_AFFINITY, message="node didn't match the pod's node affinity")
    gpus = node.gpus
    if not gpus:
        return Reason(code=R.NO_GPUS, message="node has no GPUs")
    whole_node, node = node, serving(demand, node)
    gpus = node.gpus
    pinned = demand.gpu_indices
    if not gpus or (pinned is not None and len(gpus) < len(pinned)):
        return _unserved_reason(demand, whole_node)
    if demand.compute_percent is not None:  # in TFLOPS of this node's GPUs, or why it cannot be
        share = share_on(demand, node, match)
        if isinstance(share, Reason):
            return share
        demand = share
    need = demand.gpu_count
    t, v, s = demand.tflops, demand.vram_held, demand.slots
    whole = demand.whole_gpu
    memo = match.memo
    for g in gpus:
        if not g.healthy or g.whole or (s and g.slots - g.slots_used < s):
            continue
        ok = memo.get(g.model)
        if not (match(g.model) if ok is None else ok):
            continue
        if whole:
            if g.pods == 0 and g.tflops_used == 0 and g.vram_used == 0:
                need -= 1
        elif g.tflops - g.tflops_used >= t and g.vram - g.vram_used >= v:
            need -= 1
        if need <= 0:
            break
    else:
        if need > 0:  # a CPU-only demand (gpu_count 0, trace replay) needs no GPU
            return _explain(demand, node, match)
    ids = s * demand.gpu_count
    if ids and whole_node.slots_used + ids > whole_node.totals().slots:  # the kubelet counts every GPU's IDs
        return _node_slots(whole_node, ids)
    if node.cpu_free is not None and demand.cpu > node.cpu_free:
        return Reason(
            code=R.INSUFFICIENT_CPU,
            message=f"insufficient cpu: requested {demand.cpu}m, free {node.cpu_free}m",
            requested=demand.cpu,
            free=node.cpu_free,
        )
    if node.memory_free is not None and demand.memory > node.memory_free:
        return Reason(
            code=R.INSUFFICIENT_MEMORY,
            message=(
                f"insufficient memory: requested {humanize_bytes(demand.memory)}, "
                f"free {humanize_bytes(node.memory_free)}"
            ),
            requested=demand.memory,
            free=node.memory_free,
        )
    return None


def _explain(demand: Demand, node: NodeState, match: ModelMatcher) -> Reason:
    return _explain_one(demand, node, match) or _explain_any(demand, node, match)


def _explain_one(demand: Demand, node: NodeState, match: ModelMatcher) -> Reason | None:
    """The usual rejection — one fractional GPU, a node of one matching model and one GPU size — from the
    node's cached totals instead of a pass over its GPUs; None for anything else. Same reasons as
    :func:`_explain_any` (the property tests compare them)."""
    totals = node.totals()
    if demand.gpu_count != 1 or demand.whole_gpu or len(totals.models) != 1 or not match(totals.models[0]):
        return None
    if not totals.healthy:
        return None  # too few healthy GPUs: rare, the full path words it
    t, v = demand.tflops, demand.vram_held
    if totals.uniform is None or totals.uniform[0] < t or totals.uniform[1] < v:
        return None  # mixed sizes or too small: the full path
    most_vram, most_tflops = totals.most_vram_free, totals.most_tflops_free
    if most_vram is None or most_tflops is None:
        return None  # every GPU held whole
    if most_vram.vram - most_vram.vram_used < v:
        return _insufficient(R.INSUFFICIENT_VRAM, "VRAM", v, most_vram, 0, 1, match, _limit_note(demand))
    if most_tflops.tflops - most_tflops.tflops_used < t:
        return _insufficient(R.INSUFFICIENT_TFLOPS, "TFLOPS", t, most_tflops, 0, 1, match)
    return None  # each resource fits on some GPU, never both on one: the full path


def _explain_any(demand: Demand, node: NodeState, match: ModelMatcher) -> Reason:
    count = demand.gpu_count
    t, v = demand.tflops, demand.vram_held
    matched = big = 0
    first: GpuState | None = None
    healthy: list[GpuState] = []
    memo = match.memo
    for g in node.gpus:  # one pass: this runs for every rejected node
        ok = memo.get(g.model)
        if not (match(g.model) if ok is None else ok):
            continue
        matched += 1
        first = first or g
        if g.healthy:
            healthy.append(g)
            if g.tflops >= t and g.vram >= v:
                big += 1
    if first is None:
        return match.mismatch(node)
    model = match.short(first.model)
    if len(healthy) < count:
        return Reason(
            code=R.TOO_FEW_GPUS,
            message=f"node has {len(healthy)} healthy {model} GPUs of {matched}, pod needs {count}",
            requested=count,
            free=len(healthy),
            gpu_model=model,
        )
    if big < count and not demand.whole_gpu:
        return _too_small(demand, healthy, match)
    if demand.whole_gpu:
        idle = [g for g in healthy if not g.whole and g.pods == 0 and g.tflops_used == 0 and g.vram_used == 0]
        busy = Reason(
            code=R.WHOLE_GPU_BUSY,
            message=f"only {len(idle)} of {len(healthy)} {model} GPUs idle, pod needs {count} whole GPUs",
            requested=count,
            free=len(idle),
            gpu_model=model,
        )
        return busy if len(idle) < count else _slot_shortage(demand, node, idle, match) or busy
    shared = [g for g in healthy if not g.whole]
    if len(shared) < count:
        held = len(healthy) - len(shared)
        return Reason(
            code=R.GPU_HELD_WHOLE,
            message=f"{held} of {len(healthy)} {model} GPUs held whole by other pods, pod needs {count} shared GPUs",
            requested=count,
            free=len(shared),
            gpu_model=model,
        )
    # ``enough`` only shows in multi-GPU messages (for one GPU it is 0 here by construction), so skip the count.
    limiting = _nth_most_free(shared, count, _vram_free)
    if _vram_free(limiting) < v:
        enough = sum(g.vram - g.vram_used >= v for g in shared) if count > 1 else 0
        return _insufficient(R.INSUFFICIENT_VRAM, "VRAM", v, limiting, enough, count, match, _limit_note(demand))
    limiting = _nth_most_free(shared, count, _tflops_free)
    if _tflops_free(limiting) < t:
        enough = sum(g.tflops - g.tflops_used >= t for g in shared) if count > 1 else 0
        return _insufficient(R.INSUFFICIENT_TFLOPS, "TFLOPS", t, limiting, enough, count, match)
    roomy = [g for g in shared if g.tflops - g.tflops_used >= t and g.vram - g.vram_used >= v]
    shortage = _slot_shortage(demand, node, roomy, match) if len(roomy) >= count else None
    return shortage or Reason(
        code=R.INSUFFICIENT_GPUS,
        message=(
            f"only {len(roomy)} of {len(shared)} {model} GPUs have both {humanize_tflops(demand.tflops)} TFLOPS "
            f"and {humanize_bytes(v)} VRAM free{_limit_note(demand)}, pod needs {count}"
        ),
        requested=count,
        free=len(roomy),
        gpu_model=model,
    )


def _slot_shortage(demand: Demand, node: NodeState, gpus: list[GpuState], match: ModelMatcher) -> Reason | None:
    """The node's healthy GPUs lack the pod's device IDs in all (what the kubelet refuses), or fewer than
    ``gpu_count`` of ``gpus`` (those with room for everything else) have ``demand.slots`` free each."""
    ids = demand.slots * demand.gpu_count
    if not ids:
        return None  # a pod that holds no device IDs
    if node.slots_used + ids > node.totals().slots:
        return _node_slots(node, ids)
    count = demand.gpu_count
    limiting = _nth_most_free(gpus, count, _slots_free)
    if _slots_free(limiting) >= demand.slots:
        return None
    enough = sum(_slots_free(g) >= demand.slots for g in gpus) if count > 1 else 0
    return _insufficient(R.INSUFFICIENT_SLOTS, f"{RESOURCE_VGPU} slots", demand.slots, limiting, enough, count, match)


def _node_slots(node: NodeState, ids: int) -> Reason:
    total = node.totals().slots
    free = max(total - node.slots_used, 0)
    return Reason(
        code=R.INSUFFICIENT_SLOTS,
        message=f"insufficient {RESOURCE_VGPU} slots on node {node.name}: requested {ids}, free {free} of {total}",
        requested=ids,
        free=free,
    )


def _vram_free(g: GpuState) -> int:
    return g.vram - g.vram_used


def _tflops_free(g: GpuState) -> int:
    return g.tflops - g.tflops_used


def _slots_free(g: GpuState) -> int:
    return g.slots - g.slots_used


def _nth_most_free(gpus: list[GpuState], n: int, free: Callable[[GpuState], int]) -> GpuState:
    """The GPU that limits a pod needing ``n`` GPUs: the n-th largest by free room."""
    return max(gpus, key=free) if n == 1 else sorted(gpus, key=free, reverse=True)[n - 1]


def _limit_note(demand: Demand) -> str:
    """Said after a VRAM figure that is the pod's limit rather than its request (the limit is what it holds)."""
    return " (its VRAM limit, which a pod holds)" if demand.vram_limit > demand.vram else ""


def _insufficient(
    code: ReasonCode,
    what: str,
    requested: int,
    gpu: GpuState,
    enough: int,
    count: int,
    match: ModelMatcher,
    note: str = "",
) -> Reason:
    show: Callable[[int], str] = str
    of = ""
    if code is R.INSUFFICIENT_VRAM:
        free, show = _vram_free(gpu), _bytes
    elif code is R.INSUFFICIENT_TFLOPS:
        free, show = _tflops_free(gpu), _tflops
    else:
        free, of = _slots_free(gpu), f" of {gpu.slots}"
    tail = f" (pod needs {count} GPUs, only {enough} with enough)" if count > 1 else ""
    return Reason(
        code=code,
        message=(
            f"insufficient {what} on {gpu.uuid}: requested {show(requested)}{note}, free {show(max(free, 0))}{of}{tail}"
        ),
        requested=requested,
        free=max(free, 0),
        gpu_model=match.short(gpu.model),
    )


def _too_small(demand: Demand, healthy: list[GpuState], match: ModelMatcher) -> Reason:
    """A capacity (not usage) misfit: no amount of freeing room would make the GPUs big enough."""
    count = demand.gpu_count
    vram = demand.vram_held
    gpu = sorted(healthy, key=lambda g: g.vram, reverse=True)[count - 1]
    if gpu.vram < vram:
        what, free, requested = "VRAM", humanize_bytes(gpu.vram), humanize_bytes(vram) + _limit_note(demand)
        figures = (vram, gpu.vram)
    else:
        gpu = sorted(healthy, key=lambda g: g.tflops, reverse=True)[count - 1]
        if gpu.tflops >= demand.tflops:  # each resource is big enough somewhere, never both on count GPUs
            return Reason(
                code=R.GPU_TOO_SMALL,
                message=(
                    f"no {count} GPUs on node have both {humanize_tflops(demand.tflops)} TFLOPS and "
                    f"{humanize_bytes(vram)} VRAM in all{_limit_note(demand)}"
                ),
                gpu_model=match.short(gpu.model),
            )
        what, free, requested = "TFLOPS", humanize_tflops(gpu.tflops), humanize_tflops(demand.tflops)
        figures = (demand.tflops, gpu.tflops)
    return Reason(
        code=R.GPU_TOO_SMALL,
        message=f"{gpu.uuid} has {free} {what} in all, pod requests {requested} per GPU",
        requested=figures[0],
        free=figures[1],
        gpu_model=match.short(gpu.model),
        values=(what,),
    )
