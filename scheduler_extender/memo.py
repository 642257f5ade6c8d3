"""Per-node memo of the core's verdicts and scores, valid while a node's state object is unchanged.

The cache replaces a node's ``NodeState`` object on every change, so a verdict computed for (request,
node object) stays true and is reused. The memo never decides anything itself; a miss calls the core
on the missed nodes only. Keys are what the core reads of the pod's Demand
(``vgpu.scheduling.demand.decision_key``) plus, for scores, the policy's name and ``revision``. The
lookup is written as C-level passes over the names, and each key holds two flat dicts (names to node
objects, names to values) rather than pairs, which the cyclic GC would have to walk.
Why, and what it measured: scheduler_extender/README.md, section "The memo".
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from itertools import compress, repeat
from operator import is_not
from typing import Any, Final, Generic, TypeVar, cast

from vgpu.scheduling.model import NodeState

V = TypeVar("V")

# What a name the memo has never seen reads as: no node object, so it always misses.
_NEVER: Final[Any] = object()


class _Known(Generic[V]):
    """One request key's memo: the node object each value was computed for, and the value, by name."""

    __slots__ = ("nodes", "values")

    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.values: dict[str, V] = {}


class NodeMemo(Generic[V]):
    """request key → node name → (node state object, value). LRU over request keys."""

    def __init__(self, max_keys: int = 16) -> None:
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._by_key: OrderedDict[Hashable, _Known[V]] = OrderedDict()

    def values(
        self,
        key: Hashable,
        names: Sequence[str],
        nodes: Mapping[str, NodeState],
        compute: Callable[[list[str]], list[V]],
    ) -> list[V]:
        """The value of each name, in order: remembered while its node object is unchanged, else ``compute``'d.

        ``compute`` gets the names that missed and must return their values, in the same order; values
        of names not in ``nodes`` (unknown nodes) are returned but never remembered.
        """
        with self._lock:
            known = self._by_key.get(key)
            new = known is None
            if known is None:
                known = self._by_key[key] = _Known()
                while len(self._by_key) > self.max_keys:
                    self._by_key.popitem(last=False)
            else:
                self._by_key.move_to_end(key)
                # Both read under the lock: a concurrent store cannot pair a node with another's value.
                cached = list(map(known.nodes.get, names, repeat(_NEVER)))
                values: list[V] = list(map(known.values.get, names))  # type: ignore[arg-type]  # None where missing
        if new:  # a request never seen (a cold decision): every name misses, no per-name comparison
            misses = list(names)
            if not misses:
                return []
            values = computed = compute(misses)
        else:
            stale = list(map(is_not, map(nodes.get, names), cached))
            if not any(stale):
                return values
            misses = list(compress(names, stale))
            computed = compute(misses)
            for i, value in zip(compress(range(len(names)), stale), computed, strict=True):
                values[i] = value
        now = list(map(nodes.get, misses))
        with self._lock:
            if all(now):  # every name a node (an object, true), none unknown (None)
                known.nodes.update(zip(misses, cast("list[NodeState]", now), strict=True))
                known.values.update(zip(misses, computed, strict=True))
            else:  # unknown nodes are not remembered
                known_now = list(map(is_not, now, repeat(None)))
                fresh = compress(zip(misses, now, strict=True), known_now)
                known.nodes.update(cast("Iterator[tuple[str, NodeState]]", fresh))
                known.values.update(compress(zip(misses, computed, strict=True), known_now))
        return values

    def clear(self) -> None:
        with self._lock:
            self._by_key.clear()
