"""The fragmentation policy's least one-GPU growth of many nodes at once, as numpy arrays.

A cold decision scores every fitting node, and per node the policy's one-GPU path (``_least`` in
:mod:`vgpu.scheduling.fragmentation`) costs tens of microseconds of Python: 5,000 nodes took ~180 ms.
Here the same sums run over a (nodes × GPUs) array per mix entry. Each float is computed by the same
operations in the same order as the scalar path — the idle sums GPU by GPU, the stranded sums group by
group in first-seen order, ``max`` and the cutting-stock loss as Python takes them — so every growth is
the scalar path's to the bit and no decision depends on which path scored a node (the property test
``tests/vgpu/scheduling/test_growth_arrays.py`` holds them equal).

The nodes scored at once are one (fields × nodes) array of packed nodes (:class:`~vgpu.scheduling.packed.Columns`,
kept by name from one decision to the next), with what the growth reads of each node alone, whatever the pod
(:func:`node_terms`: its GPUs' idle, their groups' idle, its total idle), kept beside each node's column: a
cold decision computes only what depends on the pod.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from vgpu.scheduling.cutting_stock import Prices
from vgpu.scheduling.packed import GPU_FIELDS, NODE_FIELDS, Floats, Ints

Bools = npt.NDArray[np.bool_]

# What :func:`least_growths` reads of a mix entry: GPUs per pod, TFLOPS, VRAM, whole, CPU, memory.
Size = tuple[int, int, int, bool, int, int]


def _py_max(a: Floats | float, b: Floats | float) -> Floats:
    """Python's ``max(a, b)`` elementwise: ``b`` only where it is strictly greater (signed zeros as Python's)."""
    return np.where(np.greater(b, a), b, a)


def node_terms(columns: Ints) -> Floats:
    """Per node (a column of ``columns``), what its growth reads of the node alone, whatever the pod: per GPU
    its idle, per GPU the idle of the group it leads (zero where it leads none), and its total idle; as rows,
    (2 × GPUs + 1) × nodes. :class:`~vgpu.scheduling.packed.Columns` keeps them with each node's column."""
    n = columns.shape[1]
    # Field k of GPU g of every node is row NODE_FIELDS + g × GPU_FIELDS + k: per field a (GPUs × nodes) array.
    width = (columns.shape[0] - NODE_FIELDS) // GPU_FIELDS
    tf, vr, t_used, v_used, pods, whole, healthy = (columns[NODE_FIELDS + k :: GPU_FIELDS] for k in range(7))
    free_t, free_v = tf - t_used, vr - v_used
    sized, tf_div, vr_div = _sizes(tf, vr, healthy, whole)
    idle = np.where(sized, 0.5 * (free_t / tf_div + free_v / vr_div), 0.0)
    usable_gpu = idle > 0.0
    idle_usable = np.where(usable_gpu, idle, 0.0)
    fresh = (pods == 0) & (t_used == 0) & (v_used == 0)
    terms = np.zeros((2 * width + 1, n))
    # The node's total idle, GPU by GPU; its GPUs grouped by (free TFLOPS, free VRAM, fresh), each group's
    # idle summed in GPU order at its first member (the leader), as fragmentation._groups sums them.
    total = terms[2 * width]
    for g in range(width):
        total += idle_usable[g]
    key_v = free_v * 2 + fresh  # VRAM is far below 2^62 bytes
    same = (free_t[:, None] == free_t[None]) & (key_v[:, None] == key_v[None]) & usable_gpu[None]
    leader = np.argmax(same, axis=1)  # (GPU, node): the first usable GPU of the node in the same group
    group_idle = terms[width : 2 * width]
    every = np.arange(n)
    for g in range(width):
        group_idle[leader[g], every] += idle_usable[g]
    terms[:width] = idle
    return terms


def _sizes(tf: Ints, vr: Ints, healthy: Ints, whole: Ints) -> tuple[Bools, Ints, Ints]:
    """Per GPU whether its idle capacity is measured (``fragmentation.idle``), and its TFLOPS and VRAM to
    divide by (1 for none)."""
    return (healthy != 0) & (whole == 0) & (tf != 0) & (vr != 0), np.where(tf == 0, 1, tf), np.where(vr == 0, 1, vr)


