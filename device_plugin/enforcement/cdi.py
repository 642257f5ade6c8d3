"""CDI spec files: the device plugin's answer as the last word on a container's environment.

The kubelet puts a container's own ``env``/``envFrom`` after the plugin's ``envs``, and the runtime keeps
the last of a name, so on its own an Allocate answer loses to the tenant. For every container it answers,
the plugin writes a Container Device Interface spec (``<--cdi-dir>/tensor-fusion.ai-vgpu_<pod UID>_<container>.json``,
kind :data:`~vgpu.names.CDI_KIND`, one device) whose ``containerEdits`` carry the answer's environment and
mounts, and names the device in ``cdi_devices``; the runtime applies those edits after the CRI config's.
Files are written atomically, never through a link, rewritten for a pod whose file went missing (``/var/run``
is a tmpfs), and removed once the pod has left the node (:meth:`CdiSpecs.run`). Why, and what each wall
closes: docs/security.md, section "Environment overrides".
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

from device_plugin.cluster.pod_cache import PodCache
from device_plugin.cluster.pods import PodRecord
from device_plugin.enforcement.envs import ContainerGrant, MountSpec
from device_plugin.enforcement.live_limits import leftover, resident
from device_plugin.metrics import PluginMetrics
from vgpu.names import CDI_KIND

log = logging.getLogger(__name__)
# 0.5.0: the first version whose device names may start with a digit (a pod UID does); containerd 1.7's
# CDI library reads it. Nothing here needs a later one (no annotations, mount types or additional GIDs).
CDI_VERSION: Final = "0.5.0"
SPEC_PREFIX: Final = CDI_KIND.replace("/", "-") + "_"  # tensor-fusion.ai-vgpu_
SPEC_SUFFIX: Final = ".json"
_STAGED_SUFFIX: Final = ".tmp"  # not .json: the CDI library reads only .json and .yaml files
# CDI's device-name rule: letters, digits, '_', '.', ':' and '-', starting and ending with a letter or digit.
_DEVICE_NAME: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
# The answer a container of a pod would get now (None: its allocation no longer holds): what a missing file
# is written again from (the allocator's :meth:`~device_plugin.kubelet.allocator.Allocator.regrant`).
Regrant = Callable[[PodRecord, str], ContainerGrant | None]


def device_name(uid: str, container: str) -> str:
    """The CDI device of ``container`` of the pod ``uid``; ValueError if CDI could not name it."""
    name = f"{uid}_{container}"
    if not uid or "_" in uid or not container or _DEVICE_NAME.fullmatch(name) is None:
        raise ValueError(f"pod UID {uid!r} and container {container!r} make no CDI device name")
    return name


def qualified(name: str) -> str:
    """The fully qualified CDI name (``vendor/class=name``) the answer gives the kubelet."""
    return f"{CDI_KIND}={name}"


def spec_file(name: str) -> str:
    return f"{SPEC_PREFIX}{name}{SPEC_SUFFIX}"


def owner(file_name: str) -> str | None:
    """The pod UID of one of our spec files (or one left staged by a crash); None for anything else."""
    base = file_name.removeprefix(".")
    if not base.startswith(SPEC_PREFIX) or not file_name.endswith((SPEC_SUFFIX, _STAGED_SUFFIX)):
        return None
    uid, sep, _ = base.removeprefix(SPEC_PREFIX).partition("_")
    return uid if sep and uid else None


def _mount(m: MountSpec) -> dict[str, Any]:
    """A bind mount as CDI writes one (no ``type``: that field needs spec 0.4.0, and bind needs none)."""
    options = ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"]
    return {"hostPath": m.host_path, "containerPath": m.container_path, "options": options}


def spec(name: str, grant: ContainerGrant) -> dict[str, Any]:
    """The CDI spec declaring the device ``name`` with the answer's environment and mounts."""
    edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in grant.envs.items()]}
    if grant.mounts:
        edits["mounts"] = [_mount(m) for m in grant.mounts]
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": [{"name": name, "containerEdits": edits}]}


