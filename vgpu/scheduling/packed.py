"""Nodes packed as int64 columns, kept by node name from one decision to the next, for array passes over many.

A cold decision reads every offered node: the filter's fit check (:mod:`vgpu.scheduling.fit_arrays`) and the
fragmentation policy's growth (:mod:`vgpu.scheduling.growth_arrays`) do it as numpy arrays of (fields × nodes).
Packing a node costs more than checking it once in Python, so :class:`Columns` keeps each node's column, by
name, while its state object lasts (the extender's snapshot keeps the objects of unchanged nodes): a decision
repacks only the nodes that changed since the last one, whichever subset of the cluster it is offered (kube-
scheduler offers a different sample of a large cluster each cycle). Beside each column it keeps what a
``derive`` function makes of it alone (the growth's node-only terms), computed once per packed column. The
arrays of the last nodes gathered are kept too: the filter's fit check and the policy's scoring of one cold
decision read the same nodes, and gather them once (:class:`Packs`).

A node's column (:func:`row`): whether it has free CPU and memory figures and their values, its used device
IDs, its kind (a number for what the array passes cannot read, :data:`Kind`), then per GPU the fields the
passes read. A node with fewer GPUs than the widest is padded with all-zero GPUs, which are unhealthy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress, count, repeat
from operator import is_
from struct import Struct
from typing import Final, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from vgpu.scheduling.model import NodeState

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
# What a Columns keeps beside each column: (fields × nodes) → (terms × nodes), column by column alone.
Derive = Callable[[Ints], Floats]

# has CPU, free CPU, has memory, free memory, device IDs used, kind
NODE_FIELDS: Final = 6
# TFLOPS, VRAM, TFLOPS used, VRAM used, pods, whole, healthy, slots, slots used
GPU_FIELDS: Final = 9
_ITEM: Final = 8  # bytes of one int64

# What a node's kind stands for: no inventory error, its pool, its GPUs' distinct models (none: no GPUs).
Kind = tuple[bool, str, tuple[str, ...]]


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


def _no_terms(columns: Ints) -> Floats:
    return np.zeros((0, columns.shape[1]))


@dataclass(frozen=True, slots=True)
class _Store:
    """The columns packed so far: the node object packed by name (kept alive: its ``id`` is its own while it is
    here), its column in ``table`` by the object's ``id``, and what ``derive`` made of each column in ``terms``.
    ``free`` hands out the arrays' columns no store points at yet, each once (past their room: none left)."""

    packed: dict[str, NodeState]
    at: dict[int, int]
    table: Ints  # (fields × room)
    terms: Floats  # (terms × room)
    free: Iterator[int]


def _empty() -> _Store:
    return _Store({}, {}, np.zeros((NODE_FIELDS, 0), dtype=np.int64), np.zeros((0, 0)), count())


@dataclass(frozen=True, slots=True)
class _Gathered:
    """The last nodes gathered, and their columns and terms (read-only arrays)."""

    nodes: tuple[NodeState, ...]
    columns: Ints
    terms: Floats


