"""Learning policies refresh on a background thread, never inside a request.

The fragmentation policy re-learns its pod mix when the number of committed pods doubles (then
every 4,096), and the cutting-stock LP in that refresh takes 0.2–1.5 s for 32–64 pod sizes. Run
inside ``observe`` it would stall the /bind that happened to be the due one. Here every learning
policy is switched to deferred mode as it is created: ``observe`` (on the bind path) only counts,
and a :class:`~scheduler_extender.periodic.Periodic` pass takes a copy of the counts when a refresh
is due, solves it and swaps the result in. Filter, prioritize and bind always read the last
finished mix; one refresh runs at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from scheduler_extender.core.fragmentation import FragmentationPolicy, learn
from scheduler_extender.core.policy import Policy
from scheduler_extender.periodic import Periodic

log = logging.getLogger(__name__)

INTERVAL: Final = 0.2  # seconds between checks for a due refresh: the mix is at most this late


class Refresher:
    """Owns the learning policies' refreshes; ``track`` is the :class:`Policies` creation hook."""

    def __init__(self, interval: float = INTERVAL, on_refresh: Callable[[float], None] | None = None) -> None:
        """``on_refresh`` gets the seconds each refresh took (for metrics and the latency benchmark)."""
        self._policies: list[FragmentationPolicy] = []
        self._lock = threading.Lock()
        self._on_refresh = on_refresh
        self.worker = Periodic("policy-refresh", interval, self.run_once, immediately=True)

    def track(self, policy: Policy) -> None:
        if isinstance(policy, FragmentationPolicy):
            policy.deferred = True
            with self._lock:
                self._policies.append(policy)

    def run_once(self) -> int:
        """Refresh every tracked policy that is due; returns how many were refreshed."""
        with self._lock:
            policies = list(self._policies)
        done = 0
        for policy in policies:
            observed = policy.take()
            if observed is None:
                continue
            start = time.perf_counter()
            policy.adopt(learn(observed))
            seconds = time.perf_counter() - start
            log.debug("%s: mix revision %d learned in %.3f s", policy.name, observed.revision, seconds)
            if self._on_refresh is not None:
                self._on_refresh(seconds)
            done += 1
        return done
