"""Nodes packed as int64 columns, kept by node name from one decision to the next, for array passes over many.

A cold decision reads every offered node: the filter's fit check (:mod:`vgpu.scheduling.fit_arrays`) and the
fragmentation policy's growth (:mod:`vgpu.scheduling.growth_arrays`) do it as numpy arrays of (fields × nodes).
Packing a node costs more than checking it once in Python, so :class:`Columns` keeps each node's column, by
name, while its state object lasts (the extender's snapshot keeps the objects of unchanged nodes): a decision
repacks only the nodes that changed since the last one, whichever subset of the cluster it is offered (kube-
scheduler offers a different sample of a large cluster each cycle).

A node's column (:func:`row`): whether it has free CPU and memory figures and their values, its used device
IDs, its kind (a number for what the array passes cannot read, :data:`Kind`), then per GPU the fields the
passes read. A node with fewer GPUs than the widest is padded with all-zero GPUs, which are unhealthy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress, count
from operator import attrgetter, is_not
from struct import Struct
from typing import Final

import numpy as np
import numpy.typing as npt

from vgpu.scheduling.model import NodeState

Ints = npt.NDArray[np.int64]

# has CPU, free CPU, has memory, free memory, device IDs used, kind
NODE_FIELDS: Final = 6
# TFLOPS, VRAM, TFLOPS used, VRAM used, pods, whole, healthy, slots, slots used
GPU_FIELDS: Final = 9
_ITEM: Final = 8  # bytes of one int64

# What a node's kind stands for: no inventory error, its pool, its GPUs' distinct models (none: no GPUs).
Kind = tuple[bool, str, tuple[str, ...]]

_name = attrgetter("name")


@lru_cache(maxsize=64)
def _packer(count: int) -> Struct:
    return Struct(f"<{count}q")


def row(node: NodeState, kind: int) -> bytes:
    """The node's column as int64s (see the module docstring), ``kind`` its :data:`Kind`'s number."""
    values = [
        node.cpu_free is not None,
        node.cpu_free or 0,
        node.memory_free is not None,
        node.memory_free or 0,
        node.slots_used,
        kind,
    ]
    for g in node.gpus:
        values += (g.tflops, g.vram, g.tflops_used, g.vram_used, g.pods, g.whole, g.healthy, g.slots, g.slots_used)
    return _packer(len(values)).pack(*values)


@dataclass(frozen=True, slots=True)
class _Store:
    """The columns packed so far: a node's column in ``table`` by name, and the state object packed there."""

    at: dict[str, int]
    packed: dict[str, NodeState]
    table: Ints  # (fields × columns), never written once stored


class Columns:
    """Nodes' columns kept by name while their state objects last; and the kinds of the nodes packed.

    :meth:`of` copies the store before repacking into it and then swaps it in whole, so a concurrent call never
    sees a column half written or paired with another node's object: at worst one call's repacking is lost and
    done again. The store is dropped, and rebuilt from the nodes of the call, when it holds far more names than
    the call asks for (nodes the cluster has shed).
    """

    __slots__ = ("_kinds", "_numbers", "_store")

    def __init__(self) -> None:
        self._kinds: dict[Kind, int] = {}
        self._numbers = count()
        self._store: _Store | None = None

    def kinds(self) -> list[tuple[Kind, int]]:
        """Every kind a packed node has had, with its number (few: a cluster's pools × GPU model sets)."""
        return list(self._kinds.items())

    def of(self, nodes: Sequence[NodeState]) -> Ints:
        """The (fields × nodes) array of ``nodes``, in their order."""
        names = list(map(_name, nodes))
        store = self._store
        if store is None or len(store.at) > 2 * len(names) + 4096:
            store = _Store({}, {}, np.zeros((NODE_FIELDS, 0), dtype=np.int64))
        stale = list(map(is_not, nodes, map(store.packed.get, names)))
        if any(stale):
            store = self._stored(store, list(compress(nodes, stale)))
            if any(map(is_not, nodes, map(store.packed.get, names))):  # two nodes of one name: not kept
                return self._block(nodes, NODE_FIELDS * _ITEM).T.copy()
        return store.table[:, list(map(store.at.__getitem__, names))]

    def _stored(self, store: _Store, changed: list[NodeState]) -> _Store:
        """A copy of ``store`` with ``changed`` (re)packed, made the store."""
        changed = list({node.name: node for node in changed}.values())  # a name twice: its last node
        block = self._block(changed, store.table.shape[0] * _ITEM)
        at = dict(store.at)
        for node in changed:
            at.setdefault(node.name, len(at))
        width = store.table.shape[1]
        if len(at) > width:
            width = max(len(at), 2 * width)  # room to grow without a copy per new name
        table = np.zeros((block.shape[1], width), dtype=np.int64)
        table[: store.table.shape[0], : store.table.shape[1]] = store.table
        table[:, list(map(at.__getitem__, map(_name, changed)))] = block.T
        packed = dict(store.packed)
        packed.update(zip(map(_name, changed), changed, strict=True))
        new = self._store = _Store(at, packed, table)
        return new

    def _block(self, nodes: Sequence[NodeState], height: int) -> Ints:
        """The nodes' columns as rows, (nodes × fields), at least ``height`` bytes each (zeros after a node's)."""
        rows = [row(node, self._kind(node)) for node in nodes]
        height = max([height, *map(len, rows)])
        block = b"".join(r + bytes(height - len(r)) if len(r) < height else r for r in rows)
        return np.frombuffer(block, dtype=np.int64).reshape(len(rows), height // _ITEM)

    def _kind(self, node: NodeState) -> int:
        kind = (node.inventory_error is None, node.pool, node.totals().models)
        number = self._kinds.get(kind)
        if number is None:
            number = self._kinds.setdefault(kind, next(self._numbers))
        return number
