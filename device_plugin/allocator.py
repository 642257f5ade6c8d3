"""Allocate's work: find the pod (from a fresh read of the API), validate, answer, track the hand-off.

The kubelet calls Allocate once per container needing our resource, init containers first, and
expects the answer at once (admission on the node is blocked meanwhile). We keep, per pod, the
containers already served and their device IDs; the choice, validation and bookkeeping happen
without an ``await`` in between, so concurrent Allocates can never serve one container twice. When a
pod's last container is served, the :class:`~device_plugin.handoff.HandoffKeeper` writes the
receipt that releases the extender's per-node gate.

The pod is chosen from a LIST of the node's pods taken after the Allocate arrived, not from the
watch-fed cache alone. The watch can lag by hundreds of milliseconds (a namespace of pods being
deleted streams through it), and a lagging view serves the wrong pod, not just no pod: the kubelet
admits pod A, the cache has not shown A yet, A is deleted, the gate lets pod B bind, and the cache
then shows B alone, so A's container got B's allocation and every later Allocate shifts by one
until the last pod is refused (seen end to end). The kubelet only admits pods already bound, and
the extender writes the allocation before binding, so that LIST holds the pod this Allocate is for;
pods it does not hold were bound later and are never candidates for this Allocate, even while it
waits for a late annotation. Only when the API cannot be read does the cache decide alone.

Concurrent Allocates share LISTs through :class:`~device_plugin.fresh_read.FreshRead`, which never
hands one a LIST begun before it arrived: one arriving while a LIST is in flight waits for the next,
shared by all who arrived meanwhile, so a burst (a node reboot re-allocates every pod at once) costs
a LIST per round trip instead of one each, queued. A failed LIST fails every Allocate sharing it,
and each falls back to the cache alone, counted and logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from device_plugin.board import DeviceBoard
from device_plugin.envs import ContainerGrant, EnforcementPaths, Target, build
from device_plugin.fresh_read import FreshRead
from device_plugin.gateway import KubeGateway
from device_plugin.handoff import HandoffKeeper
from device_plugin.lookup import AllocateError, Match, awaiting, choose, validate
from device_plugin.metrics import PluginMetrics
from device_plugin.pod_cache import PodCache
from device_plugin.pods import PodRecord
from vgpu.contract.allocation import decode
from vgpu.errors import DomainError
from vgpu.names import EnforcementBackend

log = logging.getLogger(__name__)


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
        gateway: KubeGateway,
        cache: PodCache,
        board: DeviceBoard,
        keeper: HandoffKeeper,
        metrics: PluginMetrics,
    ) -> None:
        self._config, self._gateway, self._cache = config, gateway, cache
        self._board, self._keeper, self._metrics = board, keeper, metrics
        self._served: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        self._fresh = FreshRead(self._list_pods)

    def served_counts(self) -> Mapping[str, int]:
        return {uid: len(done) for uid, done in self._served.items()}

    async def allocate(self, ids: tuple[str, ...]) -> ContainerGrant:
        """The answer for one container request; raises :class:`AllocateError` with the reason."""
        started = time.perf_counter()
        node = self._config.node
        fresh = await self._fresh_pods()
        self.prune()
        eligible = None if fresh is None else {p.uid for p in fresh}

        def candidates(pods: Iterable[PodRecord]) -> list[PodRecord]:
            return list(pods) if eligible is None else [p for p in pods if p.uid in eligible]

        def attempt() -> Match | AllocateError | None:
            result = choose(candidates(self._cache.pods()), node, ids, self.served_counts())
            return None if isinstance(result, AllocateError) and result.waitable else result

        found = attempt() if fresh is None else choose(fresh, node, ids, self.served_counts())
        if isinstance(found, AllocateError) and found.waitable:
            found = None
        if found is None:  # a candidate's allocation may still be on its way: wait for the cache to show it
            found = await self._cache.wait_for(attempt, self._config.lookup_wait_s)
            self._metrics.lookup_wait_seconds.observe(time.perf_counter() - started)
        if found is None:  # nothing within the wait: a last authoritative read before refusing
            final = await self._fresh_pods()
            found = choose(candidates(self._cache.pods() if final is None else final), node, ids, self.served_counts())
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

    async def _fresh_pods(self) -> tuple[PodRecord, ...] | None:
        """The node's pods from a LIST begun after this call; None when unreadable."""
        try:
            return await self._fresh.get()
        except Exception as exc:
            self._metrics.errors.labels("pod_list").inc()
            log.warning(
                "cannot list the pods of node %s; Allocate relies on the watch alone: %s", self._config.node, exc
            )
            return None

    async def _list_pods(self) -> tuple[PodRecord, ...]:
        """One LIST of the node's pods, fed to the cache; shared by the Allocates waiting for it."""
        pods, _ = await asyncio.to_thread(self._gateway.list_pods, self._config.node)
        return tuple(self._cache.merge(pods))

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
