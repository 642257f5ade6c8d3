"""Fresh reads shared by concurrent callers: each gets the result of a read that began after it asked.

Allocate needs the node's pods as they are after its request arrived (see
:mod:`device_plugin.kubelet.allocator`), and a burst of Allocates (a node reboot re-allocates every pod at
once) must not queue one LIST each. A read already in flight does not qualify for a newcomer: it
began before the newcomer asked. So one read runs at a time, and whoever arrives while it runs waits
for the next, which begins when the running one ends and is shared by everyone who arrived
meanwhile. A caller waits for at most two reads, and any number of callers arriving during one
read share one.

Pure asyncio, generic over the result; all on one event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class FreshRead(Generic[T]):
    """Calls of ``read`` shared between concurrent :meth:`get` callers, never one that began before a caller.

    A read's exception is raised to every caller sharing it. A caller cancelled while waiting leaves
    the read, and the others sharing it, alone; a read cancelled (the loop closing) cancels every
    caller waiting, and the next :meth:`get` starts afresh."""

    def __init__(self, read: Callable[[], Awaitable[T]]) -> None:
        self._read = read
        self._next: asyncio.Future[T] | None = None  # the next read's result, for callers since the last began
        self._runner: asyncio.Task[None] | None = None

    async def get(self) -> T:
        """The result of a read begun after this call (raises what that read raised)."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        share = self._next
        if self._runner is None:
            self._runner = asyncio.create_task(self._run())
        return await asyncio.shield(share)

    async def _run(self) -> None:
        """Read for the callers waiting, again while more arrived during the read, then stop."""
        share: asyncio.Future[T] | None = None
        try:
            while (share := self._next) is not None:
                self._next = None  # whoever arrives from now on waits for the next read
                try:
                    result = await self._read()
                except Exception as exc:
                    share.set_exception(exc)
                else:
                    share.set_result(result)
        finally:  # cancelled (the loop is closing): so are the callers left waiting
            self._runner = None
            for left in (share, self._next):
                if left is not None and not left.done():
                    left.cancel()
            self._next = None
