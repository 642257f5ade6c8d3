"""Pods bound to this node, kept current by the shared list–watch loop, with event-driven waiting for Allocate.

Allocate decides on a fresh LIST (:mod:`device_plugin.kubelet.allocator`); when a pod it found there has
no allocation yet, it waits on changes to this cache, bounded by a deadline, rather than polling the
API server. The watch, hand-off patch answers and Allocate's LISTs all write here and may arrive out of
order, so each pod's resourceVersion (and recently deleted pods') is kept and anything not newer is
ignored. Why: docs/design-notes.md, section ``device_plugin/cluster/pod_cache.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Final, TypeVar

from device_plugin.cluster.gateway import Json, KubeGateway, WatchKind
from device_plugin.cluster.pods import PodRecord, from_json
from tf_shell.kube.api import Listing, RawObject, WatchEvent
from tf_shell.kube.list_watch import Informer

T = TypeVar("T")
_TOMBSTONES = 4096  # deleted pods whose version is kept, so a LIST taken before a deletion cannot revive them
WATCH_TIMEOUT_S: Final = 60  # server-side timeout of one watch request; the watch then resumes
BACKOFF_MAX_S: Final = 30.0  # longest pause between retries after a list/watch error


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
        self._receipts: dict[str, str] = {}  # pod UID -> its node-local hand-off receipt (receipts.py)
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
            record, version = self._read(pod), _version(pod)
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
            record = self._read(pod)
            records.append(record)
            self._put("MODIFIED", record, _version(pod))
        self._wake()
        return records

    def apply(self, kind: WatchKind, pod: Json) -> None:
        if self._put(kind, self._read(pod), _version(pod)):
            self._wake()

    def hold_receipts(self, receipts: Mapping[str, str]) -> None:
        """Node-local receipts (pod UID -> encoded receipt): each pod's record shows its own as its hand-off
        receipt, unless the pod carries one (written by an earlier version of the plugin)."""
        self._receipts = dict(receipts)
        for uid, record in list(self._pods.items()):
            text = self._receipts.get(uid)
            if text is not None and record.handoff is None:
                self._pods[uid] = replace(record, handoff=text)
        self._wake()

    def hold_receipt(self, uid: str, text: str) -> None:
        """One pod's node-local receipt, new or rewritten: its record shows it, unless the pod carries a
        receipt of its own (one that is not the node's previous receipt for it)."""
        previous = self._receipts.get(uid)
        self._receipts[uid] = text
        record = self._pods.get(uid)
        if record is not None and record.handoff in (None, previous):
            self._pods[uid] = replace(record, handoff=text)
        self._wake()

    def receipts(self) -> dict[str, str]:
        return dict(self._receipts)

    def _read(self, pod: Json) -> PodRecord:
        record = from_json(pod)
        text = self._receipts.get(record.uid)
        return record if text is None or record.handoff is not None else replace(record, handoff=text)

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


@dataclass(frozen=True, slots=True)
class NodePods:
    """The informer's source: the pods bound to ``node``, through the gateway."""

    gateway: KubeGateway
    node: str
    stop: threading.Event

    def list(self) -> Listing:
        return self.gateway.list_pods(self.node)

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        if self.stop.is_set():  # stopped while listing: no watch to wait out
            return iter(())
        return self.gateway.watch_pods(self.node, resource_version, timeout_seconds)


class LoopSink:
    """The informer's sink: hands each list and event to ``cache`` on ``loop``, in order (``call_soon_threadsafe``).

    Once the loop is closed (the daemon has shut down) it sets ``stop``, so the informer ends quietly."""

    def __init__(self, cache: PodCache, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        self._cache, self._loop, self._stop = cache, loop, stop

    def listing(self) -> None:
        pass  # the cache keeps what it has until the list lands

    def replace(self, items: list[RawObject]) -> None:
        self._post(lambda: self._cache.replace(items))

    def apply(self, event: WatchEvent) -> None:
        kind, pod = event.type, event.object
        if kind != "BOOKMARK":
            self._post(lambda: self._cache.apply(kind, pod))

    def _post(self, work: Callable[[], None]) -> None:
        try:
            self._loop.call_soon_threadsafe(work)
        except RuntimeError:
            if not self._loop.is_closed():
                raise
            self._stop.set()


class PodFeed:
    """Lists then watches this node's pods into a :class:`PodCache` (the shared list–watch loop, in a daemon
    thread), listing again when the watch's version is gone and backing off up to ``backoff_max_s`` on errors."""

    def __init__(
        self, gateway: KubeGateway, node: str, cache: PodCache, *, backoff_max_s: float = BACKOFF_MAX_S
    ) -> None:
        self._gateway, self._node, self._cache = gateway, node, cache
        self._backoff_max_s = backoff_max_s
        self._stop = threading.Event()
        self.informer: Informer | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> threading.Thread:
        self.informer = Informer(
            f"pods on {self._node}",
            NodePods(self._gateway, self._node, self._stop),
            LoopSink(self._cache, loop, self._stop),
            watch_timeout=WATCH_TIMEOUT_S,
            backoff_max=self._backoff_max_s,
            stop=self._stop,
        )
        return self.informer.start()

    def stop(self) -> None:
        self._stop.set()
