"""Reads the node's NVIDIA container toolkit configuration and NVIDIA's CDI specs, and reports what follows.

At start, and every ``--toolkit-check-interval`` after (the GPU operator's toolkit container may rewrite the
configuration while the plugin runs, and the toolkit reads it at every container start), the plugin reads the
two settings that decide who gets GPUs on this node and chooses how its own containers get theirs
(:func:`device_plugin.enforcement.delivery.choose`). What it concluded is the Allocate answers' delivery, the
inventory's ``envvarGuard`` and ``deviceDelivery`` (what ``tfctl nodes`` shows), two one-hot gauges, and a
Warning Event on the node for each problem, posted when it first appears, not on every check.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

import yaml

from device_plugin.cluster.node_events import NodeEvents
from device_plugin.enforcement.delivery import NodeSetup, ToolkitConfig, choose, parse_config
from device_plugin.metrics import PluginMetrics
from vgpu.names import NVIDIA_CDI_KIND, DeviceDelivery, EnvvarGuard

log = logging.getLogger(__name__)
_MAX_BYTES = 1 << 20  # a toolkit configuration or CDI spec larger than this is not one


def read_config(path: Path) -> ToolkitConfig:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return ToolkitConfig(str(path), problem=f"{path} does not exist (no NVIDIA container toolkit configured?)")
    except OSError as exc:
        return ToolkitConfig(str(path), problem=f"{path} cannot be read: {exc.strerror}")
    if len(data) > _MAX_BYTES:
        return ToolkitConfig(str(path), problem=f"{path} is larger than {_MAX_BYTES} bytes")
    return parse_config(str(path), data.decode("utf-8", errors="replace"))


def cdi_names(dirs: Iterable[Path]) -> frozenset[str]:
    """Names of the devices of kind ``nvidia.com/gpu`` declared by the CDI specs (.json, .yaml) in ``dirs``."""
    names: set[str] = set()
    for directory in dirs:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith((".json", ".yaml", ".yml")) or not entry.is_file():
                continue
            try:
                with open(entry.path, "rb") as f:
                    raw = f.read(_MAX_BYTES + 1)
                doc = json.loads(raw) if entry.name.endswith(".json") else yaml.safe_load(raw)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                log.warning("CDI spec %s unreadable: %s", entry.path, exc)
                continue
            if len(raw) > _MAX_BYTES or not isinstance(doc, dict) or doc.get("kind") != NVIDIA_CDI_KIND:
                continue
            devices = doc.get("devices")
            for device in devices if isinstance(devices, list) else ():
                if isinstance(device, dict) and isinstance(device.get("name"), str):
                    names.add(device["name"])
    return frozenset(names)


class ToolkitCheck:
    """The node's current :class:`NodeSetup`, kept by :meth:`run`; ``current`` is what Allocate and the
    inventory read."""

    def __init__(
        self,
        config_path: Path,
        cdi_dirs: Collection[Path],
        wanted: DeviceDelivery | None,
        uuids: Callable[[], Collection[str]],
        events: NodeEvents,
        metrics: PluginMetrics,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_change``: called when the guard or the delivery changed (the inventory publisher's nudge)."""
        self._config_path, self._cdi_dirs, self._wanted = config_path, tuple(cdi_dirs), wanted
        self._uuids, self._events, self._metrics, self._on_change = uuids, events, metrics, on_change
        self.current = NodeSetup(EnvvarGuard.UNKNOWN, wanted or DeviceDelivery.ENVVAR)
        self._reported: frozenset[str] = frozenset()

    def delivery(self) -> DeviceDelivery:
        return self.current.delivery

    def look(self) -> NodeSetup:
        """Read the files and decide (blocking: run it in a worker thread)."""
        config = read_config(self._config_path)
        names = cdi_names(self._cdi_dirs) if self._wanted in (None, DeviceDelivery.CDI) else frozenset()
        return choose(self._wanted, config, names, self._uuids())

    async def refresh(self) -> NodeSetup:
        """Look again; log, count and post what changed."""
        setup = await asyncio.to_thread(self.look)
        before, self.current = self.current, setup
        for state in EnvvarGuard:
            self._metrics.envvar_guard.labels(state.value).set(1 if state is setup.guard else 0)
        for delivery in DeviceDelivery:
            self._metrics.device_delivery.labels(delivery.value).set(1 if delivery is setup.delivery else 0)
        if (before.guard, before.delivery) != (setup.guard, setup.delivery):
            log.info("NVIDIA toolkit: envvar guard %s; containers get their GPUs by %s", setup.guard, setup.delivery)
            self._on_change()
        messages = frozenset(p.message for p in setup.problems)
        for problem in setup.problems:
            if problem.message not in self._reported:
                log.warning("%s: %s", problem.reason, problem.message)
                self._events.node_warning(problem.reason, problem.message)
        self._reported = messages
        return setup

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.refresh()
            except Exception:
                self._metrics.errors.labels("toolkit_check").inc()
                log.exception("checking the NVIDIA toolkit's configuration failed; retrying in %.0fs", interval_s)