class Columns:
    """Nodes' columns kept by name while their state objects last; and the kinds of the nodes packed.

    A call packs a changed node into a column the store's ``free`` hands out (one call's alone: no store points
    at it, no other call writes it) and swaps in a new store whole, so a concurrent call never sees a column
    half written or paired with another node's object: at worst one call's repacking is lost and done again.
    A node packed again leaves its old column dead; when the arrays have no room left, the live columns move to
    new ones. The store is dropped, and rebuilt from the nodes of the call, when it holds far more names than
    the call asks for (nodes the cluster has shed).
    """

    __slots__ = ("_derive", "_kinds", "_last", "_numbers", "_store")

    def __init__(self, derive: Derive = _no_terms) -> None:
        self._derive = derive
        self._kinds: dict[Kind, int] = {}
        self._numbers = count()
        self._store = _empty()
        self._last: _Gathered | None = None

    def kinds(self) -> list[tuple[Kind, int]]:
        """Every kind a packed node has had, with its number (few: a cluster's pools × GPU model sets)."""
        return list(self._kinds.items())

    def of(self, nodes: Sequence[NodeState]) -> Ints:
        """The (fields × nodes) array of ``nodes``, in their order."""
        return self.gather(nodes)[0]

    def gather(self, nodes: Sequence[NodeState]) -> tuple[Ints, Floats]:
        """The (fields × nodes) array of ``nodes``, in their order, and the (terms × nodes) array ``derive``
        made of it; both read-only, and the same arrays again when the same node objects are asked next."""
        last = self._last
        if last is not None and len(last.nodes) == len(nodes) and all(map(is_, nodes, last.nodes)):
            return last.columns, last.terms
        store = self._store
        if len(store.packed) > 2 * len(nodes) + 4096:
            store = _empty()
        spots = list(map(store.at.get, map(id, nodes)))
        if None in spots:
            missing = list(compress(range(len(nodes)), map(is_, spots, repeat(None))))
            table, store = store.table, self._stored(store, [nodes[i] for i in missing])
            if store.table is not table:  # the live columns moved
                spots = list(map(store.at.get, map(id, nodes)))
            else:
                for i in missing:
                    spots[i] = store.at.get(id(nodes[i]))
            if None in spots:  # two nodes of one name, the other packed: not kept
                columns = self._block(nodes, store.table.shape[0] * _ITEM).T.copy()
                return self._kept(nodes, columns, self._derive(columns))
        at = np.array(spots, dtype=np.intp)
        return self._kept(nodes, store.table.take(at, axis=1), store.terms.take(at, axis=1))

    def _kept(self, nodes: Sequence[NodeState], columns: Ints, terms: Floats) -> tuple[Ints, Floats]:
        """``columns`` and ``terms`` made read-only and the last gathered, for ``nodes``."""
        columns.flags.writeable = terms.flags.writeable = False
        self._last = _Gathered(tuple(nodes), columns, terms)
        return columns, terms

    def _stored(self, store: _Store, changed: list[NodeState]) -> _Store:
        """``store`` with ``changed`` (re)packed (a name twice: its last node), made the store."""
        nodes = {node.name: node for node in changed}
        block = self._block(list(nodes.values()), store.table.shape[0] * _ITEM).T
        made = self._derive(block)
        height = block.shape[0]
        packed, at = dict(store.packed), dict(store.at)
        for old in map(packed.get, nodes):
            if old is not None:
                del at[id(old)]  # its column dead
        packed.update(nodes)
        spots = [next(store.free) for _ in nodes]
        table, terms, free = store.table, store.terms, store.free
        if height != table.shape[0] or spots[-1] >= table.shape[1]:  # a wider node, or no room left: new arrays
            live = np.fromiter(at.values(), dtype=np.intp, count=len(at))
            kept, room = len(at), 2 * (len(at) + len(nodes))
            table = np.zeros((height, room), dtype=np.int64)
            table[: store.table.shape[0], :kept] = store.table.take(live, axis=1)
            terms = np.zeros((made.shape[0], room))
            if kept:  # a wider node pads the others with all-zero GPUs: their terms made again
                wider = height != store.table.shape[0]
                terms[:, :kept] = self._derive(table[:, :kept]) if wider else store.terms.take(live, axis=1)
            at = dict(zip(at, range(kept), strict=True))
            spots = list(range(kept, kept + len(nodes)))
            free = count(kept + len(nodes))
        table[:, spots] = block
        terms[:, spots] = made
        at.update(zip(map(id, nodes.values()), spots, strict=True))
        new = self._store = _Store(packed, at, table, terms, free)
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


@runtime_checkable
class Packs(Protocol):
    """A policy that keeps the nodes it scores at once as :class:`Columns`: the filter packs and gathers the
    offered nodes into the same, so that a decision's fit check and scoring gather them once."""

    @property
    def columns(self) -> Columns: ...
