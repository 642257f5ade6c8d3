"""Allocate's work: find the pod (waiting briefly for the watch), validate, answer, track the hand-off.

The kubelet calls Allocate once per container needing our resource, init containers first, and
expects the answer at once (admission on the node is blocked meanwhile). We keep, per pod, the
containers already served and their device IDs; the choice, validation and bookkeeping happen
without an ``await`` in between, so concurrent Allocates can never serve one container twice. When a
pod's last container is served, the :class:`~device_plugin.handoff.HandoffKeeper` writes the
receipt that releases the extender's per-node gate.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from device_plugin.board import DeviceBoard
from device_plugin.envs import ContainerGrant, EnforcementPaths, Target, build
from device_plugin.handoff import HandoffKeeper
from device_plugin.lookup import AllocateError, Match, awaiting, choose, validate
from device_plugin.metrics import PluginMetrics
from device_plugin.pod_cache import PodCache
from vgpu.contract.allocation import decode
from vgpu.errors import DomainError
from vgpu.names import EnforcementBackend


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorConfig:
    node: str
    backend: EnforcementBackend
    paths: EnforcementPaths = field(default_factory=EnforcementPaths)
    lookup_wait_s: float = 2.0


class Allocator:
    def __init__(
        self,
        config: AllocatorConfig,
        cache: PodCache,
        board: DeviceBoard,
        keeper: HandoffKeeper,
        metrics: PluginMetrics,
    ) -> None:
        self._config, self._cache, self._board, self._keeper, self._metrics = config, cache, board, keeper, metrics
        self._served: dict[str, list[tuple[str, tuple[str, ...]]]] = {}

    def served_counts(self) -> Mapping[str, int]:
        return {uid: len(done) for uid, done in self._served.items()}

    async def allocate(self, ids: tuple[str, ...]) -> ContainerGrant:
        """The answer for one container request; raises :class:`AllocateError` with the reason."""
        started = time.perf_counter()
        node = self._config.node
        self.prune()

        def attempt() -> Match | AllocateError | None:
            result = choose(self._cache.pods(), node, ids, self.served_counts())
            return None if isinstance(result, AllocateError) and result.waitable else result

        found = attempt()
        if found is None:
            found = await self._cache.wait_for(attempt, self._config.lookup_wait_s)
            self._metrics.lookup_wait_seconds.observe(time.perf_counter() - started)
        if found is None:  # re-evaluate for the message (nothing found within the wait)
            found = choose(self._cache.pods(), node, ids, self.served_counts())
        if isinstance(found, AllocateError):
            raise found
        alloc = validate(found.pod, node, self._board.by_uuid())
        if not found.again:
            done = self._served.setdefault(found.pod.uid, [])
            done.append((found.container, ids))
            if len(done) == len(found.pod.vgpu_containers):
                self._keeper.record(found.pod, tuple(done))
        target = Target(namespace=found.pod.namespace, pod=found.pod.name, container=found.container)
        return build(alloc, target, self._config.backend, self._config.paths)

    def adopt(self, uid: str, done: Iterable[tuple[str, tuple[str, ...]]]) -> None:
        """Containers the kubelet already allocated (seen in PodResources) for a pod we have no record of,
        e.g. after a plugin restart in the middle of a multi-container pod."""
        if uid not in self._served:
            self._served[uid] = list(done)

    def prune(self) -> None:
        """Drop bookkeeping for pods that left the cache, ended, or whose receipt is visible."""
        for uid in list(self._served):
            pod = self._cache.get(uid)
            if pod is None or not pod.active or pod.handoff is not None:
                del self._served[uid]

    def preferred_gpus(self, size: int) -> tuple[str, ...]:
        """GPUs granted to the one pod whose next container wants ``size`` devices (a hint), else ()."""
        found = awaiting(self._cache.pods(), self._config.node, size, self.served_counts())
        if len(found) != 1 or found[0].allocation is None:
            return ()
        try:
            return tuple(g.uuid for g in decode(found[0].allocation).gpus)
        except DomainError:
            return ()
