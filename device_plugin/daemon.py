"""Wires the plugin's parts together and runs them until asked to stop.

One place builds the board from the probe, the pod cache and its watch, the allocator and hand-off
keeper, the servicer and its socket lifecycle, the inventory publisher, the usage sampler and metrics,
and the live-limits keeper, so that the CLI and the component tests run the very same assembly (tests
swap only the probe, the process resolver, the Kubernetes gateway and the PodResources source).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device_plugin.allocator import Allocator, AllocatorConfig
from device_plugin.board import DeviceBoard, HealthMonitor, LayoutWatch, discover
from device_plugin.envs import EnforcementPaths
from device_plugin.gateway import KubeGateway
from device_plugin.handoff import HandoffKeeper
from device_plugin.health import HealthPolicy
from device_plugin.kubelet_api import DEFAULT_PODRESOURCES_SOCKET, PodDevices, list_pod_devices
from device_plugin.lifecycle import PluginServer, SocketConfig
from device_plugin.live_files import LiveLimits
from device_plugin.metrics import GpuCollector, PluginMetrics, UsageCollector
from device_plugin.node_events import NodeEvents
from device_plugin.pod_cache import PodCache, PodFeed
from device_plugin.probe import GpuProbe
from device_plugin.process_owner import ProcessResolver, ProcResolver
from device_plugin.publisher import InventoryPublisher
from device_plugin.sampler import UsageSampler
from device_plugin.server import DevicePluginServicer
from vgpu.catalog import Catalog, builtin
from vgpu.contract import usage
from vgpu.names import DEFAULT_SLICES_PER_GPU, EnforcementBackend

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginConfig:
    node: str
    sockets: SocketConfig = field(default_factory=SocketConfig)
    podresources_socket: Path = Path(DEFAULT_PODRESOURCES_SOCKET)
    slices_per_gpu: int = DEFAULT_SLICES_PER_GPU
    backend: EnforcementBackend = EnforcementBackend.NONE
    paths: EnforcementPaths = field(default_factory=EnforcementPaths)
    default_tflops: int = 0  # milli-TFLOPS for models missing from the catalog
    health: HealthPolicy = field(default_factory=HealthPolicy)
    health_check_s: float = 5.0
    pool: str | None = None
    heartbeat_s: float = 30.0
    lookup_wait_s: float = 2.0
    reconcile_s: float = 10.0
    cache_sync_s: float = 30.0
    layout_check_s: float = 30.0  # how often the GPUs are listed again to notice a MIG reconfiguration
    metrics_port: int = 0  # 0: no /metrics and /usage server, and no usage sampling
    metrics_address: str = "0.0.0.0"
    usage_interval_s: float = 5.0
    # Per-container live-limits directories (docs/live-limits.md); None: limits are fixed at container start.
    live_limits_dir: Path | None = None
    live_limits_check_s: float = 5.0  # a pass at least this often, besides one on every pod change
    live_limits_grace_s: float = 30.0  # a directory no pod on the node owns is kept this long after its last change
    catalog: Catalog = field(default_factory=builtin)


class Daemon:
    def __init__(
        self,
        config: PluginConfig,
        probe: GpuProbe,
        gateway: KubeGateway,
        *,
        pod_devices: Callable[[], Awaitable[PodDevices]] | None = None,
        metrics: PluginMetrics | None = None,
        resolver: ProcessResolver | None = None,
    ) -> None:
        """``resolver`` maps GPU processes to pods (default: ``/proc``)."""
        self.config = config
        self.probe, self.gateway = probe, gateway
        self.metrics = metrics or PluginMetrics()
        gpus = discover(probe.devices(), config.catalog, config.default_tflops)
        self.board = DeviceBoard(gpus, config.slices_per_gpu, config.health)
        self.cache = PodCache()
        self.feed = PodFeed(gateway, config.node, self.cache)
        if pod_devices is None:
            socket = config.podresources_socket

            async def from_kubelet() -> PodDevices:
                return await list_pod_devices(socket)

            pod_devices = from_kubelet
        self.live = (
            None
            if config.live_limits_dir is None
            else LiveLimits(config.live_limits_dir, config.backend, self.metrics, grace_s=config.live_limits_grace_s)
        )
        self.keeper = HandoffKeeper(gateway, self.cache, config.node, self.metrics, pod_devices=pod_devices)
        allocator_config = AllocatorConfig(
            node=config.node, backend=config.backend, paths=config.paths, lookup_wait_s=config.lookup_wait_s
        )
        self.allocator = Allocator(
            allocator_config, gateway, self.cache, self.board, self.keeper, self.metrics, pod_devices, self.live
        )
        self.servicer = DevicePluginServicer(self.board, self.allocator, self.metrics)
        self.server = PluginServer(self.servicer, config.sockets, self.metrics)
        self.node_events = NodeEvents(gateway, config.node, self.metrics)
        self.monitor = HealthMonitor(
            probe, self.board, check_interval_s=config.health_check_s, on_flip=self.node_events.gpu_flipped
        )
        self.publisher = InventoryPublisher(
            gateway,
            self.board,
            self.metrics,
            node=config.node,
            backend=config.backend,
            pool=config.pool,
            heartbeat_s=config.heartbeat_s,
        )

        self.sampler = UsageSampler(
            probe,
            resolver or ProcResolver(),
            self.board.gpus,
            self.cache.pods,
            self.metrics,
            node=config.node,
            interval_s=config.usage_interval_s,
        )

    def latest_usage(self) -> str | None:
        """The usage document as ``/usage`` serves it; None before the first pass."""
        latest = self.sampler.latest
        return None if latest is None else usage.encode(latest)

    async def run(self, stopping: asyncio.Event) -> None:
        """Run every part until ``stopping`` is set; the server removes its socket on the way out."""
        self.feed.start(asyncio.get_running_loop())
        http = None
        if self.config.metrics_port:
            node, sampler = self.config.node, self.sampler
            self.metrics.registry.register(GpuCollector(self.probe, self.board.gpus, node, lambda: sampler.allocated))
            self.metrics.registry.register(UsageCollector(node, lambda: sampler.latest, lambda: sampler.supported))
            http = self.metrics.serve(self.config.metrics_port, self.latest_usage, self.config.metrics_address)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.cache.synced.wait(), self.config.cache_sync_s)
        if not self.cache.synced.is_set():
            log.warning("pod cache not synced after %.0fs; serving anyway", self.config.cache_sync_s)
        watch = LayoutWatch(
            self.probe, self.board, self.config.catalog, self.config.default_tflops, self.config.layout_check_s
        )
        background: list[Coroutine[Any, Any, None]] = [
            watch.run(stopping),
            self.monitor.run(),
            self.publisher.run(),
            self.keeper.run(self.allocator, self.config.reconcile_s),
            *([self.sampler.run()] if http is not None else []),
            *([self.live.run(self.cache, self.config.node, self.config.live_limits_check_s)] if self.live else []),
        ]
        tasks = [asyncio.create_task(c) for c in background]
        try:
            await self.server.run(stopping)
        finally:
            self.feed.stop()
            if http is not None:
                await asyncio.to_thread(http.shutdown)
                http.server_close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.keeper.drain()
            await self.node_events.drain()
