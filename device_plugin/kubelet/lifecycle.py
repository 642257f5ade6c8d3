"""Serve, register, and start over when the kubelet restarts; remove our socket on shutdown.

On start the kubelet deletes every socket in the device-plugin directory and creates a new
``kubelet.sock`` (reference §5), forgetting every plugin. We poll the directory (cheap and portable
where inotify is not): a new ``kubelet.sock`` (inode or ctime changed) or the loss of our own socket
stops the server and serves and registers again, well within 2 s with the default 0.2 s poll;
SIGHUP does the same. Allocation bookkeeping lives outside the server, so nothing is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from device_plugin.kubelet.kubelet_api import KUBELET_SOCKET, register, unix_target
from device_plugin.kubelet.server import OPTIONS, DevicePluginServicer
from device_plugin.metrics import PluginMetrics
from protos.gen.deviceplugin.v1beta1 import api_pb2 as dp
from protos.gen.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

log = logging.getLogger(__name__)
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_ENDPOINT = "tensor-fusion-vgpu.sock"
DEFAULT_POLL_S = 0.2  # how often the directory is looked at for a new kubelet.sock or our socket's loss
DEFAULT_RETRY_S = 5.0  # pause before serving and registering again after a failure


@dataclass(frozen=True, slots=True, kw_only=True)
class SocketConfig:
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    endpoint: str = DEFAULT_ENDPOINT
    poll_s: float = DEFAULT_POLL_S
    retry_s: float = DEFAULT_RETRY_S
    register_timeout_s: float = 10.0


def _stamp(path: Path) -> tuple[int, int] | None:
    """Identity of a socket file: a re-created file has a new inode or ctime."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_ctime_ns)


class PluginServer:
    """One gRPC server on our unix socket, restarted as the kubelet comes and goes."""

    def __init__(self, servicer: DevicePluginServicer, config: SocketConfig, metrics: PluginMetrics) -> None:
        self._servicer, self._config, self._metrics = servicer, config, metrics
        self._server: grpc.aio.Server | None = None
        self.restart = asyncio.Event()  # set by SIGHUP
        self.registered = asyncio.Event()

    @property
    def socket(self) -> Path:
        return self._config.plugin_dir / self._config.endpoint

    async def start(self) -> None:
        """Remove a stale socket, serve, and check that we answer before telling the kubelet."""
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(self._servicer, server)
        server.add_insecure_port(unix_target(self.socket))
        await server.start()
        self._server = server
        async with grpc.aio.insecure_channel(unix_target(self.socket)) as channel:
            await dp_grpc.DevicePluginStub(channel).GetDevicePluginOptions(dp.Empty(), timeout=5, wait_for_ready=True)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0.2)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self.registered.clear()

    async def _wait(self, seconds: float, stopping: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), seconds)

    async def run(self, stopping: asyncio.Event) -> None:
        """Serve and register until ``stopping`` is set; then stop and remove our socket."""
        kubelet = self._config.plugin_dir / KUBELET_SOCKET
        try:
            while not stopping.is_set():
                while _stamp(kubelet) is None and not stopping.is_set():
                    await self._wait(self._config.poll_s, stopping)
                if stopping.is_set():
                    break
                seen = _stamp(kubelet)
                try:
                    await self.start()
                    await register(
                        self._config.plugin_dir,
                        self._config.endpoint,
                        OPTIONS,
                        timeout_s=self._config.register_timeout_s,
                    )
                except (grpc.aio.AioRpcError, OSError) as exc:
                    self._metrics.errors.labels("register").inc()
                    log.warning("serving or registering failed (%s); retrying in %.1fs", exc, self._config.retry_s)
                    await self.stop()
                    await self._wait(self._config.retry_s, stopping)
                    continue
                self._metrics.registrations.inc()
                self.registered.set()
                log.info("registered %s with the kubelet", self.socket)
                await self._watch(kubelet, seen, stopping)
                await self.stop()
        finally:
            await self.stop()

    async def _watch(self, kubelet: Path, seen: tuple[int, int] | None, stopping: asyncio.Event) -> None:
        self.restart.clear()
        while not stopping.is_set():
            await self._wait(self._config.poll_s, stopping)
            now = _stamp(kubelet)
            if now is not None and now != seen:
                log.info("kubelet.sock was re-created (kubelet restarted); registering again")
                return
            if not self.socket.exists():
                log.info("our socket %s disappeared; serving and registering again", self.socket)
                return
            if self.restart.is_set():
                log.info("SIGHUP: serving and registering again")
                return
