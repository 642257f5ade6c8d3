"""Live limits on disk: each container's directory, its ``limits.json``, HAMi-core's region, and cleanup.

At Allocate the plugin makes ``<root>/<pod UID>/<container>/`` and writes ``limits.json`` before the
container starts (:meth:`LiveLimits.prepare`). Then :meth:`LiveLimits.run` makes every container's files
match its pod's current allocation, on every pod change, on every change notification from the directory
(:mod:`device_plugin.enforcement.live_watch`) and every few seconds anyway. The files are the container's to
write too, so every look compares them with what the plugin keeps, not with what it remembers writing;
tampering is restored (or the region reset), counted and reported. Decisions are
:mod:`device_plugin.enforcement.live_limits`' and :func:`~device_plugin.enforcement.hami_region.decide`'s.
Modes, ownership and timings: docs/live-limits.md, sections "The directory" and "Tampering".
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from device_plugin.cluster.pod_cache import PodCache
from device_plugin.enforcement import hami_region
from device_plugin.enforcement.envs import LiveMount, Target
from device_plugin.enforcement.live_limits import (
    ContainerKey,
    GpuLimit,
    Tamper,
    Wanted,
    document,
    leftover,
    limits_of,
    recorded,
    region_values,
    resident,
    wanted,
)
from device_plugin.enforcement.live_watch import DirWatch
from device_plugin.metrics import PluginMetrics
from vgpu import metric_names as m
from vgpu.contract.allocation import PodAllocation
from vgpu.names import HAMI_REGION_FILE, LIVE_LIMITS_FILE, EnforcementBackend
from vgpu.timefmt import rfc3339

log = logging.getLogger(__name__)
_DOCUMENT_MAX: Final = 1 << 16  # a limits.json larger than this is not ours
_DOCUMENT_MODE: Final = 0o644
_SETTLE_S: Final = 0.02  # after a change notification, let the burst it belongs to (write, rename...) land
_FLAGS: Final = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _now() -> str:
    return rfc3339(time.time())


@dataclass(frozen=True, slots=True)
class _Kept:
    """The document the plugin keeps in a container's directory: its limits, generation and exact text."""

    gpus: tuple[GpuLimit, ...]
    generation: int
    text: str


@dataclass(frozen=True, slots=True)
class _Found:
    """What a container's ``limits.json`` name holds: ``what`` is "" for a regular file, else what it is."""

    what: str
    text: str | None = None  # a regular file's content; None when larger than any document of ours
    mode: int = 0
    uid: int = 0
    is_dir: bool = False


