"""Pods bound to this node, kept current by a watch, with event-driven waiting for Allocate.

Allocate may arrive before the watch has delivered the extender's allocation (the bind and the
annotation race the kubelet), so lookups wait on *changes to this cache*, bounded by a deadline,
rather than polling the API server. The watch runs in a thread (the Kubernetes client blocks) and
hands each event to the event loop with ``call_soon_threadsafe``, which keeps their order.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from device_plugin.gateway import Json, KubeGateway, WatchExpired, WatchKind
from device_plugin.pods import PodRecord, from_json

log = logging.getLogger(__name__)
T = TypeVar("T")


class PodCache:
    """Pod records by UID. Mutated only on the event loop; waiters wake on every change."""

    def __init__(self) -> None:
        self._pods: dict[str, PodRecord] = {}
        self._changed = asyncio.Event()
        self.synced = asyncio.Event()

    def pods(self) -> Iterable[PodRecord]:
        return self._pods.values()

    def get(self, uid: str) -> PodRecord | None:
        return self._pods.get(uid)

    def replace(self, pods: Iterable[Json]) -> None:
        self._pods = {r.uid: r for r in map(from_json, pods)}
        self.synced.set()
        self._wake()

    def apply(self, kind: WatchKind, pod: Json) -> None:
        record = from_json(pod)
        if kind == "DELETED":
            self._pods.pop(record.uid, None)
        else:
            self._pods[record.uid] = record
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, probe: Callable[[], T | None], timeout_s: float) -> T | None:
        """``probe()`` as soon as it is not None, re-evaluated on each change, or None at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            changed = self._changed
            found = probe()
            remaining = deadline - time.monotonic()
            if found is not None or remaining <= 0:
                return found
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return probe()


class PodFeed:
    """A thread that lists then watches this node's pods into a :class:`PodCache`, re-listing on expiry."""

    def __init__(self, gateway: KubeGateway, node: str, cache: PodCache, *, backoff_max_s: float = 30.0) -> None:
        self._gateway, self._node, self._cache = gateway, node, cache
        self._backoff_max_s = backoff_max_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(target=self._run, args=(loop,), name="pod-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        backoff = 0.5
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    pods, version = self._gateway.list_pods(self._node)
                    loop.call_soon_threadsafe(self._cache.replace, pods)
                for kind, pod in self._gateway.watch_pods(self._node, version, self._stop):
                    version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
                    loop.call_soon_threadsafe(self._cache.apply, kind, pod)
                backoff = 0.5
            except WatchExpired:
                version = None
            except RuntimeError:  # the loop closed under us: we are shutting down
                return
            except Exception:
                log.exception("pod watch on node %s failed; retrying in %.1fs", self._node, backoff)
                version = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max_s)
