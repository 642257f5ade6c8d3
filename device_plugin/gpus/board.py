"""The node's GPUs and their health, the one source for ListAndWatch, Allocate and the inventory.

Discovery turns probe devices into inventory :class:`~vgpu.contract.inventory.GpuInfo` (TFLOPS from
the shared catalog; an unknown model gets a configurable default and a warning, never a crash).
The :class:`HealthMonitor` drives the pure :mod:`device_plugin.gpus.health` machine from XID events and
periodic checks (blocking probe calls in a thread) and publishes flips here; each change bumps a
generation and wakes every ListAndWatch stream and the inventory publisher, like grpc's health
servicer wakes its Watch streams.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping

from device_plugin.gpus.health import GpuHealth, HealthBoard, HealthPolicy
from device_plugin.gpus.probe import GpuDevice, GpuProbe
from device_plugin.gpus.slices import Slice, slices
from vgpu import mig
from vgpu.catalog import Catalog
from vgpu.contract.inventory import GpuInfo, Health

log = logging.getLogger(__name__)


def discover(devices: tuple[GpuDevice, ...], catalog: Catalog, default_tflops: int) -> tuple[GpuInfo, ...]:
    """Inventory entries for probed GPUs; unknown models get ``default_tflops`` (milli) and a warning.
    A GPU in MIG mode is followed by one entry per MIG instance, sized and named by vgpu.mig."""
    found: list[GpuInfo] = []
    for d in devices:
        model = catalog.lookup(d.name)
        if model is None:
            log.warning(
                "GPU %d (%s) %r is not in the GPU catalog; advertising %s milli-TFLOPS "
                "(set --default-tflops or a catalog override)",
                d.index,
                d.uuid,
                d.name,
                default_tflops,
            )
        gpu = GpuInfo(
            uuid=d.uuid,
            index=d.index,
            model=model.key if model is not None else d.name,
            tflops=model.tflops_milli if model is not None else default_tflops,
            vram=d.memory,
            numa=d.numa,
            mig=d.mig,
        )
        found.append(gpu)
        found.extend(
            GpuInfo(
                uuid=u.uuid,
                index=d.index,
                model=mig.unit_product(gpu.model, mig.profile_name(u.slices, u.memory)),
                tflops=mig.unit_tflops(gpu.tflops, u.slices, d.mig_slices),
                vram=u.memory,
                numa=d.numa,
                parent=d.uuid,
            )
            for u in (d.units if d.mig else ())
        )
    return tuple(found)


class DeviceBoard:
    """GPUs with live health; mutated on the event loop only."""

    def __init__(self, gpus: tuple[GpuInfo, ...], slices_per_gpu: int, policy: HealthPolicy) -> None:
        self.slices_per_gpu = slices_per_gpu
        self._gpus = gpus
        self.health = HealthBoard.fresh((g.uuid for g in gpus), policy)
        self.generation = 0
        self._changed = asyncio.Event()
        slices(gpus, slices_per_gpu)  # fail at start if an ID would be too long

    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    def by_uuid(self) -> Mapping[str, GpuInfo]:
        return {g.uuid: g for g in self._gpus}

    def slices(self) -> tuple[Slice, ...]:
        return slices(self._gpus, self.slices_per_gpu)

    def set_health(self, board: HealthBoard, flipped: frozenset[str]) -> None:
        self.health = board
        if not flipped:
            return
        for uuid in sorted(flipped):
            state = board.states[uuid]
            log.warning("GPU %s is now %s %s", uuid, "healthy" if state.healthy else "unhealthy", state.reason)
        self._gpus = tuple(  # a MIG unit is as healthy as its GPU too (an XID names the GPU)
            dataclasses.replace(
                g,
                health=Health.HEALTHY
                if board.healthy(g.uuid) and (g.parent is None or board.healthy(g.parent))
                else Health.UNHEALTHY,
            )
            for g in self._gpus
        )
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def changes(self) -> AsyncIterator[tuple[Slice, ...]]:
        """The full slice list now, then again after every change; never ends by itself."""
        seen = -1
        while True:
            changed = self._changed
            if self.generation != seen:
                seen = self.generation
                yield self.slices()
            await changed.wait()

    async def wait_change(self, generation: int, timeout_s: float) -> None:
        """Return when the generation moved past ``generation`` or after ``timeout_s``."""
        if self.generation != generation:
            return
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            return


def layout(gpus: tuple[GpuInfo, ...]) -> frozenset[tuple[object, ...]]:
    """What a re-published inventory would change: each GPU's and MIG instance's identity and size."""
    return frozenset((g.uuid, g.model, g.tflops, g.vram, g.mig, g.parent) for g in gpus)


class LayoutWatch:
    """Notices the node's GPUs changing under the plugin — above all a MIG reconfiguration, which
    removes and creates instances (new UUIDs) — and stops the plugin so that its DaemonSet starts it
    again with the new layout: registration, device IDs and the inventory are then all rebuilt from one
    discovery, as after any restart (NVIDIA's plugin needs the same restart after a MIG change)."""

    def __init__(
        self, probe: GpuProbe, board: DeviceBoard, catalog: Catalog, default_tflops: int, interval_s: float
    ) -> None:
        self._probe, self._board = probe, board
        self._catalog, self._default_tflops = catalog, default_tflops
        self._interval = interval_s

    async def changed(self) -> str | None:
        """What differs between the GPUs now and the published ones; None when nothing does."""
        now = discover(await asyncio.to_thread(self._probe.devices), self._catalog, self._default_tflops)
        before, after = layout(self._board.gpus()), layout(now)
        if before == after:
            return None
        gone = sorted(str(g[0]) for g in before - after)
        new = sorted(str(g[0]) for g in after - before)
        return f"gone or changed: {', '.join(gone) or 'none'}; new or changed: {', '.join(new) or 'none'}"

    async def run(self, stopping: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                change = await self.changed()
            except Exception as exc:  # listing failed: the health checks say what is wrong
                log.warning("listing the GPUs again failed (%s); the layout is checked again later", exc)
                continue
            if change is not None:
                log.error("the node's GPU layout changed (%s): stopping, to start again with the new layout", change)
                stopping.set()
                return


class HealthMonitor:
    """Feeds XID events and periodic checks into the board's health machine.

    A failing event wait (an NVML error other than its timeout) is logged and the periodic checks go
    on: the monitor must not end silently and leave every GPU advertised healthy for good."""

    def __init__(
        self,
        probe: GpuProbe,
        board: DeviceBoard,
        *,
        check_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_flip: Callable[[str, GpuHealth], None] | None = None,
        extra: Callable[[str], str | None] | None = None,
    ) -> None:
        """``on_flip(uuid, state)`` hears of every GPU that turned healthy or unhealthy (it must not block);
        ``extra(uuid)`` is a check besides the probe's, of what the plugin runs for the GPU (the MPS daemon):
        it must not block either."""
        self._probe, self._board = probe, board
        self._interval = check_interval_s
        self._clock = clock
        self._on_flip = on_flip
        self._extra = extra

    def _apply(self, board: HealthBoard, flipped: frozenset[str]) -> None:
        self._board.set_health(board, flipped)
        if self._on_flip is not None:
            for uuid in sorted(flipped):
                self._on_flip(uuid, board.states[uuid])

    def fault(self, problems: Mapping[str, str]) -> None:
        """Faults found elsewhere, applied now, on the event loop, like failed checks (healing is left to
        the periodic checks, whose ``extra`` then finds nothing wrong)."""
        board, flipped = self._board.health.checked(problems, self._clock())
        self._apply(board, flipped)

    def _check_all(self) -> dict[str, str | None]:
        """The probe's checks (blocking: run in a thread)."""
        results: dict[str, str | None] = {}
        for gpu in self._board.gpus():
            try:
                results[gpu.uuid] = self._probe.check(gpu.uuid)
            except Exception as exc:  # a probe that cannot even ask is itself a fault
                results[gpu.uuid] = f"health check failed: {exc}"
        return results

    def _with_extra(self, results: Mapping[str, str | None]) -> dict[str, str | None]:
        """``extra``'s verdicts added on the event loop, when the results are applied: asked from the probe's
        thread, a verdict could predate a fault the loop applied meanwhile, and heal the GPU it faulted."""
        extra = self._extra
        return {u: r if r is not None or extra is None else extra(u) for u, r in results.items()}

    async def run(self) -> None:
        next_check = self._clock()
        while True:
            wait = max(0.0, next_check - self._clock())
            try:
                events = await asyncio.to_thread(self._probe.wait_xid, min(wait, self._interval))
            except Exception as exc:  # the event channel broke: keep the periodic checks going
                log.warning("waiting for XID events failed (%s); periodic checks continue", exc)
                events = ()
                await asyncio.sleep(min(wait, self._interval))
            for event in events:
                board, flipped = self._board.health.xid(event.uuid, event.xid, self._clock())
                self._apply(board, flipped)
            if self._clock() >= next_check:
                results = self._with_extra(await asyncio.to_thread(self._check_all))
                board, flipped = self._board.health.checked(results, self._clock())
                self._apply(board, flipped)
                next_check = self._clock() + self._interval
