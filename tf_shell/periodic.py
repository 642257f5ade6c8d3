"""A daemon thread that runs one pass every ``interval`` seconds until stopped.

The extender's background work — writing workload status, expiring reservations — runs this way,
off the request path, beside the informer and event threads. A pass that raises is logged and
counted, and the next one runs as usual: one bug must not stop the work for good.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    """Calls ``work`` every ``interval`` seconds in a thread named ``name``, between start and stop."""

    def __init__(
        self,
        name: str,
        interval: float,
        work: Callable[[], object],
        on_error: Callable[[], None] | None = None,
        *,
        immediately: bool = False,
    ) -> None:
        """``immediately``: the first pass runs at start, not one interval later."""
        self.name = name
        self.immediately = immediately
        self.interval = interval
        self.work = work
        self.on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        first = 0.0 if self.immediately else self.interval
        if self._stop.wait(first):
            return
        while True:
            try:
                self.work()
            except Exception:
                log.exception("%s: a pass failed", self.name)
                if self.on_error is not None:
                    self.on_error()
            if self._stop.wait(self.interval):
                return
