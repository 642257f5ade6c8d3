"""Learning policies refresh on a background thread, never inside a request.

A refresh of the fragmentation policy's mix solves a cutting-stock LP (up to seconds), which inside
``observe`` would stall the /bind that happened to be the due one. So every learning policy is
switched to deferred mode as it is created: ``observe`` only counts, and a
:class:`~tf_shell.periodic.Periodic` pass takes, solves and swaps in a refresh when one is due;
filter, prioritize and bind read the last finished mix. The same pass shows every
:class:`~vgpu.scheduling.policy.ClusterAware` policy the whole cluster when it is new and every
``see_every`` seconds after. Figures and why: vgpu/scheduling/README.md, section "The fragmentation
policy".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final

from tf_shell.periodic import Periodic
from vgpu.scheduling.fragmentation import FragmentationPolicy, learn
from vgpu.scheduling.model import NodeState
from vgpu.scheduling.policy import Policy

log = logging.getLogger(__name__)

INTERVAL: Final = 0.2  # seconds between checks for a due refresh: the mix is at most this late
SEE_EVERY: Final = 5.0  # seconds between showing cluster-aware policies every node (pods that left)


class Refresher:
    """Owns the learning policies' refreshes; ``track`` is the :class:`Policies` creation hook."""

    def __init__(
        self,
        interval: float = INTERVAL,
        on_refresh: Callable[[float], None] | None = None,
        *,
        cluster: Callable[[], Iterable[NodeState]] | None = None,
        see_every: float = SEE_EVERY,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``on_refresh`` gets the seconds each refresh took (for metrics and the latency benchmark);
        ``cluster`` gives every node as the cache holds it (None: cluster-aware policies see nothing)."""
        self._policies: list[FragmentationPolicy] = []
        self._lock = threading.Lock()
        self._on_refresh = on_refresh
        self._cluster, self._see_every, self._monotonic = cluster, see_every, monotonic
        self._seen_at: dict[int, float] = {}  # id(policy) -> when it was last shown the cluster
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
        self._show_cluster(policies)
        return done

    def _show_cluster(self, policies: list[FragmentationPolicy]) -> None:
        """Show the tracked policies every node, each when new or ``see_every`` after its last time."""
        if self._cluster is None:
            return
        now = self._monotonic()
        due = [p for p in policies if now - self._seen_at.get(id(p), -self._see_every) >= self._see_every]
        if not due:
            return
        nodes = tuple(self._cluster())
        for policy in due:
            policy.see_cluster(nodes)
            self._seen_at[id(policy)] = now