def least_growths(
    columns: Ints,
    terms: Floats,
    demand: tuple[int, int, int, int, int],
    mix: Sequence[Size],
    weights: Sequence[Floats | float],
    cpu_per_gpu: float,
    memory_per_gpu: float,
    prices: Prices | None,
) -> list[float]:
    """Per node (a column of ``columns`` and of its :func:`node_terms` ``terms``: both from
    :meth:`~vgpu.scheduling.packed.Columns.gather`), the least growth of fragmentation over its GPUs that can
    take one share of ``demand`` (TFLOPS, VRAM held, slots, CPU, memory), unrounded; ``inf`` where none can.

    ``mix`` and ``weights`` are the entries the growth is weighed by and each one's weight (× the share of
    its pods the node admits: a number, or one per node), ``cpu_per_gpu`` and ``memory_per_gpu`` the mix's,
    as the fragmentation policy's ``_value`` reads them.
    """
    n = columns.shape[1]
    width = (columns.shape[0] - NODE_FIELDS) // GPU_FIELDS
    tf, vr, t_used, v_used, pods, whole, healthy, slots, slots_used = (
        columns[NODE_FIELDS + k :: GPU_FIELDS] for k in range(GPU_FIELDS)
    )
    has_cpu, cpu_free, has_memory, memory_free = columns[0] != 0, columns[1], columns[2] != 0, columns[3]
    t, v, need_slots, cpu, memory = demand
    idle, group_idle, total = terms[:width], terms[width : 2 * width], terms[2 * width]

    free_t, free_v = tf - t_used, vr - v_used
    sized, tf_div, vr_div = _sizes(tf, vr, healthy, whole)
    usable_gpu = idle > 0.0
    idle_usable = np.where(usable_gpu, idle, 0.0)
    fresh = (pods == 0) & (t_used == 0) & (v_used == 0)

    new_t, new_v = free_t - t, free_v - v
    idle_after = np.where(sized, 0.5 * (new_t / tf_div + new_v / vr_div), 0.0)
    usable_after = idle_after > 0.0
    idle_usable_after = np.where(usable_after, idle_after, 0.0)
    total_after = total - _py_max(idle, 0.0) + _py_max(idle_after, 0.0)
    cpu_after, memory_after = cpu_free - cpu, memory_free - memory

    value = np.zeros(n)
    value_after = np.zeros((width, n))
    mass: Floats | float = 0.0
    for (count, s_tflops, s_vram, s_whole, s_cpu, s_memory), weight in zip(mix, weights, strict=True):
        holds = fresh if s_whole else (free_t >= s_tflops) & (free_v >= s_vram)
        holds_after = np.zeros_like(holds) if s_whole else (new_t >= s_tflops) & (new_v >= s_vram)
        usable_holds = usable_gpu & holds
        usable = np.count_nonzero(usable_holds, axis=0)
        stranded_group = np.where(holds, 0.0, group_idle)  # zero but at the leaders
        stranded = np.zeros(n)
        for g in range(width):
            stranded = stranded + stranded_group[g]
        mass = mass + weight
        admits = (~has_cpu | (cpu_free >= s_cpu)) & (~has_memory | (memory_free >= s_memory))
        value = value + weight * np.where(admits & (usable >= count), stranded, total)
        # The same terms once one GPU took the share: its part before out, its part after in.
        moved_usable = usable - usable_holds + (usable_after & holds_after)
        moved_stranded = stranded - np.where(holds, 0.0, idle_usable) + np.where(holds_after, 0.0, idle_usable_after)
        admits_after = (~has_cpu | (cpu_after >= s_cpu)) & (~has_memory | (memory_after >= s_memory))
        term = np.where(admits_after & (moved_usable >= count), moved_stranded, total_after)
        value_after = value_after + weight * term
    before = _finish(value, mass, total, has_cpu, cpu_free, has_memory, memory_free, cpu_per_gpu, memory_per_gpu)
    after = _finish(
        value_after, mass, total_after, has_cpu, cpu_after, has_memory, memory_after, cpu_per_gpu, memory_per_gpu
    )
    growth = after - before
    if prices is not None:
        growth = growth + _losses(prices, t, v, tf, vr, tf_div, vr_div, idle)
    fits = (
        (healthy != 0)
        & (whole == 0)
        & ((need_slots == 0) | (slots - slots_used >= need_slots))
        & (free_t >= t)
        & (free_v >= v)
    )
    least: list[float] = np.where(fits, growth, np.inf).min(axis=0, initial=np.inf).tolist()
    return least


def _finish(
    value: Floats,
    mass: Floats | float,
    total: Floats,
    has_cpu: Bools,
    cpu_free: Ints,
    has_memory: Bools,
    memory_free: Ints,
    cpu_per_gpu: float,
    memory_per_gpu: float,
) -> Floats:
    """The fragmentation the summed terms come to: over the mass of the entries, plus the starved GPUs."""
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(np.greater(mass, 0.0), value / mass, total)
    worst = np.zeros_like(total)
    if cpu_per_gpu > 0:
        worst = np.where(has_cpu, _py_max(worst, total - cpu_free / cpu_per_gpu), worst)
    if memory_per_gpu > 0:
        worst = np.where(has_memory, _py_max(worst, total - memory_free / memory_per_gpu), worst)
    return np.where(total <= 0.0, 0.0, value + worst)


def _losses(prices: Prices, t: int, v: int, tf: Ints, vr: Ints, tf_div: Ints, vr_div: Ints, idle: Floats) -> Floats:
    """Per GPU, the cutting-stock value lost by putting one share into its hole (``_loss``: ``Prices.loss``)."""
    fill = np.asarray(prices.fill)
    own = np.asarray([prices.worth.get(i, f) for i, f in enumerate(prices.fill)])
    share = np.where((tf != 0) & (vr != 0), 0.5 * (t / tf_div + v / vr_div), 1.0)
    size = np.rint(1000 * share).astype(np.int64)
    hole = np.rint(1000 * idle).astype(np.int64)
    last = len(fill) - 1
    counts = (size > 0) & (size <= hole) & (hole <= last)
    lost = fill[np.clip(hole, 0, last)] - fill[np.clip(hole - size, 0, last)] - own[np.clip(size, 0, last)]
    return np.where(counts & (lost > 0.0), lost, 0.0)
