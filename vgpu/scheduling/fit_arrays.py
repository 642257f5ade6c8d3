"""Which of many nodes surely take a demand now, at once, as numpy arrays over the packed nodes.

A cold filter checks every offered node (:func:`~vgpu.scheduling.fit.check_node`, ~2.5 µs of Python each:
~15 ms at 5,000 nodes when every node is a state of its own). Here the same rules run over the nodes' columns
(:mod:`vgpu.scheduling.packed`) for a demand the columns hold everything of: no node affinity (names and
labels), no isolation mode or pinned GPU indices (the GPUs serving them), no share of compute in percent
(converted per node's GPUs). A node is passed only where all its GPUs are of the demanded model, so each of
its GPUs is one ``check_node`` would count; a node this does not pass may still fit (some of its GPUs of
another model), and goes through ``check_node``, which also words the reason of one that does not. The
property test ``tests/vgpu/scheduling/test_fit_arrays.py`` holds every node passed here to one ``check_node``
passes, and every plain node ``check_node`` passes to one passed here.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from vgpu.scheduling.fit import ModelMatcher
from vgpu.scheduling.model import Demand
from vgpu.scheduling.packed import GPU_FIELDS, NODE_FIELDS, Columns, Ints, Kind

Bools = npt.NDArray[np.bool_]


def plain(demand: Demand) -> bool:
    """Whether the packed columns hold all :func:`surely_fit` needs to judge the demand."""
    return (
        demand.node_affinity is None
        and demand.isolation is None
        and demand.gpu_indices is None
        and demand.compute_percent is None
    )


def surely_fit(demand: Demand, columns: Ints, packed: Columns, match: ModelMatcher) -> Bools:
    """Per node (a column of ``columns``, from ``packed``), whether it takes the plain demand now, its GPUs all
    of the demanded model; False where it does not or may not."""
    has_cpu, cpu_free, has_memory, memory_free, ids_used, kind = columns[:NODE_FIELDS]
    tf, vr, t_used, v_used, pods, whole, healthy, slots, slots_used = (
        columns[NODE_FIELDS + k :: GPU_FIELDS] for k in range(GPU_FIELDS)
    )
    s = demand.slots
    open_ = (healthy != 0) & (whole == 0)
    if s:
        open_ &= slots - slots_used >= s
    if demand.whole_gpu:
        takes = open_ & (pods == 0) & (t_used == 0) & (v_used == 0)
    else:
        takes = open_ & (tf - t_used >= demand.tflops) & (vr - v_used >= demand.vram_held)
    ok: Bools = np.count_nonzero(takes, axis=0) >= demand.gpu_count
    ids = s * demand.gpu_count
    if ids:  # the kubelet counts the device IDs of every healthy GPU of the node
        ok &= ids_used + ids <= np.where(healthy != 0, slots, 0).sum(axis=0)
    ok &= (has_cpu == 0) | (cpu_free >= demand.cpu)
    ok &= (has_memory == 0) | (memory_free >= demand.memory)
    kinds = packed.kinds()
    eligible = np.zeros(max((number for _, number in kinds), default=0) + 1, dtype=np.bool_)
    for key, number in kinds:
        eligible[number] = _eligible(demand, key, match)
    ok &= eligible[kind]
    return ok


def _eligible(demand: Demand, kind: Kind, match: ModelMatcher) -> bool:
    """Whether a node of this kind can be judged by its numbers: readable, in the pool, with GPUs, all matching."""
    readable, pool, models = kind
    return readable and (demand.pool is None or pool == demand.pool) and bool(models) and match.every(models)
