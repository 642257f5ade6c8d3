"""Pods bound to this node, kept current by a watch, with event-driven waiting for Allocate.

Allocate decides on a fresh LIST (see :mod:`device_plugin.allocator`); when a pod it found there has
no allocation yet, it waits on *changes to this cache*, bounded by a deadline, rather than polling
the API server, and when the API cannot be read this cache is all it has. The watch runs in a thread
(the Kubernetes client blocks) and hands each event to the event loop with ``call_soon_threadsafe``,
which keeps their order.

Three sources write here: the watch, the pod a hand-off patch returns, and the fresh LISTs Allocate
takes. They can arrive out of order (a busy watch still delivering an older version of a pod the
patch already returned), and an older version must never replace a newer one: a receipt that
disappears again would make a handed-off pod look awaiting. So each pod's resourceVersion is kept,
with those of recently deleted pods, and anything not newer is ignored. Versions are etcd
revisions, integers on every Kubernetes API server; one that is not an integer cannot be ordered
and is applied as it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from device_plugin.gateway import Json, KubeGateway, WatchExpired, WatchKind
from device_plugin.pods import PodRecord, from_json

log = logging.getLogger(__name__)
T = TypeVar("T")
_TOMBSTONES = 4096  # deleted pods whose version is kept, so a LIST taken before a deletion cannot revive them


def _version(pod: Json) -> int | None:
    raw = (pod.get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(raw))
    except ValueError:
        return None


class PodCache:
    """Pod records by UID. Mutated only on the event loop; waiters wake on every change."""

    def __init__(self) -> None:
        self._pods: dict[str, PodRecord] = {}
        self._versions: dict[str, int] = {}  # live pods' resourceVersions
        self._gone: dict[str, int] = {}  # deleted pods' last resourceVersions, oldest first
        self._changed = asyncio.Event()
        self.synced = asyncio.Event()

    def pods(self) -> Iterable[PodRecord]:
        return self._pods.values()

    def get(self, uid: str) -> PodRecord | None:
        return self._pods.get(uid)

    def replace(self, pods: Iterable[Json]) -> None:
        """A (re)list: the pods now on the node. A pod the cache holds newer (a patch's answer that
        landed while the list was on its way) keeps its newer record."""
        fresh: dict[str, PodRecord] = {}
        versions: dict[str, int] = {}
        for pod in pods:
            record, version = from_json(pod), _version(pod)
            if self._stale(record.uid, version):
                kept = self._pods.get(record.uid)
                if kept is None:  # deleted after this list was taken
                    continue
                record, version = kept, self._versions.get(record.uid)
            fresh[record.uid] = record
            if version is not None:
                versions[record.uid] = version
        self._pods, self._versions = fresh, versions
        self.synced.set()
        self._wake()

    def merge(self, pods: Iterable[Json]) -> list[PodRecord]:
        """Take in a fresh LIST of the node's pods (newer versions only); returns the LIST's records.

        Pods missing from the LIST stay until the watch delivers their deletion: the caller decides on
        the LIST itself, the cache only must not fall behind it."""
        records = []
        for pod in pods:
            record = from_json(pod)
            records.append(record)
            self._put("MODIFIED", record, _version(pod))
        self._wake()
        return records

    def apply(self, kind: WatchKind, pod: Json) -> None:
        if self._put(kind, from_json(pod), _version(pod)):
            self._wake()

    def _put(self, kind: WatchKind, record: PodRecord, version: int | None) -> bool:
        if self._stale(record.uid, version):
            return False
        if kind == "DELETED":
            self._pods.pop(record.uid, None)
            self._versions.pop(record.uid, None)
            if version is not None:
                self._gone[record.uid] = version
                if len(self._gone) > _TOMBSTONES:
                    del self._gone[next(iter(self._gone))]
        else:
            self._pods[record.uid] = record
            if version is None:
                self._versions.pop(record.uid, None)
            else:
                self._versions[record.uid] = version
        return True

    def _stale(self, uid: str, version: int | None) -> bool:
        """Is this version of pod ``uid`` not newer than one already seen (alive or deleted)?"""
        known = self._versions.get(uid, self._gone.get(uid))
        return version is not None and known is not None and version <= known

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout_s: float) -> None:
        """Return at the next change, or after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

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