class CdiSpecs:
    """The plugin's spec files in the CDI spec directory ``root`` (a host path, the same inside its container)."""

    def __init__(self, root: Path, metrics: PluginMetrics, *, grace_s: float = 30.0) -> None:
        self.root, self._metrics, self._grace_s = root, metrics, grace_s

    async def publish(self, uid: str, container: str, grant: ContainerGrant) -> str:
        """Write the container's spec (in a worker thread) and return its device's qualified name; raises
        OSError or ValueError when it cannot."""
        return await asyncio.to_thread(self.write, uid, container, grant)

    def write(self, uid: str, container: str, grant: ContainerGrant) -> str:
        name = device_name(uid, container)
        text = json.dumps(spec(name, grant), indent=2) + "\n"
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        target = spec_file(name)
        # mkstemp creates with O_EXCL (never through a link); the rename replaces whatever is at the name.
        fd, staged = tempfile.mkstemp(dir=self.root, prefix=f".{target}.", suffix=_STAGED_SUFFIX)
        try:
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(staged, self.root / target)
        except BaseException:
            Path(staged).unlink(missing_ok=True)
            raise
        return qualified(name)

    def _ours(self) -> Iterator[tuple[str, str, float]]:
        """(file name, pod UID, mtime) of every file of ours in the directory."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return
        for entry in entries:
            uid = owner(entry.name)
            if uid is None:
                continue
            try:
                yield entry.name, uid, entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue

    def missing(self, keys: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """The (pod UID, container) pairs whose spec file is not in the directory."""
        present = {name for name, _, _ in self._ours()}
        return [(uid, c) for uid, c in keys if spec_file(device_name(uid, c)) not in present]

    def sweep(self, resident_uids: frozenset[str]) -> list[str]:
        """Remove the files of pods that no longer run here, untouched for the grace period; their names."""
        files = list(self._ours())
        newest: dict[str, float] = {}
        for _, uid, mtime in files:
            newest[uid] = max(newest.get(uid, 0.0), mtime)
        gone = set(leftover(newest, resident_uids, now=time.time(), grace_s=self._grace_s))
        removed = []
        for file_name, uid, _ in files:
            if uid in gone:
                (self.root / file_name).unlink(missing_ok=True)  # unlink never follows a link
                removed.append(file_name)
        for uid in sorted(gone):
            log.info("CDI spec of pod %s removed: it no longer runs on this node", uid)
        return removed

    async def restore(self, pods: Iterable[PodRecord], node: str, regrant: Regrant) -> list[str]:
        """Write again the missing spec of every container the kubelet holds an answer for (an active pod of
        this node with its hand-off receipt: every container answered); the qualified names written."""
        held = {
            (p.uid, c): (p, c)
            for p in pods
            if p.node == node and p.active and p.handoff is not None
            for c, _ in p.vgpu_containers
        }
        written = []
        for key in await asyncio.to_thread(self.missing, held):
            pod, container = held[key]
            grant = regrant(pod, container)
            if grant is None:
                continue
            written.append(await self.publish(pod.uid, container, grant))
            log.warning(
                "CDI spec of pod %s container %s was missing (a node reboot empties %s); written again from its "
                "allocation",
                pod.key,
                container,
                self.root,
                extra={"pod": pod.key, "container": container},
            )
        return written

    async def run(self, cache: PodCache, node: str, interval_s: float, regrant: Regrant) -> None:
        """Sweep and restore on every pod change and every ``interval_s`` until cancelled; the first pass waits
        for the cache to sync (an empty cache would make every file look left over)."""
        await cache.synced.wait()
        while True:
            pods = list(cache.pods())
            try:
                await asyncio.to_thread(self.sweep, resident(pods))
                await self.restore(pods, node, regrant)
            except (OSError, ValueError):
                self._metrics.errors.labels("cdi").inc()
                log.exception("CDI spec pass over %s failed; retrying in %.0fs", self.root, interval_s)
            await cache.changed(interval_s)
