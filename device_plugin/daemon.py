"""Wires the plugin's parts together and runs them until asked to stop.

One place builds the board from the probe, the pod cache and its watch, the allocator and hand-off
keeper, the servicer and its socket lifecycle, the inventory publisher, the usage sampler and metrics,
the live-limits keeper, the CDI spec files, the NVIDIA toolkit check, the VRAM guard and, under
``--backend=mps``, NVIDIA's MPS control daemon, so that the CLI and the component tests run the very same
assembly (tests swap only the probe, the process resolver and killer, the Kubernetes gateway and the
PodResources source).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Final

from device_plugin.cluster.gateway import KubeGateway
from device_plugin.cluster.handoff import HandoffKeeper
from device_plugin.cluster.node_events import NodeEvents
from device_plugin.cluster.pod_cache import PodCache, PodFeed
from device_plugin.cluster.publisher import InventoryPublisher
from device_plugin.cluster.receipts import ReceiptFile
from device_plugin.enforcement.cdi import CdiSpecs
from device_plugin.enforcement.compute_guard import ComputeGuard
from device_plugin.enforcement.compute_overuse import ComputeOveruse, ComputeOveruseAction
from device_plugin.enforcement.live_files import LiveLimits
from device_plugin.enforcement.live_limits import Tamper
from device_plugin.enforcement.mps_daemon import MpsDaemon
from device_plugin.enforcement.mps_plan import plan, served
from device_plugin.enforcement.toolkit_check import ToolkitCheck
from device_plugin.enforcement.vram_guard import VramGuard
from device_plugin.enforcement.vram_overuse import Overuse, OveruseAction
from device_plugin.gpus.board import DeviceBoard, HealthMonitor, LayoutWatch, discover
from device_plugin.gpus.probe import GpuProbe
from device_plugin.kubelet.allocator import Allocator, AllocatorConfig
from device_plugin.kubelet.kubelet_api import PodDevices, list_pod_devices
from device_plugin.kubelet.lifecycle import DEFAULT_POLL_S, DEFAULT_RETRY_S, PluginServer
from device_plugin.kubelet.server import DevicePluginServicer
from device_plugin.metrics import GpuCollector, PluginMetrics, UsageCollector
from device_plugin.settings import PluginSettings
from device_plugin.usage.process_kill import PidfdKiller, ProcessKiller
from device_plugin.usage.process_owner import ProcessResolver, ProcResolver
from device_plugin.usage.sampler import UsageSampler
from device_plugin.usage.usage import Attribution, grant_of
from tf_shell.access import Gate
from vgpu.catalog import Catalog
from vgpu.contract import usage
from vgpu.contract.allocation import PodAllocation
from vgpu.names import EnforcementBackend

log = logging.getLogger(__name__)
CACHE_SYNC_S: Final = 30.0  # how long serving waits for the first list of the node's pods
MPS_START_WAIT_S: Final = 60.0  # how long serving waits for the MPS control daemon's first start (--backend=mps)
CDI_SWEEP_S: Final = 10.0  # seconds between sweeps of the CDI spec files of pods gone, besides every pod change


class Daemon:
    def __init__(
        self,
        settings: PluginSettings,
        probe: GpuProbe,
        gateway: KubeGateway,
        *,
        catalog: Catalog,
        pod_devices: Callable[[], Awaitable[PodDevices]] | None = None,
        metrics: PluginMetrics | None = None,
        resolver: ProcessResolver | None = None,
        killer: ProcessKiller | None = None,
        live_limits_grace_s: float = 30.0,
        cdi_grace_s: float = 30.0,
        socket_poll_s: float = DEFAULT_POLL_S,
        socket_retry_s: float = DEFAULT_RETRY_S,
        gate: Gate | None = None,
    ) -> None:
        """``catalog``: the GPU models (built in, and ``--gpu-catalog``'s); ``resolver`` maps GPU processes to
        pods (default: ``/proc``), ``killer`` stops one for the VRAM guard (default: by pidfd, checked against
        ``resolver``). The rest are timings no operator needs, shortened by tests: how long a
        live-limits directory, and a CDI spec file, that no pod on the node owns is kept after its last
        change, and how often the kubelet's socket directory is polled and a failed serve or registration
        retried. ``gate`` judges who may read ``/metrics`` and ``/usage`` off loopback (None: anyone, for
        tests; the program always has one)."""
        self.settings, self.gate = settings, gate
        self.catalog = catalog
        self.probe, self.gateway = probe, gateway
        self.metrics = metrics or PluginMetrics()
        node = settings.node
        gpus = discover(probe.devices(), catalog, settings.default_milli_tflops)
        self.board = DeviceBoard(gpus, settings.slices_per_gpu, settings.health)
        self.cache = PodCache()
        self.feed = PodFeed(gateway, node, self.cache)
        if pod_devices is None:
            socket = settings.podresources_path

            async def from_kubelet() -> PodDevices:
                return await list_pod_devices(socket)

            pod_devices = from_kubelet
        self.node_events = NodeEvents(gateway, node, self.metrics)

        def tampered(found: Tamper) -> None:
            message = found.message()
            self.node_events.live_limits_tampered(
                found.namespace, found.pod, found.uid, message, restored=found.restored
            )

        live_dir = settings.live_limits_path
        self.live = (
            None
            if live_dir is None
            else LiveLimits(live_dir, settings.backend, self.metrics, grace_s=live_limits_grace_s, report=tampered)
        )
        cdi_dir = settings.cdi_path
        self.cdi = None if cdi_dir is None else CdiSpecs(cdi_dir, self.metrics, grace_s=cdi_grace_s)
        self.toolkit = ToolkitCheck(
            Path(settings.nvidia_toolkit_config),
            # Automatic CDI delivery only where the plugin's own CDI device is on: --cdi-dir= says the runtime
            # reads no CDI, and NVIDIA's devices named there would be ignored (containers without GPUs).
            settings.nvidia_cdi_paths if settings.cdi_path is not None else (),
            settings.wanted_delivery,
            lambda: [g.uuid for g in self.board.gpus()],
            self.node_events,
            self.metrics,
            on_change=lambda: self.publisher.nudge(),
        )
        receipts = settings.receipts_path
        self.keeper = HandoffKeeper(
            gateway,
            self.cache,
            node,
            self.metrics,
            pod_devices=pod_devices,
            local=None if receipts is None else ReceiptFile(receipts),
        )
        mps = settings.backend is EnforcementBackend.MPS
        self.mps = (
            MpsDaemon(
                plan(self.board.gpus(), settings.mps),
                probe,
                self.metrics,
                fault=lambda problems: self.monitor.fault(problems),
                grants=self._grants,
                poll_s=settings.health_check_interval,
                backoff_s=settings.mps_restart_backoff,
            )
            if mps
            else None
        )
        allocator_config = AllocatorConfig(
            node=node, backend=settings.backend, paths=settings.enforcement_paths, lookup_wait_s=settings.lookup_wait
        )
        self.allocator = Allocator(
            allocator_config,
            gateway,
            self.cache,
            self.board,
            self.keeper,
            self.metrics,
            pod_devices,
            self.live,
            self.cdi,
            self.toolkit.delivery,
            None if self.mps is None else self.mps.admit,
        )
        self.servicer = DevicePluginServicer(self.board, self.allocator, self.metrics)
        sockets = dataclasses.replace(settings.sockets, poll_s=socket_poll_s, retry_s=socket_retry_s)
        self.server = PluginServer(self.servicer, sockets, self.metrics)
        self.monitor = HealthMonitor(
            probe,
            self.board,
            check_interval_s=settings.health_check_interval,
            on_flip=self.node_events.gpu_flipped,
            extra=self.mps.problem if self.mps else None,
        )
        self.publisher = InventoryPublisher(
            gateway,
            self.board,
            self.metrics,
            node=node,
            backend=settings.backend,
            setup=lambda: self.toolkit.current,
            pool=settings.pool,
            heartbeat_s=settings.heartbeat,
        )

        resolver = resolver or ProcResolver()

        def overuse(found: Overuse, message: str) -> None:
            c = found.pod
            self.node_events.vram_overuse(c.namespace, c.pod, c.pod_uid, message)

        self.vram_guard = (
            None
            if settings.vram_overuse is OveruseAction.OFF
            else VramGuard(
                settings.vram_overuse, settings.vram_tolerance, killer or PidfdKiller(resolver), self.metrics, overuse
            )
        )

        def compute(found: ComputeOveruse, message: str) -> None:
            c = found.share.rows[0]
            self.node_events.compute_overuse(c.namespace, c.pod, c.pod_uid, message)

        reporting = settings.compute_overuse is ComputeOveruseAction.REPORT
        if reporting and settings.backend is not EnforcementBackend.HAMI_CORE:
            log.info(
                "--compute-overuse=report judges nothing on --backend=%s: only HAMi-core holds a compute cap whose "
                'per-container share the driver measures (docs/security.md, "Compute past its limit, by the '
                "driver's count\")",
                settings.backend.value,
            )
        self.compute_guard = (
            ComputeGuard(
                settings.compute_overuse_margin,
                settings.compute_overuse_window,
                settings.usage_interval,
                self._grants,
                self.metrics,
                compute,
            )
            if reporting and settings.backend is EnforcementBackend.HAMI_CORE
            else None
        )
        self._guards = [g.enforce for g in (self.vram_guard, self.compute_guard) if g is not None]

        async def after(found: Attribution) -> None:
            for enforce in self._guards:
                await enforce(found)

        self.sampler = UsageSampler(
            probe,
            resolver,
            self.board.gpus,
            self.cache.pods,
            self.metrics,
            node=node,
            interval_s=settings.usage_interval,
            sm_unknown=frozenset(g.uuid for g in served(self.board.gpus())) if mps else frozenset(),
            after=after if self._guards else None,
        )

    def _grants(self) -> dict[str, PodAllocation] | None:
        """The grants of the node's pods that may still run, by UID; None until the pods are listed."""
        if not self.cache.synced.is_set():
            return None
        found = ((p.uid, grant_of(p.allocation)) for p in self.cache.pods() if p.active and p.allocation)
        return {uid: alloc for uid, alloc in found if alloc is not None}

    def latest_usage(self) -> str | None:
        """The usage document as ``/usage`` serves it; None before the first pass."""
        latest = self.sampler.latest
        return None if latest is None else usage.encode(latest)

    async def run(self, stopping: asyncio.Event) -> None:
        """Run every part until ``stopping`` is set; the server removes its socket on the way out."""
        self.feed.start(asyncio.get_running_loop())
        http = None
        settings = self.settings
        if settings.metrics_port:
            node, sampler = settings.node, self.sampler
            self.metrics.registry.register(GpuCollector(self.probe, self.board.gpus, node, lambda: sampler.allocated))
            self.metrics.registry.register(UsageCollector(node, lambda: sampler.latest, lambda: sampler.supported))
            http = self.metrics.serve(
                settings.metrics_port, self.latest_usage, settings.metrics_address, node=node, gate=self.gate
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.cache.synced.wait(), CACHE_SYNC_S)
        if not self.cache.synced.is_set():
            log.warning("pod cache not synced after %.0fs; serving anyway", CACHE_SYNC_S)
        await self.toolkit.refresh()  # before the first Allocate: it decides how containers get their GPUs
        watch = LayoutWatch(
            self.probe, self.board, self.catalog, settings.default_milli_tflops, settings.layout_check_interval
        )
        background: list[Coroutine[Any, Any, None]] = [
            watch.run(stopping),
            self.monitor.run(),
            self.publisher.run(),
            self.toolkit.run(settings.toolkit_check_interval),
            self.keeper.run(self.allocator, settings.reconcile_interval),
            *([self.sampler.run()] if http is not None or self._guards else []),
            *([self.live.run(self.cache, settings.node, settings.live_limits_interval)] if self.live else []),
            *([self.cdi.run(self.cache, settings.node, CDI_SWEEP_S, self.allocator.regrant)] if self.cdi else []),
            *([self.mps.run()] if self.mps else []),
        ]
        tasks = [asyncio.create_task(c) for c in background]
        try:
            if self.mps is not None:  # its GPUs are faulted before the kubelet first lists them if it cannot run
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.mps.attempted.wait(), MPS_START_WAIT_S)
            await self.server.run(stopping)
        finally:
            self.feed.stop()
            if http is not None:
                await asyncio.to_thread(http.shutdown)
                http.server_close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.mps is not None:
                await self.mps.stop()
            await self.keeper.drain()
            await self.node_events.close()
