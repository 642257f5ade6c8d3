"""Allocate's work: find the pod (from a fresh read of the API), validate, answer, track the hand-off.

The kubelet calls Allocate once per container, init containers first, and expects the answer at once.
The pod is chosen from a LIST of the node's pods taken after the Allocate arrived, shared between
concurrent Allocates by :class:`~device_plugin.kubelet.fresh_read.FreshRead`, not from the watch-fed
cache alone, which can lag and then serve the wrong pod. Choice, validation and bookkeeping run without
an ``await`` in between, so no container is served twice. Each answer is provisional until the
kubelet's PodResources record confirms it (:mod:`device_plugin.kubelet.proof`); once all of a pod's
containers are, the :class:`~device_plugin.cluster.handoff.HandoffKeeper` writes the receipt that
releases the extender's gate. :meth:`Allocator.verify_start` is PreStartContainer's check.
Why, and the incident behind the fresh LIST: docs/architecture.md, section "The hand-off".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from device_plugin.background import Background
from device_plugin.cluster.gateway import KubeGateway
from device_plugin.cluster.handoff import HandoffKeeper
from device_plugin.cluster.pod_cache import PodCache
from device_plugin.cluster.pods import PodRecord
from device_plugin.enforcement.cdi import CdiSpecs
from device_plugin.enforcement.envs import ContainerGrant, EnforcementPaths, LiveMount, Target, build
from device_plugin.enforcement.live_files import LiveLimits
from device_plugin.gpus.board import DeviceBoard
from device_plugin.kubelet.fresh_read import FreshRead
from device_plugin.kubelet.kubelet_api import PodDevices
from device_plugin.kubelet.lookup import AllocateError, Match, awaiting, choose, next_container, validate
from device_plugin.kubelet.proof import Answer, Outcome, holders, refusal, settle
from device_plugin.metrics import PluginMetrics
from vgpu import isolation
from vgpu.contract.allocation import PodAllocation, decode
from vgpu.contract.inventory import GpuInfo
from vgpu.errors import DomainError
from vgpu.names import DeviceDelivery, EnforcementBackend

log = logging.getLogger(__name__)
# When the confirmation task reads PodResources after an answer: the kubelet records the answer as
# soon as Allocate returns, so the first read usually settles it; ~4 s in all.
CONFIRM_BACKOFF_S: Final = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.5)
STOLEN_KEPT: Final = 1024  # stolen answers remembered for PreStartContainer's message


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
        pod_devices: Callable[[], Awaitable[PodDevices]],
        live: LiveLimits | None = None,
        cdi: CdiSpecs | None = None,
        delivery: Callable[[], DeviceDelivery] = lambda: DeviceDelivery.ENVVAR,
        mps_admit: Callable[[str, PodAllocation], Awaitable[None]] | None = None,
    ) -> None:
        """``live``: where each container's live limits are kept (None: nowhere, limits fixed at start);
        ``cdi``: where each answer is also written as a CDI device, which the runtime applies after the
        container's own environment (None: CDI off, the answer's envs alone); ``delivery``: how containers
        are given their GPUs now (:mod:`device_plugin.enforcement.toolkit_check` follows the node's toolkit);
        ``mps_admit(uid, alloc)``: raises the MPS daemon's ceiling to a grant served under MPS before its
        answer goes back (None: no MPS daemon)."""
        self._config, self._gateway, self._cache = config, gateway, cache
        self._live, self._cdi, self._delivery, self._mps_admit = live, cdi, delivery, mps_admit
        self._board, self._keeper, self._metrics = board, keeper, metrics
        self._pending: dict[frozenset[str], Answer] = {}  # provisional answers, by their device IDs
        self._confirmed: dict[str, dict[str, tuple[str, ...]]] = {}  # pod UID → container → IDs, kubelet order
        self._stolen: dict[frozenset[str], Answer] = {}  # answers whose IDs the kubelet gave another pod
        self._fresh = FreshRead(self._list_pods)
        self._truth = FreshRead(pod_devices)
        self._background = Background()

    def served(self) -> Mapping[str, frozenset[str]]:
        """Containers per pod UID that are answered (pending) or confirmed: not to be answered again."""
        out: dict[str, set[str]] = {uid: set(done) for uid, done in self._confirmed.items()}
        for answer in self._pending.values():
            out.setdefault(answer.uid, set()).add(answer.container)
        return {uid: frozenset(names) for uid, names in out.items()}

    def serving(self) -> Collection[str]:
        return self.served().keys()

    def confirmed(self) -> Mapping[str, Mapping[str, frozenset[str]]]:
        return {uid: {c: frozenset(ids) for c, ids in done.items()} for uid, done in self._confirmed.items()}

    async def allocate(self, ids: tuple[str, ...]) -> ContainerGrant:
        """The answer for one container request; raises :class:`AllocateError` with the reason."""
        started = time.perf_counter()
        node = self._config.node
        fresh, truth = await asyncio.gather(self._fresh_pods(), self._fresh_truth())
        if truth is not None:
            self._settle(truth)
        self.prune()
        eligible = None if fresh is None else {p.uid for p in fresh}

        def candidates(pods: Iterable[PodRecord]) -> list[PodRecord]:
            return list(pods) if eligible is None else [p for p in pods if p.uid in eligible]

        def attempt() -> Match | AllocateError | None:
            result = choose(candidates(self._cache.pods()), node, ids, self.served())
            return None if isinstance(result, AllocateError) and result.waitable else result

        found = attempt() if fresh is None else choose(fresh, node, ids, self.served())
        if isinstance(found, AllocateError) and found.waitable:
            found = None
        if found is None:  # a candidate's allocation may still be on its way: wait for the cache to show it
            found = await self._cache.wait_for(attempt, self._config.lookup_wait_s)
            self._metrics.lookup_wait_seconds.observe(time.perf_counter() - started)
        if found is None:  # nothing within the wait: a last authoritative read before refusing
            final = await self._fresh_pods()
            found = choose(candidates(self._cache.pods() if final is None else final), node, ids, self.served())
        if isinstance(found, AllocateError):
            raise found
        on_board = self._board.by_uuid()
        alloc = validate(found.pod, node, on_board, self._config.backend)
        if not found.again:
            pod = found.pod
            self._pending[frozenset(ids)] = Answer(pod.uid, pod.namespace, pod.name, found.container, ids)
            self._background.spawn(self._confirm(frozenset(ids)))
        target = Target(namespace=found.pod.namespace, pod=found.pod.name, container=found.container)
        gpus = [g.uuid for g in alloc.gpus_of(found.container)]
        log.info(
            "Allocate %s: pod %s container %s, GPUs %s%s",
            list(ids),
            found.pod.key,
            found.container,
            gpus,
            " (again)" if found.again else " (provisional until the kubelet records it)",
            extra={"pod": found.pod.key, "container": found.container, "gpus": gpus, "devices": list(ids)},
        )
        backend = self._backend(alloc, on_board)
        if self._mps_admit is not None and backend is EnforcementBackend.MPS:
            await self._mps_admit(found.pod.uid, alloc)
        live = None if self._live is None else await self._live.mount(target, found.pod.uid, alloc)
        grant = build(alloc, target, backend, self._config.paths, live, self._delivery())
        if self._cdi is None:
            return grant
        try:
            device = await self._cdi.publish(found.pod.uid, found.container, grant)
        except (OSError, ValueError) as exc:
            # Without its CDI device the container's own environment would override the grant: refuse.
            self._metrics.errors.labels("cdi").inc()
            if not found.again:
                self._pending.pop(frozenset(ids), None)
            raise AllocateError(
                f"cannot write the CDI spec of pod {found.pod.key} container {found.container} in "
                f"{self._cdi.root}: {exc}"
            ) from exc
        return replace(grant, cdi_devices=(*grant.cdi_devices, device))

    def regrant(self, pod: PodRecord, container: str) -> ContainerGrant | None:
        """The answer ``container`` of ``pod`` would get now, without an Allocate's bookkeeping or files: what
        a missing CDI spec is written again from. None when the pod's allocation no longer validates."""
        on_board = self._board.by_uuid()
        try:
            alloc = validate(pod, self._config.node, on_board, self._config.backend)
        except AllocateError as exc:
            log.warning("no CDI spec for pod %s container %s: %s", pod.key, container, exc)
            return None
        live = None
        if self._live is not None:
            directory = self._live.directory((pod.uid, container))
            live = LiveMount(str(directory)) if directory.is_dir() else None
        target = Target(namespace=pod.namespace, pod=pod.name, container=container)
        return build(alloc, target, self._backend(alloc, on_board), self._config.paths, live, self._delivery())

    def _backend(self, alloc: PodAllocation, on_board: Mapping[str, GpuInfo]) -> EnforcementBackend:
        """Whose limiter the grant's containers get (a MIG unit on an MPS node: none); ``alloc`` is validated
        against ``on_board``, so each of its GPUs is there."""
        unit = any(on_board[g.uuid].parent is not None for g in alloc.gpus)
        return isolation.enforcing(self._config.backend, mig_unit=unit)

    async def verify_start(self, ids: tuple[str, ...]) -> None:
        """PreStartContainer: raise :class:`AllocateError` unless the container holding ``ids`` is proven
        to hold its own pod's grant (:func:`device_plugin.kubelet.proof.refusal`)."""
        truth = await self._fresh_truth()
        if truth is None:
            raise AllocateError(
                f"cannot read the kubelet's PodResources on node {self._config.node} to prove which pod holds "
                f"devices {list(ids)}; the container starts once it can"
            )
        self._settle(truth)
        pods = {(p.namespace, p.name): p for p in self._cache.pods()}
        reason = refusal(ids, truth, pods, self.confirmed(), self._stolen, self._config.node)
        if reason is not None and any((h.namespace, h.pod) not in pods for h in holders(truth, ids)):
            fresh = await self._fresh_pods()  # a pod the watch has not shown yet
            if fresh is not None:
                pods = {(p.namespace, p.name): p for p in fresh}
                reason = refusal(ids, truth, pods, self.confirmed(), self._stolen, self._config.node)
        if reason is not None:
            raise AllocateError(reason)

    def _settle(self, truth: PodDevices) -> None:
        """Settle every provisional answer against the kubelet's record (see :mod:`device_plugin.kubelet.proof`)."""
        for key, answer in list(self._pending.items()):
            result = settle(answer, truth)
            if result.outcome is Outcome.PENDING:
                continue
            del self._pending[key]
            assert result.holder is not None
            if result.outcome is Outcome.STOLEN:
                self._stolen[key] = answer
                self._metrics.errors.labels("stolen_answer").inc()
                log.warning(
                    "the Allocate answered with pod %s's grant (devices %s) was pod %s's: %s holds no grant "
                    "of its own, so its container will not start; %s stays in hand-off for its own Allocate",
                    answer.key,
                    list(answer.ids),
                    result.holder.key,
                    result.holder.key,
                    answer.key,
                    extra={"pod": result.holder.key, "container": result.holder.container, "devices": list(answer.ids)},
                )
                continue
            done = self._confirmed.setdefault(answer.uid, {})
            done[result.holder.container] = answer.ids
            pod = self._cache.get(answer.uid)
            if pod is not None and all(c in done for c, _ in pod.vgpu_containers):
                self._keeper.record(pod, tuple((c, done[c]) for c, _ in pod.vgpu_containers))

    async def _confirm(self, key: frozenset[str]) -> None:
        """Settle one answer as soon as the kubelet records it (it does so when Allocate returns)."""
        for delay in CONFIRM_BACKOFF_S:
            await asyncio.sleep(delay)
            if key not in self._pending:
                return
            truth = await self._fresh_truth()
            if truth is not None:
                self._settle(truth)

    async def _fresh_truth(self) -> PodDevices | None:
        """The kubelet's PodResources record from a read begun after this call; None when unreadable."""
        try:
            return await self._truth.get()
        except Exception as exc:
            self._metrics.errors.labels("podresources").inc()
            log.warning("PodResources List failed on node %s: %s", self._config.node, exc)
            return None

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
        listing = await asyncio.to_thread(self._gateway.list_pods, self._config.node)
        return tuple(self._cache.merge(listing.items))

    def adopt(self, uid: str, done: Iterable[tuple[str, tuple[str, ...]]]) -> None:
        """Containers the kubelet already allocated (seen in PodResources) for a pod we have no record of,
        e.g. after a plugin restart in the middle of a multi-container pod: confirmed by that record."""
        if uid not in self.served():
            self._confirmed[uid] = dict(done)

    def prune(self) -> None:
        """Drop bookkeeping for pods that left the cache or ended, and stolen answers whose thief left."""
        for uid in list(self._confirmed):
            pod = self._cache.get(uid)
            if pod is None or not pod.active:
                del self._confirmed[uid]
        for key, answer in list(self._pending.items()):
            pod = self._cache.get(answer.uid)
            if pod is None or not pod.active or pod.handoff is not None:
                del self._pending[key]
        if len(self._stolen) > STOLEN_KEPT:
            for key in list(self._stolen)[: len(self._stolen) - STOLEN_KEPT]:
                del self._stolen[key]

    async def preferred_gpus(self, size: int) -> tuple[str, ...]:
        """GPUs granted to the next container of the one pod whose next container wants ``size`` devices (a hint),
        else (). The kubelet may ask before this plugin's watch shows the pod bound: then the hint waits for it as
        Allocate does, at most ``lookup_wait_s``, rather than steer the kubelet to device IDs of other GPUs."""
        hint = self._hint(size)
        if hint is None:
            hint = await self._cache.wait_for(lambda: self._hint(size), self._config.lookup_wait_s)
        return hint or ()

    def _hint(self, size: int) -> tuple[str, ...] | None:
        """:meth:`preferred_gpus` now: None while no pod awaits an Allocate of ``size`` (one may be on its way)."""
        served = self.served()
        found = awaiting(self._cache.pods(), self._config.node, size, served)
        if not found:
            return None
        nxt = next_container(found[0], served.get(found[0].uid, ())) if len(found) == 1 else None
        if nxt is None or found[0].allocation is None:
            return ()
        try:
            return tuple(g.uuid for g in decode(found[0].allocation).gpus_of(nxt[0]))
        except DomainError:
            return ()
