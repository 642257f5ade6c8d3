"""The extender's two informers: nodes and pods, each listed and watched through the gateway into the cache.

The loop is the shared one (:mod:`tf_shell.kube.list_watch`); this module only binds a kind to it,
on the gateway's side (what is listed and watched) and on the cache's (where it lands).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from scheduler_extender.cache import ClusterCache
from scheduler_extender.gateway import Kind, KubeGateway
from tf_shell.kube.api import Listing, RawObject, WatchEvent
from tf_shell.kube.list_watch import Informer


@dataclass(frozen=True, slots=True)
class KindSource:
    gateway: KubeGateway
    kind: Kind

    def list(self) -> Listing:
        return self.gateway.list(self.kind)

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        return self.gateway.watch(self.kind, resource_version, timeout_seconds)


@dataclass(frozen=True, slots=True)
class KindSink:
    cache: ClusterCache
    kind: Kind

    def listing(self) -> None:
        self.cache.listing(self.kind)

    def replace(self, items: list[RawObject]) -> None:
        self.cache.replace(self.kind, items)

    def apply(self, event: WatchEvent) -> None:
        self.cache.apply(self.kind, event)


def informer(
    gateway: KubeGateway,
    kind: Kind,
    cache: ClusterCache,
    *,
    watch_timeout: int,
    backoff_max: float,
    stop: threading.Event,
    on_error: Callable[[Kind, str], None] | None = None,
) -> Informer:
    """The informer keeping ``cache`` in step with every object of ``kind``."""
    report = None if on_error is None else (lambda reason: on_error(kind, reason))
    return Informer(
        str(kind),
        KindSource(gateway, kind),
        KindSink(cache, kind),
        watch_timeout=watch_timeout,
        backoff_max=backoff_max,
        stop=stop,
        on_error=report,
    )
