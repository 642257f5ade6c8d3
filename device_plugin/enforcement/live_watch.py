"""Change notifications for the live-limits directories: which containers' files changed since the last look.

Each container's directory is watched with inotify (``inotify_simple``, a thin ctypes wrapper); an event
there wakes the live-limits loop, which checks that container at once instead of at its next periodic
pass. inotify sees every change made through the file system (a ``limits.json`` replaced, written,
removed; the region written with ``write(2)``, truncated, replaced, removed, its mode changed), but not
stores through a shared mapping: a tenant writing HAMi-core's region through ``mmap`` (as HAMi-core itself
does) raises no event, and only the periodic pass sees that (docs/live-limits.md, "Tampering"). Events
are read on the event loop (``add_reader``) and only recorded there; the containers they name are looked
up by the pass, in a worker thread. A watch that cannot be added (the user's watch limit reached) leaves
that container to the periodic pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import Final

import inotify_simple  # type: ignore[import-untyped]  # no type information shipped (a 100-line ctypes wrapper)

from device_plugin.enforcement.live_limits import ContainerKey

log = logging.getLogger(__name__)
_F = inotify_simple.flags
MASK: Final[int] = int(
    _F.MODIFY
    | _F.ATTRIB
    | _F.CLOSE_WRITE
    | _F.MOVED_FROM
    | _F.MOVED_TO
    | _F.CREATE
    | _F.DELETE
    | _F.DELETE_SELF
    | _F.MOVE_SELF
    | _F.ONLYDIR
    | _F.DONT_FOLLOW
)
_OVERFLOW: Final[int] = int(_F.Q_OVERFLOW)
_IGNORED: Final[int] = int(_F.IGNORED)  # the watch is gone (its directory removed)


class DirWatch:
    """inotify watches on container directories; :meth:`take` says which changed (every one after a queue
    overflow). ``add``/``forget`` are called from worker threads, events are read on the event loop."""

    def __init__(self) -> None:
        self._inotify = inotify_simple.INotify(nonblocking=True)
        self._lock = threading.Lock()
        self._keys: dict[int, ContainerKey] = {}  # watch descriptor -> container
        self._watched: dict[ContainerKey, int] = {}
        self._changed: set[int] = set()
        self._overflow = False
        self._woken: asyncio.Event | None = None
        self._warned = False

    def fileno(self) -> int:
        return int(self._inotify.fileno())

    def add(self, key: ContainerKey, directory: Path) -> None:
        """Watch ``directory`` for ``key`` (again: a no-op); a failure is logged once and left to the passes."""
        with self._lock:
            if key in self._watched:
                return
            try:
                wd = int(self._inotify.add_watch(os.fspath(directory), MASK))
            except OSError as exc:
                if not self._warned:
                    self._warned = True
                    log.warning("cannot watch %s (%s): its changes are seen by the periodic pass only", directory, exc)
                return
            self._keys[wd] = key
            self._watched[key] = wd

    def forget(self, uid: str) -> None:
        """Drop the watches of pod ``uid``'s containers (their directories are being removed)."""
        with self._lock:
            for key in [k for k in self._watched if k[0] == uid]:
                wd = self._watched.pop(key)
                self._keys.pop(wd, None)
                with contextlib.suppress(OSError):  # already gone with its directory
                    self._inotify.rm_watch(wd)

    def watched(self) -> frozenset[ContainerKey]:
        with self._lock:
            return frozenset(self._watched)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read events on ``loop`` from now on; :meth:`wait` returns once one arrived."""
        self._woken = asyncio.Event()
        loop.add_reader(self.fileno(), self._readable)

    def detach(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self.fileno())

    def _readable(self) -> None:
        try:
            events = list(self._inotify.read(timeout=0))
        except OSError as exc:  # not expected: read everything again at the next pass
            log.warning("reading live-limits change notifications failed: %s", exc)
            events = []
            self._overflow = True
        with self._lock:
            for event in events:
                wd, mask = int(event.wd), int(event.mask)
                if mask & _OVERFLOW:
                    self._overflow = True
                elif mask & _IGNORED:
                    key = self._keys.pop(wd, None)
                    if key is not None and self._watched.get(key) == wd:
                        del self._watched[key]
                else:
                    self._changed.add(wd)
        if self._woken is not None and (self._changed or self._overflow):
            self._woken.set()

    async def wait(self) -> None:
        """Return once an event arrived since the last :meth:`take`."""
        assert self._woken is not None, "attach() first"
        await self._woken.wait()

    def take(self) -> frozenset[ContainerKey] | None:
        """The containers changed since the last call; None after an overflow (any may have)."""
        with self._lock:
            overflow, self._overflow = self._overflow, False
            changed = frozenset(self._keys[wd] for wd in self._changed if wd in self._keys)
            self._changed.clear()
            if self._woken is not None:
                self._woken.clear()
        return None if overflow else changed

    def close(self) -> None:
        self._inotify.close()
