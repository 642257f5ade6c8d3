"""A test kubelet: the Registration server on ``kubelet.sock`` and a client of the plugin's socket.

It does what kubelet 1.36 was recorded doing (reference/kubelet-captures/run2): on Register it checks
the version and resource name, dials the plugin back, calls GetDevicePluginOptions and opens
ListAndWatch *before* Register returns; on restart it deletes every socket in the directory and
creates a new ``kubelet.sock``. Every ListAndWatch message lands in a queue for assertions. Like the
kubelet, it records which pod and container each successful Allocate was for, and shows that record
as PodResources does.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc

from device_plugin.kubelet.kubelet_api import PodDevices
from protos.gen.deviceplugin.v1beta1 import api_pb2 as dp
from protos.gen.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from vgpu.names import RESOURCE_VGPU

Devices = list[tuple[str, str]]  # (ID, health)


class TestKubelet(dp_grpc.RegistrationServicer):
    __test__ = False  # not a pytest class

    def __init__(self, plugin_dir: Path) -> None:
        self.dir = plugin_dir
        self.registrations: asyncio.Queue[dp.RegisterRequest] = asyncio.Queue()
        self.requests: list[dp.RegisterRequest] = []
        self.lists: asyncio.Queue[dp.ListAndWatchResponse] = asyncio.Queue()
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._watch: asyncio.Task[None] | None = None
        self.stub: dp_grpc.DevicePluginAsyncStub | None = None
        self.records: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}  # what PodResources shows

    async def start(self) -> None:
        self._server = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.dir / 'kubelet.sock'}")
        await self._server.start()

    async def Register(self, request: dp.RegisterRequest, context: Any) -> dp.Empty:
        if request.version != "v1beta1" or request.resource_name != RESOURCE_VGPU:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad registration {request}")
        await self._close_plugin()
        self._channel = grpc.aio.insecure_channel(f"unix://{self.dir / request.endpoint}")
        self.stub = dp_grpc.DevicePluginStub(self._channel)  # type: ignore[assignment]
        assert self.stub is not None
        await asyncio.wait_for(self.stub.GetDevicePluginOptions(dp.Empty()), 10)
        self._watch = asyncio.create_task(self._pipe(self.stub))
        self.requests.append(request)
        await self.registrations.put(request)
        return dp.Empty()

    async def _pipe(self, stub: dp_grpc.DevicePluginAsyncStub) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for response in stub.ListAndWatch(dp.Empty()):
                await self.lists.put(response)

    async def _close_plugin(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._channel is not None:
            await self._channel.close()

    async def allocate(
        self, *ids: str, pod: str | None = None, container: str = "main", namespace: str = "default"
    ) -> dp.AllocateResponse:
        """Allocate as the kubelet does while admitting ``pod``: on success the IDs are recorded for its
        ``container``, and PodResources (:meth:`pod_devices`) shows them. Without ``pod`` nothing is
        recorded (an admission the kubelet abandoned)."""
        assert self.stub is not None, "no plugin registered"
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=list(ids))])
        response = await self.stub.Allocate(request, timeout=10)
        if pod is not None:
            self.records.setdefault((namespace, pod), {})[container] = tuple(ids)
        return response

    async def prestart(self, *ids: str) -> dp.PreStartContainerResponse:
        """PreStartContainer, as the kubelet calls it before creating a container holding ``ids``."""
        assert self.stub is not None, "no plugin registered"
        return await self.stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=list(ids)), timeout=10)

    async def pod_devices(self) -> PodDevices:
        """PodResources ``List`` as the plugin reads it: the IDs recorded per pod and container."""
        return {key: dict(containers) for key, containers in self.records.items()}

    async def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        """GetPreferredAllocation for one container, as the kubelet asks before Allocate."""
        assert self.stub is not None, "no plugin registered"
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
                )
            ]
        )
        response = await self.stub.GetPreferredAllocation(request, timeout=10)
        (container,) = response.container_responses
        return list(container.deviceIDs)

    async def next_devices(self, timeout: float = 5.0) -> list[dp.Device]:
        response = await asyncio.wait_for(self.lists.get(), timeout)
        return list(response.devices)

    async def next_list(self, timeout: float = 5.0) -> Devices:
        return [(d.ID, d.health) for d in await self.next_devices(timeout)]

    async def stop(self) -> None:
        """Stop like a restarting kubelet: close everything and delete every socket in the directory."""
        await self._close_plugin()
        if self._server is not None:
            await self._server.stop(0)
        for sock in self.dir.glob("*.sock"):
            sock.unlink()
