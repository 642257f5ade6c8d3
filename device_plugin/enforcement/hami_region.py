"""HAMi-core's shared region, from the host: find ``limit[]`` and ``sm_limit[]`` and rewrite them in place.

HAMi-core (the ``libvgpu.so`` preloaded into hami-core containers) keeps a ``shared_region_t`` in the
file named by ``CUDA_DEVICE_MEMORY_SHARED_CACHE``, mapped ``MAP_SHARED`` by every CUDA process of the
container. A new ``limit[dev]`` is live (read on every allocation); a new ``sm_limit[dev]`` reaches
processes started after it, and running ones too with the plugin image's HAMi-core (``hami_build``).
The file is read with ``pread`` and written, only where a value differs, as single aligned stores
through a shared mapping, without HAMi-core's own lock. The file is the container's to write too: once
HAMi-core has initialised it (layout version 1.2 only), any other state is tampering, restored in place
where it can be and reset to an empty file where it cannot (:func:`decide`). The layout, the HAMi-core
source lines (commit 8f3a89c6) and why: docs/live-limits.md, sections "HAMi-core" and "Tampering".
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import struct
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


class Kind(StrEnum):
    ABSENT = "absent"
    OTHER = "other"  # a link, a directory, a FIFO, a device...: never what HAMi-core or the plugin makes
    FILE = "file"


Identity = tuple[int, int]  # (st_dev, st_ino): which file the name holds


@dataclass(frozen=True, slots=True)
class Look:
    """What the region's name holds now, read without a mapping (a file truncated under a mapping raises
    SIGBUS on access; ``pread`` past the end just reads nothing)."""

    kind: Kind
    identity: Identity = (0, 0)
    size: int = 0
    header: tuple[int, int, int] = (0, 0, 0)  # initialized_flag, major_version, minor_version (0 past the end)
    slots: tuple[tuple[int, int], ...] = ()  # (limit[i], sm_limit[i]) of the devices asked, when full-size
    what: str = ""  # OTHER: what it is

    @property
    def full(self) -> bool:
        """As long as the struct: only HAMi-core's initialisation (or the plugin's restore) makes it so."""
        return self.size >= REGION_SIZE

    @property
    def ours(self) -> bool:
        return self.header == (MAGIC, *VERSION)


_FLAGS: Final = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS: Final = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def describe(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, when it is not a regular file ("a symbolic link"...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _check(want: Sequence[tuple[int, int]]) -> None:
    if not 0 < len(want) <= MAX_DEVICES:
        raise ValueError(f"HAMi-core holds 1 to {MAX_DEVICES} devices, not {len(want)}")


def _open(path: Path, flags: int) -> int | Look:
    """A descriptor of the regular file at ``path``, never following a link nor opening anything else (the
    directory is the container's to write: a root tenant could plant a link or a device node there); what
    the name holds instead, when it is not a regular file."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return Look(Kind.OTHER, what=describe(st.st_mode))
        fd = os.open(path, flags | _FLAGS)
    except FileNotFoundError:
        return Look(Kind.ABSENT)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link swapped in between the two looks
            return Look(Kind.OTHER, what="a symbolic link")
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # swapped between the two looks
        os.close(fd)
        return Look(Kind.OTHER, what=describe(st.st_mode))
    return fd


def look(path: Path, devices: int) -> Look:
    """What ``path`` holds: its kind, which file it is, its size, HAMi-core's header and the slots of the
    container's first ``devices`` devices (when the file is full-size). Writes nothing."""
    opened = _open(path, os.O_RDONLY)
    if isinstance(opened, Look):
        return opened
    try:
        st = os.fstat(opened)
        flag, major, minor = struct.unpack("=iII", os.pread(opened, 12, 0).ljust(12, b"\0"))
        slots: tuple[tuple[int, int], ...] = ()
        if st.st_size >= REGION_SIZE:
            raw = os.pread(opened, 16 * MAX_DEVICES, LIMIT_OFFSET).ljust(16 * MAX_DEVICES, b"\0")
            words = struct.unpack(f"={2 * MAX_DEVICES}Q", raw)
            slots = tuple((words[i], words[MAX_DEVICES + i]) for i in range(devices))
        return Look(Kind.FILE, (st.st_dev, st.st_ino), st.st_size, (flag, major, minor), slots)
    finally:
        os.close(opened)


def restore(
    path: Path, identity: Identity, want: Sequence[tuple[int, int]], *, header: bool
) -> tuple[SlotWrite, ...] | None:
    """Make ``(limit[i], sm_limit[i])`` ``want[i]`` in the file at ``path`` and, with ``header``, HAMi-core's
    version (1.2) and initialised flag (the magic; written last, as HAMi-core does), each value that differs
    as one aligned store through a shared mapping (HAMi-core's readers are plain loads). Nothing else in the
    file is touched. What was written; None when ``path`` no longer holds the full-size regular file
    ``identity`` (the next pass looks again)."""
    _check(want)
    opened = _open(path, os.O_RDWR)
    if isinstance(opened, Look):
        return None
    try:
        st = os.fstat(opened)
        if (st.st_dev, st.st_ino) != identity or st.st_size < REGION_SIZE:
            return None
        with (
            mmap.mmap(opened, _HEADER, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as mapped,
            memoryview(mapped) as view,
            view.cast("Q") as words,
            view.cast("I") as ints,
        ):
            have = tuple((words[LIMIT_OFFSET // 8 + i], words[SM_LIMIT_OFFSET // 8 + i]) for i in range(len(want)))
            writes = list(region_writes(want, have))
            for w in writes:  # one aligned 8-byte store each
                words[(_OFFSETS[w.field] + 8 * w.index) // 8] = w.value
            if header:
                for field, index, value in _HEADER_FIELDS:  # aligned 4-byte stores, the flag last
                    if ints[index] != value:
                        ints[index] = value
                        writes.append(SlotWrite(field, 0, value))
            return tuple(writes)
    finally:
        os.close(opened)


_HEADER_FIELDS: Final = (
    ("major_version", 1, VERSION[0]),
    ("minor_version", 2, VERSION[1]),
    ("initialized_flag", 0, MAGIC),
)


def reset(path: Path, identity: Identity | None, aside: Path) -> None:
    """Make ``path`` an empty regular file, mode 0666, as Allocate prepares it, for HAMi-core to initialise
    again at the container's next CUDA process. A regular file is truncated in place (only if it is still
    ``identity``: the same file, so every process of the container shares what HAMi-core makes of it next);
    a directory is moved to ``aside`` (out of the container's reach, removed with the pod's directory),
    anything else unlinked, and a new file created."""
    opened = _open(path, os.O_WRONLY)
    if isinstance(opened, int):
        try:
            st = os.fstat(opened)
            if (st.st_dev, st.st_ino) == identity:
                os.ftruncate(opened, 0)
                os.fchmod(opened, 0o666)
        finally:
            os.close(opened)
        return
    if opened.kind is Kind.OTHER:
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                os.rename(path, aside)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, 0o666)
    except FileExistsError:  # HAMi-core made one meanwhile (or a tenant did: the next pass looks at it)
        return
    try:
        os.fchmod(fd, 0o666)  # whatever the umask
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Synced:
    region: Region
    writes: tuple[SlotWrite, ...] = ()  # what was written


def sync(path: Path, want: Sequence[tuple[int, int]]) -> Synced:
    """Make ``(limit[i], sm_limit[i])`` of the container's devices ``want[i]``, writing only the slots
    that differ, when the header is one we know; otherwise leave the file as it is. Stateless: the plugin's
    pass decides with what it remembers (:func:`decide`); this is the one-shot form (scripts/gpu-check)."""
    _check(want)
    found = look(path, len(want))
    if found.kind is Kind.ABSENT:
        return Synced(Region(State.ABSENT))
    if found.kind is Kind.OTHER:
        return Synced(Region(State.REFUSED, reason=f"not a regular file: {found.what}"))
    flag, major, minor = found.header
    if flag != MAGIC:
        return Synced(Region(State.UNINITIALISED))
    if (major, minor) != VERSION:
        return Synced(Region(State.REFUSED, reason=f"layout version {major}.{minor}, not {VERSION[0]}.{VERSION[1]}"))
    if not found.full:
        return Synced(Region(State.REFUSED, reason=f"{found.size} bytes, shorter than the {REGION_SIZE}-byte region"))
    writes = restore(path, found.identity, want, header=False)
    if writes is None:
        return Synced(Region(State.REFUSED, reason="replaced while being written"))
    return Synced(Region(State.READY, tuple((limit, sm) for limit, sm in want)), writes)


# --- what the plugin's pass does with a container's region ----------------------------------------

INIT_GRACE_S: Final = 1.0  # HAMi-core stores the magic microseconds after it makes the file full-size


@dataclass(frozen=True, slots=True)
class Seen:
    """What the plugin remembers of a container's region between passes."""

    identity: Identity
    initialised: bool  # seen full-size with HAMi-core's header (or restored so): any other state is tampering
    since: float = 0.0  # not initialised: when it was first seen full-size without the header (monotonic)
    slots: tuple[tuple[int, int], ...] = ()  # initialised: the slots as the plugin last left them


class Action(StrEnum):
    NONE = "none"
    WRITE = "write"  # the slots that differ
    RESTORE = "restore"  # the header and the slots
    RESET = "reset"  # cannot be restored: an empty regular file again (:func:`reset`)


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    seen: Seen | None  # what to remember after the action
    kind: str = ""  # tampering found: a short code (slots, flag, version, truncated, removed, replaced, not-regular)
    detail: str = ""


def decide(
    found: Look, seen: Seen | None, want: Sequence[tuple[int, int]], *, now: float, grace_s: float = INIT_GRACE_S
) -> Verdict:
    """What to do with a container's region, from what its name holds now and what the plugin saw before.

    Before HAMi-core initialises it (an empty or short file, made at Allocate), nothing: the container's
    first CUDA call fills it. Once it has been seen full-size with HAMi-core's header, any state but that
    header with the plugin's slots is tampering: a changed header (the flag cleared, another version) or
    changed slots are restored in place; a file truncated, removed, replaced by another file or by anything
    but a regular file cannot be (what the container's processes map is gone or out of reach), and is reset
    to an empty regular file. A full-size file without the header that was never seen initialised (a plugin
    restart, or a tenant that grew the file before any CUDA call) is HAMi-core initialising it for at most
    ``grace_s``, then tampering too. The rules and why: docs/live-limits.md, "Tampering"."""
    want = tuple((limit, sm) for limit, sm in want)
    if found.kind is Kind.OTHER:  # HAMi-core never makes one, and the plugin cannot write through it
        return Verdict(Action.RESET, None, "not-regular", f"was replaced by {found.what}")
    was = seen is not None and seen.initialised
    if found.kind is Kind.ABSENT:
        if was:
            return Verdict(Action.RESET, None, "removed", "was removed (processes that mapped it keep it)")
        return Verdict(Action.NONE, None)
    prior = seen if seen is not None and seen.identity == found.identity else None
    if was and prior is None:
        return Verdict(
            Action.RESET, None, "replaced", "was replaced by another file (processes that mapped the old one keep it)"
        )
    if not found.full:
        if was:
            return Verdict(
                Action.RESET,
                None,
                "truncated",
                f"was truncated to {found.size} bytes, shorter than the {REGION_SIZE}-byte region (processes "
                "still mapping it fail at their next access past its end)",
            )
        return Verdict(Action.NONE, None)  # not initialised yet
    initialised = Seen(found.identity, True, slots=want)
    if found.ours:
        if found.slots == want:
            return Verdict(Action.NONE, initialised)
        if was and prior is not None and found.slots != prior.slots:  # not what the plugin left: someone wrote it
            return Verdict(
                Action.WRITE, initialised, "slots", f"held (limit, sm_limit) {found.slots}, not the plugin's {want}"
            )
        return Verdict(Action.WRITE, initialised)  # new limits, or HAMi-core's from an older environment
    flag, major, minor = found.header
    kind, detail = (
        ("flag", f"had its initialised flag at {flag}, not {MAGIC}")
        if flag != MAGIC
        else ("version", f"had layout version {major}.{minor}, not {VERSION[0]}.{VERSION[1]}")
    )
    if found.slots != want:
        detail += f", and (limit, sm_limit) {found.slots}"
    if was:
        return Verdict(Action.RESTORE, initialised, kind, detail)
    since = prior.since if prior is not None else now
    if now - since >= grace_s:
        return Verdict(Action.RESTORE, initialised, kind, f"{detail}, full-size for {now - since:.1f}s")
    return Verdict(Action.NONE, Seen(found.identity, False, since))
