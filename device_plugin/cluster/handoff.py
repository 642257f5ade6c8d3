"""The hand-off receipt: written when a pod's last container got its devices, then kept true.

The receipt (:class:`~vgpu.contract.allocation.Handoff`) records which device IDs each container got:
the lookup serves no pod twice by it, and finds a pod the kubelet allocates again (a node reboot) by it.
It is kept on the node (``--receipts-file``, receipts.py: no API write) or, without one, on the pod
(annotation ``handoff``, which also releases the extender's per-node gate; the kubelet's status write
releases it anyway). Writing it never delays Allocate: it is written in the background and retried by
the reconcile loop on failure. The loop
also compares receipts with the kubelet's PodResources ``List`` — the kubelet's own record of who
got which IDs — and rewrites a receipt that disagrees; it writes a missing receipt for a pod whose
containers PodResources shows fully allocated (the plugin restarted before writing it), and hands
partially allocated pods back to the allocator so their remaining containers are served in order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Protocol

from device_plugin.background import Background
from device_plugin.cluster.gateway import KubeGateway
from device_plugin.cluster.pod_cache import PodCache
from device_plugin.cluster.pods import PodRecord
from device_plugin.cluster.receipts import ReceiptFile
from device_plugin.kubelet.kubelet_api import PodDevices
from device_plugin.metrics import PluginMetrics
from vgpu.contract.allocation import Handoff, decode_handoff, encode_handoff
from vgpu.errors import DomainError
from vgpu.names import SystemAnnotation
from vgpu.timefmt import rfc3339

log = logging.getLogger(__name__)
Devices = tuple[tuple[str, tuple[str, ...]], ...]


def rfc3339_now() -> str:
    return rfc3339(time.time(), "milliseconds")


class ServedBook(Protocol):
    def serving(self) -> Collection[str]: ...

    def adopt(self, uid: str, done: Iterable[tuple[str, tuple[str, ...]]]) -> None: ...


class HandoffKeeper:
    def __init__(
        self,
        gateway: KubeGateway,
        cache: PodCache,
        node: str,
        metrics: PluginMetrics,
        *,
        pod_devices: Callable[[], Awaitable[PodDevices]] | None = None,
        now: Callable[[], str] = rfc3339_now,
        local: ReceiptFile | None = None,
    ) -> None:
        self._gateway, self._cache, self._node, self._metrics = gateway, cache, node, metrics
        self._pod_devices, self._now, self._local = pod_devices, now, local
        self._saving = asyncio.Lock()
        if local is not None:
            cache.hold_receipts(local.load())
        self._pending: dict[str, tuple[PodRecord, Handoff]] = {}
        self._background = Background()

    def record(self, pod: PodRecord, devices: Devices) -> None:
        """Write the receipt for ``pod`` in the background (retried by :meth:`reconcile_once`)."""
        self._pending[pod.uid] = (pod, self._receipt(pod, devices))
        self._background.spawn(self._write(pod.uid))

    async def drain(self) -> None:
        """Wait for receipts being written now (tests, shutdown)."""
        await self._background.drain()

    async def _write(self, uid: str) -> None:
        entry = self._pending.get(uid)
        if entry is None:
            return
        pod, receipt = entry
        if self._local is not None:
            await self._keep_locally(uid, entry)
            return
        try:
            patched = await asyncio.to_thread(
                self._gateway.patch_pod_annotations,
                pod.namespace,
                pod.name,
                {SystemAnnotation.HANDOFF.value: encode_handoff(receipt)},
            )
        except Exception as exc:
            self._metrics.errors.labels("handoff_patch").inc()
            log.warning("cannot write hand-off receipt on pod %s (will retry): %s", pod.key, exc)
            if self._cache.get(uid) is None:
                self._pending.pop(uid, None)
            return
        if self._pending.get(uid) == entry:
            del self._pending[uid]
        self._cache.apply("MODIFIED", patched)

    async def _keep_locally(self, uid: str, entry: tuple[PodRecord, Handoff]) -> None:
        self._cache.hold_receipt(uid, encode_handoff(entry[1]))
        if self._pending.get(uid) == entry:
            del self._pending[uid]
        await self._save()

    async def _save(self) -> None:
        """Write the cache's receipts to the node's file; one save at a time, each of everything held then."""
        assert self._local is not None
        async with self._saving:
            try:
                await asyncio.to_thread(self._local.save, self._cache.receipts())
            except OSError as exc:  # held in memory; the next change or reconcile writes the file again
                self._metrics.errors.labels("handoff_file").inc()
                log.warning("cannot write the hand-off receipts to %s: %s", self._local.path, exc)

    async def _forget_gone(self) -> None:
        """Drop the node-local receipts of pods no longer on the node (once the pod list is known)."""
        if self._local is None or not self._cache.synced.is_set():
            return
        held = self._cache.receipts()
        kept = {uid: text for uid, text in held.items() if self._cache.get(uid) is not None}
        if kept != held:
            self._cache.hold_receipts(kept)
            await self._save()

    async def reconcile_once(self, book: ServedBook) -> None:
        await self._forget_gone()
        for uid in list(self._pending):
            await self._write(uid)
        if self._pod_devices is None:
            return
        try:
            truth = await self._pod_devices()
        except Exception as exc:
            self._metrics.errors.labels("podresources").inc()
            log.warning("PodResources List failed: %s", exc)
            return
        served = book.serving()
        for pod in list(self._cache.pods()):
            if pod.node != self._node or not pod.active or pod.allocation is None or pod.uid in self._pending:
                continue
            got = truth.get((pod.namespace, pod.name))
            if not got:
                continue
            kubelet_order = tuple((c, got[c]) for c, _ in pod.vgpu_containers if c in got)
            if pod.handoff is None:
                self._recover(pod, kubelet_order, served, book)
            else:
                self._correct(pod, kubelet_order)
        for uid in list(self._pending):
            await self._write(uid)

    def _recover(self, pod: PodRecord, kubelet_order: Devices, served: Collection[str], book: ServedBook) -> None:
        names = [c for c, _ in pod.vgpu_containers]
        if len(kubelet_order) == len(names):
            log.info("pod %s: every container is allocated but no receipt exists; writing it", pod.key)
            self._pending[pod.uid] = (pod, self._receipt(pod, kubelet_order))
        elif pod.uid not in served and [c for c, _ in kubelet_order] == names[: len(kubelet_order)]:
            book.adopt(pod.uid, kubelet_order)

    def _receipt(self, pod: PodRecord, devices: Devices) -> Handoff:
        return Handoff(pod_uid=pod.uid, node=self._node, devices=devices, at=self._now())

    def _correct(self, pod: PodRecord, kubelet_order: Devices) -> None:
        assert pod.handoff is not None
        try:
            receipt = decode_handoff(pod.handoff)
        except DomainError:
            receipt = None
        if receipt is not None and receipt.pod_uid == pod.uid:
            recorded = {c: frozenset(ids) for c, ids in receipt.devices}
            if all(recorded.get(c) == frozenset(ids) for c, ids in kubelet_order):
                return
        log.warning("pod %s: hand-off receipt disagrees with the kubelet's PodResources; rewriting it", pod.key)
        self._pending[pod.uid] = (pod, self._receipt(pod, kubelet_order))

    async def run(self, book: ServedBook, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.reconcile_once(book)
            except Exception:
                self._metrics.errors.labels("reconcile").inc()
                log.exception("hand-off reconcile failed")
