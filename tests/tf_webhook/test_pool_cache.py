"""The webhook's GPUPool cache under the shared list–watch loop, against a scripted source: trusted from a list,
kept current by watch events, distrusted on an error until the next list (which the error forces)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tf_shell.kube.api import GatewayError, GoneError, Listing, RawObject, WatchEvent
from tf_webhook.decision import _pools
from tf_webhook.pool_cache import PoolCache, PoolFeed


def pool(name: str, version: str = "1", **spec: Any) -> RawObject:
    return {"metadata": {"name": name, "resourceVersion": version}, "spec": spec}


class ScriptedSource:
    """Lists ``pools``; each watch plays the next script: events, then (optionally) an exception."""

    def __init__(self, pools: list[RawObject]) -> None:
        self.pools = pools
        self.lists = 0
        self.watches: list[str] = []  # the resourceVersion each watch started from
        self.scripts: list[tuple[list[WatchEvent], Exception | None]] = []

    def list(self) -> Listing:
        self.lists += 1
        return Listing(items=list(self.pools), resource_version=f"rv{self.lists}")

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        self.watches.append(resource_version)
        events, failure = self.scripts.pop(0) if self.scripts else ([], None)
        yield from events
        if failure is not None:
            raise failure


def feed(source: ScriptedSource, cache: PoolCache) -> PoolFeed:
    return PoolFeed(source, cache, watch_timeout=1, backoff_max=0.001)


def names(cache: PoolCache) -> list[str] | None:
    held = cache.held()
    return None if held is None else sorted(p["metadata"]["name"] for p in held)


def test_nothing_is_trusted_before_the_first_list() -> None:
    cache = PoolCache()
    assert cache.held() is None
    source = ScriptedSource([pool("a"), pool("b")])
    feed(source, cache).informer.run(iterations=1)
    assert names(cache) == ["a", "b"]


def test_added_modified_and_deleted_pools_are_reflected() -> None:
    cache, source = PoolCache(), ScriptedSource([pool("a"), pool("b")])
    changed = pool("a", "5", default=True)
    source.scripts.append(
        (
            [
                WatchEvent("ADDED", pool("c", "3")),
                WatchEvent("DELETED", pool("b", "4")),
                WatchEvent("MODIFIED", changed),
                WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "6"}}),
            ],
            None,
        )
    )
    informer = feed(source, cache).informer
    informer.run(iterations=1)
    assert names(cache) == ["a", "c"]
    assert changed in (cache.held() or ())
    informer.run(iterations=1)
    assert source.watches == ["rv1", "6"] and source.lists == 1  # the watch resumed, nothing listed again


def test_a_watch_error_distrusts_the_cache_until_the_next_list() -> None:
    cache, source = PoolCache(), ScriptedSource([pool("a")])
    source.scripts.append(([WatchEvent("ADDED", pool("b", "2"))], GatewayError("watch gpupools: HTTP 500", 500)))
    informer = feed(source, cache).informer
    informer.run(iterations=1)  # listed, saw b, then the watch failed: events may be missed from now
    assert cache.held() is None
    source.pools = [pool("a"), pool("b"), pool("new")]
    informer.run(iterations=1)  # a list, not a resumed watch, brings the trust back
    assert source.lists == 2 and source.watches == ["rv1", "rv2"]
    assert names(cache) == ["a", "b", "new"]


def test_a_failed_list_leaves_the_cache_untrusted() -> None:
    class Down(ScriptedSource):
        def list(self) -> Listing:
            raise GatewayError("list gpupools: HTTP 403 Forbidden", 403)

    cache = PoolCache()
    cache.replace([pool("stale")])
    feed(Down([]), cache).informer.run(iterations=1)
    assert cache.held() is None


def test_an_expired_watch_relists_and_drops_what_is_gone() -> None:
    cache, source = PoolCache(), ScriptedSource([pool("a"), pool("b")])
    source.scripts.append(([], GoneError()))
    informer = feed(source, cache).informer
    informer.run(iterations=1)
    source.pools = [pool("a")]
    informer.run(iterations=1)
    assert source.lists == 2 and names(cache) == ["a"]


def test_stop_ends_the_thread() -> None:
    cache, source = PoolCache(), ScriptedSource([pool("a")])
    running = feed(source, cache)
    thread = running.start()
    assert running.informer.synced.wait(5)
    running.stop()
    thread.join(5)
    assert not thread.is_alive() and names(cache) == ["a"]


def test_admissions_reuse_the_parse_of_the_published_pools_until_a_pool_changes() -> None:
    """The parse is kept for the tuple the cache publishes; the tuple published after a change is parsed anew."""
    cache = PoolCache()
    cache.replace([pool("a", default=True)])
    held = cache.held()
    assert held is not None
    first = _pools(held)
    assert _pools(cache.held() or ()) is first and first.defaults == ("a",)
    cache.apply(WatchEvent("MODIFIED", pool("a", "2", default=False)))
    changed = _pools(cache.held() or ())
    assert changed is not first and changed.defaults == ()
    assert _pools([pool("a", default=True)]).defaults == ("a",)  # a live LIST, parsed as it is
