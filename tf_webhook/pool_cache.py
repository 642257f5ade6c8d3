"""Every GPUPool in memory, kept current by a watch, so that admitting a pod reads no pool from the API server.

Each GPU pod's admission reads all the pools (defaults, which is the default, their GPUs' sizes); a LIST per
pod was ~26 % of the webhook's CPU at 1,000 nodes, and a LIST per pod for the API server. Pools are few,
cluster-scoped and change rarely, so the project's one list–watch loop (:mod:`tf_shell.kube.list_watch`) keeps
them here. The cache answers only while it can be trusted: from a list until a list/watch error (which forces a
new list: trust comes back with a list, not with a resumed watch). Until then readers list live, as without it;
and a pod is never refused on the cache's word (``decision.py`` reads the pools again first).
"""

from __future__ import annotations

import threading
from typing import Final

from tf_shell.kube.api import RawObject, WatchEvent
from tf_shell.kube.list_watch import Informer, Source

WATCH_TIMEOUT_S: Final = 300  # server-side timeout of one watch request; the watch then resumes
BACKOFF_MAX_S: Final = 10.0  # longest pause between retries after an error (every admission lists meanwhile)


class PoolCache:
    """The pools by name: the informer's :class:`~tf_shell.kube.list_watch.Sink`.

    Written by the informer's thread only; readers take the published tuple (one attribute read), so an
    admission never waits on a lock. ``None`` is published while the cache is not trusted."""

    def __init__(self) -> None:
        self._pools: dict[str, RawObject] = {}
        self._held: tuple[RawObject, ...] | None = None

    def held(self) -> tuple[RawObject, ...] | None:
        """Every pool, or None while the cache is not trusted (not listed yet, or failing): read live."""
        return self._held

    def listing(self) -> None:
        self._held = None  # what changed since the watch's version was lost may be missing until the list lands

    def replace(self, items: list[RawObject]) -> None:
        self._pools = {name: item for item in items if (name := _name(item))}
        self._publish()

    def apply(self, event: WatchEvent) -> None:
        name = _name(event.object)
        if not name:
            return
        if event.type == "DELETED":
            self._pools.pop(name, None)
        else:
            self._pools[name] = event.object
        if self._held is not None:
            self._publish()

    def distrust(self) -> None:
        """The list or watch failed: changes may be missed from now until the next list."""
        self._held = None

    def _publish(self) -> None:
        self._held = tuple(self._pools.values())


class PoolFeed:
    """Lists then watches every GPUPool into a :class:`PoolCache`, in a daemon thread from ``start`` to ``stop``."""

    def __init__(
        self,
        source: Source,
        cache: PoolCache,
        *,
        watch_timeout: int = WATCH_TIMEOUT_S,
        backoff_max: float = BACKOFF_MAX_S,
    ) -> None:
        self._stop = threading.Event()
        self.informer = Informer(
            "GPUPools",
            source,
            cache,
            watch_timeout=watch_timeout,
            backoff_max=backoff_max,
            stop=self._stop,
            on_error=lambda _reason: cache.distrust(),
            relist_after_error=True,
        )

    def start(self) -> threading.Thread:
        return self.informer.start()

    def stop(self) -> None:
        self._stop.set()


def _name(obj: RawObject) -> str | None:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) and name else None
