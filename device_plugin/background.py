"""Work started off the caller's path on the plugin's event loop, kept until it ends, and awaitable.

Receipts, confirmations of Allocate answers and node events must not delay the kubelet's calls, so
they run as tasks. The event loop keeps only weak references to tasks, so each is held here until
done (a dropped task may be collected mid-flight), and :meth:`Background.drain` waits for those still
running (tests, shutdown).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    """Tasks spawned on the running loop and held until they end."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the tasks running now (their exceptions are theirs to log)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
