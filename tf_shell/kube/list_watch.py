"""The one list–watch loop: list, then watch from the list's version, relist on 410 Gone, back off on errors.

Kept as small as possible on purpose: every decision about what an event *means* lives in the sink
(the extender's cluster cache, the device plugin's pod cache); this loop only lists, remembers the
resourceVersion, watches from it, relists when the version is gone, and backs off on other errors.
It runs in a daemon thread because the official client is blocking. ``iterations`` lets tests run a
bounded number of list/watch rounds without threads or sleeps.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

from tf_shell.kube.api import GatewayError, GoneError, Listing, RawObject, WatchEvent

log = logging.getLogger(__name__)


class Source(Protocol):
    """What is listed and watched (one kind, or the pods of one node)."""

    def list(self) -> Listing:
        """Every object, with the resourceVersion of the list."""
        ...

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Changes since ``resource_version`` until the server ends the watch; GoneError on 410.
        BOOKMARK events carry only a newer resourceVersion to resume from."""
        ...


class Sink(Protocol):
    """Where the loop delivers what it sees."""

    def listing(self) -> None:
        """A full list is about to be requested (what changes from now on may be missing from it)."""
        ...

    def replace(self, items: list[RawObject]) -> None:
        """A full list: the new truth (objects not in it are gone)."""
        ...

    def apply(self, event: WatchEvent) -> None:
        """One watch event."""
        ...


class Backoff:
    """Exponential pause between failed rounds: ``initial`` doubling up to ``maximum``; reset on success."""

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
    """Keeps ``sink`` in step with ``source``. ``synced`` is set once the first list has landed."""

    def __init__(
        self,
        name: str,
        source: Source,
        sink: Sink,
        *,
        watch_timeout: int,
        backoff_max: float,
        stop: threading.Event,
        on_error: Callable[[str], None] | None = None,
        relist_after_error: bool = False,
    ) -> None:
        """``relist_after_error``: after a failed round, list again instead of resuming the watch (for a sink
        that stops trusting what it holds on an error, so that only a list restores it)."""
        self.name = name
        self.source = source
        self.sink = sink
        self.watch_timeout = watch_timeout
        self.stop = stop
        self.synced = threading.Event()
        self.backoff = Backoff(backoff_max)
        self.resource_version: str | None = None
        self.on_error = on_error
        self.relist_after_error = relist_after_error

    def run(self, iterations: int | None = None) -> None:
        """Loop until ``stop`` is set (or for ``iterations`` list/watch rounds)."""
        done = 0
        while not self.stop.is_set() and (iterations is None or done < iterations):
            done += 1
            try:
                self._round()
                self.backoff.reset()
            except GoneError:
                log.info("%s watch expired (410 Gone); relisting", self.name)
                self.resource_version = None
            except Exception as exc:  # any failure of one round: report, pause, resume the watch
                pause = self.backoff.next()
                reason = exc.__class__.__name__ if not isinstance(exc, GatewayError) else f"HTTP {exc.status}"
                log.warning("%s list/watch failed (%s: %s); retrying in %.1fs", self.name, reason, exc, pause)
                if self.on_error is not None:
                    self.on_error(reason)
                if self.relist_after_error:
                    self.resource_version = None
                self.stop.wait(pause)

    def _round(self) -> None:
        if self.resource_version is None:
            self.sink.listing()
            listing = self.source.list()
            listing_rv = listing.resource_version
            self.sink.replace(listing.items)
            del listing
            # What a full list leaves behind lives long; freezing it keeps the cyclic GC from
            # re-scanning tens of thousands of cached objects on every collection (p99 latency).
            gc.freeze()
            self.resource_version = listing_rv
            self.synced.set()
        for event in self.source.watch(self.resource_version, self.watch_timeout):
            if event.type != "BOOKMARK":
                self.sink.apply(event)
            self.resource_version = _resource_version(event.object) or self.resource_version
            if self.stop.is_set():
                return

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"informer-{self.name.lower()}", daemon=True)
        thread.start()
        return thread