def _read(path: Path) -> _Found:
    """The file at ``path`` (at most ``_DOCUMENT_MAX`` + 1 bytes of it), never following a link nor reading
    anything but a regular file."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return _Found(hami_region.describe(st.st_mode), is_dir=stat.S_ISDIR(st.st_mode))
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except FileNotFoundError:
        return _Found("absent")
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link swapped in between the two looks
            return _Found("a symbolic link")
        raise
    with os.fdopen(fd, "rb") as source:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return _Found(hami_region.describe(st.st_mode), is_dir=stat.S_ISDIR(st.st_mode))
        raw = source.read(_DOCUMENT_MAX + 1)
    text = raw.decode("utf-8", "replace") if len(raw) <= _DOCUMENT_MAX else None
    return _Found("", text, stat.S_IMODE(st.st_mode), st.st_uid)


def _differs(found: _Found, text: str, gpus: tuple[GpuLimit, ...]) -> tuple[str, str] | None:
    """How ``found`` differs from the document ``text`` (recording ``gpus``): (kind, detail), None if it is it."""
    if found.what == "absent":
        return "removed", "was removed"
    if found.what:
        return "not-regular", f"was replaced by {found.what}"
    if found.text is None:
        return "garbage", f"was replaced by a file larger than {_DOCUMENT_MAX} bytes"
    if found.text != text:
        was = recorded(found.text)
        if was is None:
            return "garbage", "was replaced by something that is not the plugin's document"
        if was.gpus != gpus:
            return "limits", f"recorded other limits ({was.gpus}) than the plugin's ({gpus})"
        return "edited", "was edited"
    if found.mode != _DOCUMENT_MODE or found.uid != os.geteuid():
        return "mode", f"had mode {found.mode:o} and owner {found.uid}"
    return None


class LiveLimits:
    """The live-limits directories under ``root`` (a host path, the same inside the plugin's container).

    ``report`` is called, on the event loop, with the first tampering of each kind found in a container's
    files (every one is counted in ``tf_device_plugin_errors_total{where="live_limits_tamper"}`` and logged).
    ``init_grace_s``: how long a full-size region without HAMi-core's header that was never seen initialised
    is taken for HAMi-core initialising it (:func:`~device_plugin.enforcement.hami_region.decide`)."""

    def __init__(
        self,
        root: Path,
        backend: EnforcementBackend,
        metrics: PluginMetrics,
        *,
        grace_s: float = 30.0,
        clock: Callable[[], str] = _now,
        report: Callable[[Tamper], None] | None = None,
        init_grace_s: float = hami_region.INIT_GRACE_S,
        watch: bool = True,
    ) -> None:
        self.root, self._backend, self._metrics = root, backend, metrics
        self._grace_s, self._clock, self._report = grace_s, clock, report
        self._init_grace_s, self._want_watch = init_grace_s, watch
        self._lock = threading.Lock()  # prepare() (Allocates) and sync() (the loop) run in worker threads
        self._kept: dict[ContainerKey, _Kept] = {}  # the document each container's limits.json must be
        self._regions: dict[ContainerKey, hami_region.Seen] = {}  # what each region was last seen as
        self._reported: set[tuple[ContainerKey, str, str]] = set()  # (container, file, kind) reported once
        self._watch: DirWatch | None = None  # while run() runs

    def directory(self, key: ContainerKey) -> Path:
        uid, container = key
        if not all(part and "/" not in part and part not in (".", "..") for part in key):
            raise ValueError(f"not a pod UID and container name: {uid!r}, {container!r}")
        return self.root / uid / container

    def _aside(self, key: ContainerKey, name: str) -> Path:
        """Where a directory planted at one of the container's file names is moved: the pod's directory, out
        of the container's reach (only its own directory is mounted), removed with it."""
        uid, container = key
        return self.root / uid / f".{container}.{name}.{secrets.token_hex(6)}"

    async def mount(self, target: Target, uid: str, alloc: PodAllocation) -> LiveMount | None:
        """Prepare the container's directory (in a worker thread); None, logged and counted, if the disk
        refuses: the container then starts with its limits fixed, rather than not at all."""
        try:
            return await asyncio.to_thread(self.prepare, target, uid, alloc)
        except OSError as exc:
            self._metrics.errors.labels("live_limits").inc()
            log.error(
                "live limits for %s/%s container %s not prepared: %s",
                target.namespace,
                target.pod,
                target.container,
                exc,
            )
            return None

    def prepare(self, target: Target, uid: str, alloc: PodAllocation) -> LiveMount:
        key = (uid, target.container)
        path = self.directory(key)
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            for d in (path.parent, path):
                d.mkdir(mode=0o755, exist_ok=True)
                os.chmod(d, 0o755)  # whatever the umask
            self._keep(key, Wanted(target.namespace, target.pod, limits_of(alloc, target.container)))
            if self._backend is EnforcementBackend.HAMI_CORE:
                region = path / HAMI_REGION_FILE
                flags = os.O_WRONLY | os.O_CREAT | _FLAGS
                fd = os.open(region, flags, 0o666)
                try:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):  # planted by a root tenant of an earlier start
                        raise OSError(f"{region} is not a regular file")
                    os.fchmod(fd, 0o666)
                finally:
                    os.close(fd)
            if self._watch is not None:
                self._watch.add(key, path)
        return LiveMount(str(path))

    def _keep(self, key: ContainerKey, want: Wanted) -> tuple[bool, Tamper | None]:
        """Make the container's limits.json exactly the document the plugin keeps for ``want``, comparing with
        the file itself: (whether the limits changed, the tampering found)."""
        path = self.directory(key) / LIVE_LIMITS_FILE
        found = _read(path)
        kept = self._kept.get(key)
        if kept is not None and kept.gpus == want.gpus:
            wrong = _differs(found, kept.text, kept.gpus)
            if wrong is None:
                return False, None
            self._replace(key, kept.text, found)
            return False, self._tampered(key, want, LIVE_LIMITS_FILE, *wrong, restored=True)
        if kept is None:  # the first look since the plugin started: the file says which generation it is at
            was = recorded(found.text) if not found.what and found.text is not None else None
            if was is not None and was.gpus == want.gpus:
                text = self._document(key, want, was.generation, was.updated_at)
                self._kept[key] = _Kept(want.gpus, was.generation, text)
                if _differs(found, text, want.gpus) is not None:
                    self._replace(key, text, found)
                return False, None
            generation = (was.generation if was is not None else 0) + 1
        else:
            generation = kept.generation + 1
        text = self._document(key, want, generation, self._clock())
        self._replace(key, text, found)
        self._kept[key] = _Kept(want.gpus, generation, text)
        return True, None

    def _document(self, key: ContainerKey, want: Wanted, generation: int, updated_at: str) -> str:
        return document(key, want, backend=self._backend.value, generation=generation, updated_at=updated_at)

    def _replace(self, key: ContainerKey, text: str, found: _Found) -> None:
        """Write ``text`` to a temporary file and rename it over the container's limits.json (a reader sees the
        old or the new document, never half of one); whatever the name held is replaced, a directory moved
        aside first."""
        directory = self.directory(key)
        if found.is_dir:
            os.rename(directory / LIVE_LIMITS_FILE, self._aside(key, LIVE_LIMITS_FILE))
        fd, staged = tempfile.mkstemp(dir=directory, prefix=f".{LIVE_LIMITS_FILE}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            os.chmod(staged, _DOCUMENT_MODE)
            os.replace(staged, directory / LIVE_LIMITS_FILE)
        except BaseException:
            Path(staged).unlink(missing_ok=True)
            raise
        self._metrics.live_limit_writes.labels("file").inc()

    def _tampered(
        self, key: ContainerKey, want: Wanted, target: str, kind: str, detail: str, *, restored: bool
    ) -> Tamper | None:
        """Count and log tampering; the Tamper to report the first time this container shows this kind."""
        found = Tamper(want.namespace, want.pod, key[0], key[1], target, kind, detail, restored)
        self._metrics.errors.labels(m.WHERE_TAMPER).inc()
        first = (key, target, kind) not in self._reported
        log.log(logging.WARNING if first else logging.DEBUG, "live limits tampered with: %s", found.message())
        if not first:
            return None
        self._reported.add((key, target, kind))
        return found

    def sync(
        self,
        wants: Mapping[ContainerKey, Wanted],
        resident_uids: frozenset[str],
        only: frozenset[ContainerKey] | None = None,
    ) -> list[Tamper]:
        """One pass: every prepared container's files (``only`` those, when given) to its wanted limits, and
        (a full pass) leftover pod directories gone. The tampering found, to report."""
        found: list[Tamper] = []
        with self._lock:
            for key, want in wants.items():
                if only is not None and key not in only:
                    continue
                directory = self.directory(key)
                if not directory.is_dir():  # not prepared here (live limits were off, or another node)
                    continue
                if self._watch is not None:
                    self._watch.add(key, directory)
                try:
                    changed, tamper = self._keep(key, want)
                    if changed:
                        log.info(
                            "live limits of %s/%s container %s now %s", want.namespace, want.pod, key[1], want.gpus
                        )
                    if self._backend is EnforcementBackend.HAMI_CORE and want.gpus:
                        found += [t for t in (tamper, self._sync_region(key, want)) if t is not None]
                    elif tamper is not None:
                        found.append(tamper)
                except OSError as exc:
                    self._metrics.errors.labels("live_limits").inc()
                    log.warning("live limits of %s/%s container %s: %s", want.namespace, want.pod, key[1], exc)
            if only is None:
                self._sweep(resident_uids)
        return found

    def _sync_region(self, key: ContainerKey, want: Wanted) -> Tamper | None:
        path = self.directory(key) / HAMI_REGION_FILE
        values = region_values(want.gpus)
        found = hami_region.look(path, len(values))
        verdict = hami_region.decide(
            found, self._regions.get(key), values, now=time.monotonic(), grace_s=self._init_grace_s
        )
        action = verdict.action
        if action in (hami_region.Action.WRITE, hami_region.Action.RESTORE):
            writes = hami_region.restore(path, found.identity, values, header=action is hami_region.Action.RESTORE)
            if writes is None:  # replaced under us: the next look decides
                return None
            if writes:
                self._metrics.live_limit_writes.labels("hami_region").inc(len(writes))
                log.info("HAMi-core region of %s/%s container %s: wrote %s", want.namespace, want.pod, key[1], writes)
        elif action is hami_region.Action.RESET:
            identity = found.identity if found.kind is hami_region.Kind.FILE else None
            hami_region.reset(path, identity, self._aside(key, HAMI_REGION_FILE))
        if verdict.seen is None:
            self._regions.pop(key, None)
        else:
            self._regions[key] = verdict.seen
        if not verdict.kind:
            return None
        restored = action is not hami_region.Action.RESET
        return self._tampered(key, want, HAMI_REGION_FILE, verdict.kind, verdict.detail, restored=restored)

    def _sweep(self, resident_uids: frozenset[str]) -> None:
        try:
            entries = {e.name: e.stat(follow_symlinks=False).st_mtime for e in os.scandir(self.root)}
        except FileNotFoundError:
            return
        for uid in leftover(entries, resident_uids, now=time.time(), grace_s=self._grace_s):
            if self._watch is not None:
                self._watch.forget(uid)
            shutil.rmtree(self.root / uid, ignore_errors=True)
            self._kept = {k: v for k, v in self._kept.items() if k[0] != uid}
            self._regions = {k: v for k, v in self._regions.items() if k[0] != uid}
            self._reported = {r for r in self._reported if r[0][0] != uid}
            log.info("live limits of pod %s removed: it no longer runs on this node", uid)

    async def run(self, cache: PodCache, node: str, interval_s: float) -> None:
        """Follow the pod cache until cancelled: a full pass on every change of it and every ``interval_s``,
        and a pass over the containers whose directory changed on every change notification. The first pass
        waits for the cache to be synced (an empty cache would make every directory look left over)."""
        await cache.synced.wait()
        loop = asyncio.get_running_loop()
        watch = self._start_watch(loop)
        only: frozenset[ContainerKey] | None = None
        next_full = 0.0
        try:
            while True:
                pods = list(cache.pods())
                try:
                    found = await asyncio.to_thread(self.sync, wanted(pods, node), resident(pods), only)
                except OSError:
                    self._metrics.errors.labels("live_limits").inc()
                    log.exception("live limits pass failed; retrying in %.0fs", interval_s)
                else:
                    for tamper in found:
                        if self._report is not None:
                            self._report(tamper)
                if only is None:
                    next_full = time.monotonic() + interval_s
                only = await self._next(cache, watch, next_full)
        finally:
            if watch is not None:
                self._watch = None
                watch.detach(loop)
                watch.close()

    def _start_watch(self, loop: asyncio.AbstractEventLoop) -> DirWatch | None:
        if not self._want_watch:
            return None
        try:
            watch = DirWatch()
        except OSError as exc:  # no inotify instance left for this user (max_user_instances)
            self._metrics.errors.labels("live_limits").inc()
            log.warning("no change notifications for live limits (%s): the periodic pass only", exc)
            return None
        watch.attach(loop)
        self._watch = watch
        return watch

    async def _next(self, cache: PodCache, watch: DirWatch | None, next_full: float) -> frozenset[ContainerKey] | None:
        """Wait for what comes first: a change of the pod cache or the next full pass (None: a full pass), or a
        change notification (the containers it names)."""
        remaining = max(0.0, next_full - time.monotonic())
        if watch is None:
            await cache.changed(remaining)
            return None
        pod_change = asyncio.ensure_future(cache.changed(remaining))
        notified = asyncio.ensure_future(watch.wait())
        done, pending = await asyncio.wait({pod_change, notified}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if pod_change in done:
            watch.take()  # the full pass looks at every container anyway
            return None
        await asyncio.sleep(_SETTLE_S)
        return watch.take()
