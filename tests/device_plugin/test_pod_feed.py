"""The pod feed: this node's pods listed and watched into the pod cache by the shared list–watch loop, listing
again when the watch's version is gone (410), and ending quietly when the event loop closes under it."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from device_plugin.cluster.pod_cache import BACKOFF_MAX_S, LoopSink, PodCache, PodFeed
from tests.device_plugin.fakes import NODE, CountingKube, FakeKube, make_pod, uid_of
from tests.device_plugin.harness import run, until
from tf_shell.kube.api import WatchEvent


def test_a_410_during_the_watch_lists_again_and_the_cache_follows() -> None:
    first = make_pod("first")
    kube = CountingKube([first])
    kube.watch_window_s = 0.1  # watches end often: the next one is the one that meets the 410

    async def scenario() -> None:
        cache = PodCache()
        feed = PodFeed(kube, NODE, cache)
        thread = feed.start(asyncio.get_running_loop())
        try:
            await asyncio.wait_for(cache.synced.wait(), 5)
            assert kube.lists == 1 and cache.get(uid_of(first)) is not None
            kube.watch_held.set()  # what changes now reaches the cache only through the next list
            second = make_pod("second")
            kube.put(second)
            kube.delete(uid_of(first))
            kube.expire_watches = 1
            await until(lambda: kube.lists == 2)
            kube.watch_held.clear()
            await until(lambda: cache.get(uid_of(second)) is not None and cache.get(uid_of(first)) is None)
            assert feed.informer is not None and feed.informer.backoff.current == 0  # a relist, not a failure
            third = make_pod("third")
            kube.put(third)  # and the watch goes on from the new list's version
            await until(lambda: cache.get(uid_of(third)) is not None)
            assert kube.lists == 2
        finally:
            feed.stop()
        await asyncio.to_thread(thread.join, 2)
        assert not thread.is_alive() and thread.daemon

    run(scenario())


def test_the_feed_backs_off_at_most_30_seconds() -> None:
    feed, loop = PodFeed(FakeKube(), NODE, PodCache()), asyncio.new_event_loop()
    thread = feed.start(loop)
    feed.stop()
    thread.join(2)
    loop.close()
    assert feed.informer is not None and feed.informer.backoff.maximum == BACKOFF_MAX_S == 30.0


def test_a_closed_event_loop_stops_the_feed_quietly(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    loop.close()  # the daemon has shut down under the feed
    stop = threading.Event()
    sink = LoopSink(PodCache(), loop, stop)
    sink.apply(WatchEvent("ADDED", make_pod("p")))
    assert stop.is_set()

    kube = FakeKube([make_pod("p")])
    feed = PodFeed(kube, NODE, PodCache())
    with caplog.at_level(logging.DEBUG):
        thread = feed.start(loop)
        thread.join(2)
    assert not thread.is_alive()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
