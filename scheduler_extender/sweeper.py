"""Releases filter-time reservations when their TTL is up, off the request path.

filter and prioritize reserve room on the node a pod will most likely be bound to, for
``reservation_ttl`` seconds; a bind normally claims it long before. One nobody claims (the scheduler
chose another node, or the pod was deleted) used to be released only when the next filter or
prioritize call happened to look, so on a quiet cluster it held its GPUs, and the
``tf_extender_reservations`` gauge, for as long as no GPU pod was scheduled (150 s past a 30 s TTL
was seen). A worker thread now releases what is due every ``SWEEP_INTERVAL`` seconds, so no
reservation outlives its TTL by more (plus a wait for the cache's lock).
"""

from __future__ import annotations

from typing import Final

from scheduler_extender.cache import ClusterCache
from tf_shell.periodic import Periodic

SWEEP_INTERVAL: Final = 0.5  # seconds


def reservation_sweeper(cache: ClusterCache, interval: float = SWEEP_INTERVAL) -> Periodic:
    """The (not yet started) worker that expires ``cache``'s tentative reservations."""
    return Periodic("reservation-sweeper", interval, cache.expire)
