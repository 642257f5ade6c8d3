"""Live limits on disk: each container's directory, its ``limits.json``, HAMi-core's region, and cleanup.

At Allocate the plugin makes ``<root>/<pod UID>/<container>/`` and writes ``limits.json`` there before
the container starts (:meth:`LiveLimits.prepare`); the container sees the directory at
:data:`~vgpu.names.LIVE_LIMITS_DIR`. Then a loop on the pod cache (:meth:`LiveLimits.run`) makes every
container's files match its pod's current allocation, on every change and every few seconds anyway:
``limits.json`` is replaced atomically, and under HAMi-core the region's slots are rewritten in place
(:mod:`device_plugin.enforcement.hami_region`). A pod's directory goes when its pod has left the node.
File work runs in a worker thread; decisions are :mod:`device_plugin.enforcement.live_limits`'.
Modes, ownership and timings: docs/live-limits.md, section "The directory".
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from device_plugin.cluster.pod_cache import PodCache
from device_plugin.enforcement import hami_region
from device_plugin.enforcement.envs import LiveMount, Target
from device_plugin.enforcement.live_limits import (
    ContainerKey,
    GpuLimit,
    Wanted,
    document,
    leftover,
    limits_of,
    parse_document,
    region_values,
    resident,
    wanted,
)
from device_plugin.metrics import PluginMetrics
from vgpu.contract.allocation import PodAllocation
from vgpu.names import HAMI_REGION_FILE, LIVE_LIMITS_FILE, EnforcementBackend
from vgpu.timefmt import rfc3339

log = logging.getLogger(__name__)
_DOCUMENT_MAX: Final = 1 << 16  # a limits.json larger than this is not ours


def _now() -> str:
    return rfc3339(time.time())


class LiveLimits:
    """The live-limits directories under ``root`` (a host path, the same inside the plugin's container)."""

    def __init__(
        self,
        root: Path,
        backend: EnforcementBackend,
        metrics: PluginMetrics,
        *,
        grace_s: float = 30.0,
        clock: Callable[[], str] = _now,
    ) -> None:
        self.root, self._backend, self._metrics = root, backend, metrics
        self._grace_s, self._clock = grace_s, clock
        self._lock = threading.Lock()  # prepare() (Allocates) and sync() (the loop) run in worker threads
        self._written: dict[ContainerKey, tuple[tuple[GpuLimit, ...], int]] = {}  # limits, generation
        self._refused: dict[ContainerKey, str] = {}  # regions left alone, and why (logged once)

    def directory(self, key: ContainerKey) -> Path:
        uid, container = key
        if not all(part and "/" not in part and part not in (".", "..") for part in key):
            raise ValueError(f"not a pod UID and container name: {uid!r}, {container!r}")
        return self.root / uid / container

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
            self._write(key, Wanted(target.namespace, target.pod, limits_of(alloc)))
            if self._backend is EnforcementBackend.HAMI_CORE:
                region = path / HAMI_REGION_FILE
                flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                fd = os.open(region, flags, 0o666)
                try:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):  # planted by a root tenant of an earlier start
                        raise OSError(f"{region} is not a regular file")
                    os.fchmod(fd, 0o666)
                finally:
                    os.close(fd)
        return LiveMount(str(path))

    def _write(self, key: ContainerKey, want: Wanted) -> bool:
        """Replace the container's limits.json if it records other limits; True if it did."""
        known = self._written.get(key) or self._recorded(key)
        if known is not None and known[0] == want.gpus:
            self._written[key] = known
            return False
        generation = (known[1] if known else 0) + 1
        text = document(key, want, backend=self._backend.value, generation=generation, updated_at=self._clock())
        path = self.directory(key)
        fd, staged = tempfile.mkstemp(dir=path, prefix=f".{LIVE_LIMITS_FILE}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            os.chmod(staged, 0o644)
            os.replace(staged, path / LIVE_LIMITS_FILE)
        except BaseException:
            Path(staged).unlink(missing_ok=True)
            raise
        self._written[key] = (want.gpus, generation)
        self._metrics.live_limit_writes.labels("file").inc()
        return True

    def _recorded(self, key: ContainerKey) -> tuple[tuple[GpuLimit, ...], int] | None:
        """What the container's limits.json records (after a plugin restart), if it is ours."""
        path = self.directory(key) / LIVE_LIMITS_FILE
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return None
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as source:
                raw = source.read(_DOCUMENT_MAX + 1)
        except OSError:
            return None
        return parse_document(raw.decode("utf-8", "replace")) if len(raw) <= _DOCUMENT_MAX else None

    def sync(self, wants: Mapping[ContainerKey, Wanted], resident_uids: frozenset[str]) -> None:
        """One pass: every prepared container's files to its wanted limits, leftover pod directories gone."""
        with self._lock:
            for key, want in wants.items():
                if not self.directory(key).is_dir():  # not prepared here (live limits were off, or another node)
                    continue
                if self._write(key, want):
                    log.info("live limits of %s/%s container %s now %s", want.namespace, want.pod, key[1], want.gpus)
                if self._backend is EnforcementBackend.HAMI_CORE and want.gpus:
                    self._sync_region(key, want)
            self._sweep(resident_uids)

    def _sync_region(self, key: ContainerKey, want: Wanted) -> None:
        synced = hami_region.sync(self.directory(key) / HAMI_REGION_FILE, region_values(want.gpus))
        if synced.writes:
            self._metrics.live_limit_writes.labels("hami_region").inc(len(synced.writes))
            log.info(
                "HAMi-core region of %s/%s container %s: wrote %s", want.namespace, want.pod, key[1], synced.writes
            )
        reason = synced.region.reason if synced.region.state is hami_region.State.REFUSED else ""
        if reason and self._refused.get(key) != reason:
            self._metrics.errors.labels("live_limits").inc()
            log.warning(
                "HAMi-core region of %s/%s container %s left untouched: %s", want.namespace, want.pod, key[1], reason
            )
        if reason:
            self._refused[key] = reason
        else:
            self._refused.pop(key, None)

    def _sweep(self, resident_uids: frozenset[str]) -> None:
        try:
            entries = {e.name: e.stat(follow_symlinks=False).st_mtime for e in os.scandir(self.root)}
        except FileNotFoundError:
            return
        for uid in leftover(entries, resident_uids, now=time.time(), grace_s=self._grace_s):
            shutil.rmtree(self.root / uid, ignore_errors=True)
            self._written = {k: v for k, v in self._written.items() if k[0] != uid}
            self._refused = {k: v for k, v in self._refused.items() if k[0] != uid}
            log.info("live limits of pod %s removed: it no longer runs on this node", uid)

    async def run(self, cache: PodCache, node: str, interval_s: float) -> None:
        """Follow the pod cache until cancelled; the first pass waits for it to be synced (an empty cache
        would make every directory look left over)."""
        await cache.synced.wait()
        while True:
            pods = list(cache.pods())
            try:
                await asyncio.to_thread(self.sync, wanted(pods, node), resident(pods))
            except OSError:
                self._metrics.errors.labels("live_limits").inc()
                log.exception("live limits pass failed; retrying in %.0fs", interval_s)
            await cache.changed(interval_s)
