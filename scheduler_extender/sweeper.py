"""Releases filter-time reservations when their TTL is up, off the request path.

filter and prioritize reserve room on the node a pod will most likely be bound to, for
``reservation_ttl`` seconds; a bind normally claims it long before. One nobody claims (the scheduler
chose another node, or the pod was deleted) used to be released only when the next filter or
prioritize call happened to look, so on a quiet cluster it held its GPUs, and the
``tf_extender_reservations`` gauge, for as long as no GPU pod was scheduled (150 s past a 30 s TTL
was seen). This worker thread, like the informers, the event poster and the workload-status writer,
releases what is due every ``SWEEP_INTERVAL`` seconds, so no reservation outlives its TTL by more.
"""

from __future__ import annotations

import logging
import threading
from typing import Final

from scheduler_extender.cache import ClusterCache

log = logging.getLogger(__name__)

SWEEP_INTERVAL: Final = 0.5  # seconds; the most a reservation outlives its TTL (plus a lock wait)


class ReservationSweeper:
    """Expires the cache's tentative reservations in a thread of its own."""

    def __init__(self, cache: ClusterCache, *, interval: float = SWEEP_INTERVAL) -> None:
        self.cache = cache
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="reservation-sweeper", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                released = self.cache.expire()
            except Exception:  # a bug here must not stop expiry for good: log it, sweep again
                log.exception("reservation sweep failed")
                continue
            if released:
                log.debug("released %d expired reservation(s)", released)
