"""Per-node memo of the core's verdicts and scores, valid while a node's state object is unchanged.

Filter and prioritize judge every offered node: at 5,000 nodes that is ~40,000 GPU checks per call
in Python, most of them repeated, because kube-scheduler asks about the same nodes for pod after
pod with the same request (replicas), and a node's state only changes when something is reserved,
bound or released on it. The cache replaces a node's ``NodeState`` object on every such change, so
"same object" means "same state": a verdict computed by the core for (request, node object) stays
true and is reused. The memo never decides anything itself; a miss calls the core on the missed
nodes only. Keys are the pod's resolved-request text (it determines the Demand except the pod key,
which decides nothing) plus, for scores, the policy's name and ``revision`` (a learning policy bumps
it when its scores change).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Generic, TypeVar

from scheduler_extender.core.model import NodeState

V = TypeVar("V")


class NodeMemo(Generic[V]):
    """request key → node name → (node state object, value). LRU over request keys."""

    def __init__(self, max_keys: int = 16) -> None:
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._by_key: OrderedDict[Hashable, dict[str, tuple[NodeState, V]]] = OrderedDict()

    def split(
        self, key: Hashable, names: Sequence[str], nodes: Mapping[str, NodeState]
    ) -> tuple[dict[str, V], list[str]]:
        """The cached values still valid for these nodes, and the names that must be computed."""
        with self._lock:
            known = self._by_key.get(key)
            if known is not None:
                self._by_key.move_to_end(key)
        if known is None:
            return {}, list(names)
        hits: dict[str, V] = {}
        misses: list[str] = []
        for name in names:
            cached = known.get(name)
            if cached is not None and cached[0] is nodes.get(name):
                hits[name] = cached[1]
            else:
                misses.append(name)
        return hits, misses

    def store(self, key: Hashable, values: Mapping[str, V], nodes: Mapping[str, NodeState]) -> None:
        """Remember values computed against these node objects (names not in ``nodes`` are skipped)."""
        with self._lock:
            known = self._by_key.get(key)
            if known is None:
                known = self._by_key[key] = {}
                while len(self._by_key) > self.max_keys:
                    self._by_key.popitem(last=False)
            for name, value in values.items():
                node = nodes.get(name)
                if node is not None:
                    known[name] = (node, value)

    def clear(self) -> None:
        with self._lock:
            self._by_key.clear()
