"""HAMi-core's shared region, from the host: find ``limit[]`` and ``sm_limit[]`` and rewrite them in place.

HAMi-core (the ``libvgpu.so`` preloaded into hami-core containers) keeps a ``shared_region_t`` in the
file named by ``CUDA_DEVICE_MEMORY_SHARED_CACHE``, mapped ``MAP_SHARED`` by every CUDA process of the
container. A new ``limit[dev]`` is live (read on every allocation); a new ``sm_limit[dev]`` reaches
processes started after it. Only layout version 1.2 is accepted, and any file that is not exactly
what we expect is left untouched and reported. Values are written as single aligned 8-byte stores,
without HAMi-core's own lock. The layout, the HAMi-core source lines (commit 8f3a89c6) and why:
docs/live-limits.md, section "HAMi-core".
"""

from __future__ import annotations

import mmap
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

from device_plugin.enforcement.live_limits import SlotWrite, region_writes

MAGIC: Final = 19920718  # MULTIPROCESS_SHARED_REGION_MAGIC_FLAG
VERSION: Final = (1, 2)  # (MAJOR_VERSION, MINOR_VERSION)
MAX_DEVICES: Final = 16  # CUDA_DEVICE_MAX_COUNT
LIMIT_OFFSET: Final = 1600
SM_LIMIT_OFFSET: Final = LIMIT_OFFSET + 8 * MAX_DEVICES
REGION_SIZE: Final = 2008952  # sizeof(shared_region_t)
_HEADER: Final = SM_LIMIT_OFFSET + 8 * MAX_DEVICES  # what the plugin maps: through sm_limit[]
_OFFSETS: Final = {"limit": LIMIT_OFFSET, "sm_limit": SM_LIMIT_OFFSET}


class State(StrEnum):
    ABSENT = "absent"  # no file: the container made no CUDA call yet (or is not hami-core)
    UNINITIALISED = "uninitialised"  # file there, no magic yet
    READY = "ready"
    REFUSED = "refused"  # not a layout we know: left alone


@dataclass(frozen=True, slots=True)
class Region:
    state: State
    slots: tuple[tuple[int, int], ...] = ()  # (limit[i], sm_limit[i]) for the devices asked
    reason: str = ""


def _open(path: Path) -> int | Region:
    """A descriptor of the regular file at ``path``, never following a link nor opening anything else (the
    directory is the container's to write: a root tenant could plant a link or a device node there)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return Region(State.REFUSED, reason="not a regular file")
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return Region(State.ABSENT)
    except OSError as exc:
        return Region(State.REFUSED, reason=f"cannot open: {exc.strerror}")
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between the two looks
        os.close(fd)
        return Region(State.REFUSED, reason="not a regular file")
    return fd


def _header(flag: int, major: int, minor: int, size: int) -> Region | None:
    """None when the header is one we can write to; the region's state otherwise."""
    if flag != MAGIC:
        return Region(State.UNINITIALISED)
    if (major, minor) != VERSION:
        return Region(State.REFUSED, reason=f"layout version {major}.{minor}, not {VERSION[0]}.{VERSION[1]}")
    if size < REGION_SIZE:
        return Region(State.REFUSED, reason=f"{size} bytes, shorter than the {REGION_SIZE}-byte region")
    return None


@dataclass(frozen=True, slots=True)
class Synced:
    region: Region
    writes: tuple[SlotWrite, ...] = ()  # what was written


def sync(path: Path, want: Sequence[tuple[int, int]]) -> Synced:
    """Make ``(limit[i], sm_limit[i])`` of the container's devices ``want[i]``, writing only the slots
    that differ, when the header is one we know; otherwise leave the file as it is."""
    if not 0 < len(want) <= MAX_DEVICES:
        raise ValueError(f"HAMi-core holds 1 to {MAX_DEVICES} devices, not {len(want)}")
    opened = _open(path)
    if isinstance(opened, Region):
        return Synced(opened)
    try:
        head = os.pread(opened, 12, 0).ljust(12, b"\0")
        flag, major, minor = (int.from_bytes(head[i : i + 4], sys.byteorder) for i in (0, 4, 8))
        refused = _header(flag, major, minor, os.fstat(opened).st_size)
        if refused is not None:
            return Synced(refused)
        with (
            mmap.mmap(opened, _HEADER, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as mapped,
            memoryview(mapped) as view,
            view.cast("Q") as words,
        ):

            def slots() -> tuple[tuple[int, int], ...]:
                return tuple((words[LIMIT_OFFSET // 8 + i], words[SM_LIMIT_OFFSET // 8 + i]) for i in range(len(want)))

            writes = region_writes(want, slots())
            for w in writes:  # one aligned 8-byte store each
                words[(_OFFSETS[w.field] + 8 * w.index) // 8] = w.value
            return Synced(Region(State.READY, slots()), writes)
    finally:
        os.close(opened)
