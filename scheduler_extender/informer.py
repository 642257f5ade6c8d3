"""List-then-watch of one kind, feeding a sink: the thin loop that keeps the cluster cache current.

Kept as small as possible on purpose (kopf's ``infinite_watch`` lesson): every decision about what
an event *means* lives in the cache (pure, unit-tested); this loop only lists, remembers the
resourceVersion, watches from it, relists on 410 Gone, and backs off on other errors. It runs in a
daemon thread because the official client is blocking. ``iterations`` lets tests run a bounded
number of list/watch rounds without threads or sleeps.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable
from typing import Protocol

from scheduler_extender.gateway import GatewayError, GoneError, Kind, KubeGateway, RawObject, WatchEvent

log = logging.getLogger(__name__)


class Sink(Protocol):
    """Where the informer delivers what it sees (the cluster cache)."""

    def listing(self, kind: Kind) -> None:
        """A full list of this kind is about to be requested (what changes from now on may be missing from it)."""
        ...

    def replace(self, kind: Kind, items: list[RawObject]) -> None:
        """A full list: the new truth for this kind (objects not in it are gone)."""
        ...

    def apply(self, kind: Kind, event: WatchEvent) -> None:
        """One watch event."""
        ...


class Backoff:
    """Exponential pause between failed rounds: 0.5 s doubling up to ``maximum``; reset on success."""

    def __init__(self, maximum: float, initial: float = 0.5) -> None:
        self.maximum = maximum
        self.initial = initial
        self.current = 0.0

    def next(self) -> float:
        self.current = min(self.maximum, self.current * 2 if self.current else self.initial)
        return self.current

    def reset(self) -> None:
        self.current = 0.0


def _resource_version(obj: RawObject) -> str | None:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None


class Informer:
    """Keeps ``sink`` in step with one kind. ``synced`` is set once the first list has landed."""

    def __init__(
        self,
        gateway: KubeGateway,
        kind: Kind,
        sink: Sink,
        *,
        watch_timeout: int,
        backoff_max: float,
        stop: threading.Event,
        on_error: Callable[[Kind, str], None] | None = None,
    ) -> None:
        self.gateway = gateway
        self.kind = kind
        self.sink = sink
        self.watch_timeout = watch_timeout
        self.stop = stop
        self.synced = threading.Event()
        self.backoff = Backoff(backoff_max)
        self.resource_version: str | None = None
        self.on_error = on_error

    def run(self, iterations: int | None = None) -> None:
        """Loop until ``stop`` is set (or for ``iterations`` list/watch rounds)."""
        done = 0
        while not self.stop.is_set() and (iterations is None or done < iterations):
            done += 1
            try:
                self._round()
                self.backoff.reset()
            except GoneError:
                log.info("%s watch expired (410 Gone); relisting", self.kind)
                self.resource_version = None
            except Exception as exc:  # any failure of one round: report, pause, resume the watch
                pause = self.backoff.next()
                reason = exc.__class__.__name__ if not isinstance(exc, GatewayError) else f"HTTP {exc.status}"
                log.warning("%s list/watch failed (%s: %s); retrying in %.1fs", self.kind, reason, exc, pause)
                if self.on_error is not None:
                    self.on_error(self.kind, reason)
                self.stop.wait(pause)

    def _round(self) -> None:
        if self.resource_version is None:
            self.sink.listing(self.kind)
            listing = self.gateway.list(self.kind)
            listing_rv = listing.resource_version
            self.sink.replace(self.kind, listing.items)
            del listing
            # What a full list leaves behind lives long; freezing it keeps the cyclic GC from
            # re-scanning tens of thousands of cached objects on every collection (p99 latency).
            gc.freeze()
            self.resource_version = listing_rv
            self.synced.set()
        for event in self.gateway.watch(self.kind, self.resource_version, self.watch_timeout):
            if event.type != "BOOKMARK":
                self.sink.apply(self.kind, event)
            self.resource_version = _resource_version(event.object) or self.resource_version
            if self.stop.is_set():
                return

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"informer-{self.kind.lower()}", daemon=True)
        thread.start()
        return thread
