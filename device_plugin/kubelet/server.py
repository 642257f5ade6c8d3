"""The kubelet-facing gRPC servicer: thin handlers over the device board and the allocator.

ListAndWatch streams the full slice list at once and after every health change and never returns
(the kubelet reads the end of the stream as a disconnect); it is an async generator woken by the
board, the shape of grpc's aio health ``Watch``. Allocate turns an :class:`AllocateError` into a
FAILED_PRECONDITION status whose text the kubelet puts on the pod (``UnexpectedAdmissionError``); its
answer names the container's CDI device too, where the node writes them (:mod:`device_plugin.enforcement.cdi`).
PreStartContainer, which the kubelet calls before creating every container, refuses a container
whose devices carry no grant proven its own (:mod:`device_plugin.kubelet.proof`); the kubelet then does not
create it and retries the start with backoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from device_plugin.enforcement.envs import ContainerGrant
from device_plugin.gpus.board import DeviceBoard
from device_plugin.gpus.slices import Slice, preferred
from device_plugin.kubelet.allocator import Allocator
from device_plugin.kubelet.lookup import AllocateError
from device_plugin.metrics import PluginMetrics
from protos.gen.deviceplugin.v1beta1 import api_pb2 as dp
from protos.gen.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

log = logging.getLogger(__name__)
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# PreStartContainer is where a grant is proven before the kubelet creates the container.
OPTIONS = dp.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)
Context = grpc.aio.ServicerContext[Any, Any]


def to_device(s: Slice) -> dp.Device:
    topology = None if s.numa is None else dp.TopologyInfo(nodes=[dp.NUMANode(ID=s.numa)])
    return dp.Device(ID=s.id, health=HEALTHY if s.healthy else UNHEALTHY, topology=topology)


def to_response(grant: ContainerGrant) -> dp.ContainerAllocateResponse:
    return dp.ContainerAllocateResponse(
        envs=dict(grant.envs),
        mounts=[
            dp.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in grant.mounts
        ],
        cdi_devices=[dp.CDIDevice(name=name) for name in grant.cdi_devices],
    )


class DevicePluginServicer(dp_grpc.DevicePluginServicer):
    def __init__(self, board: DeviceBoard, allocator: Allocator, metrics: PluginMetrics) -> None:
        self._board, self._allocator, self._metrics = board, allocator, metrics

    async def GetDevicePluginOptions(
        self,
        request: dp.Empty,  # noqa: ARG002
        context: Context,  # noqa: ARG002
    ) -> dp.DevicePluginOptions:
        return OPTIONS

    async def ListAndWatch(
        self,
        request: dp.Empty,  # noqa: ARG002
        context: Context,  # noqa: ARG002
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        async for current in self._board.changes():
            yield dp.ListAndWatchResponse(devices=[to_device(s) for s in current])

    async def GetPreferredAllocation(
        self,
        request: dp.PreferredAllocationRequest,
        context: Context,  # noqa: ARG002
    ) -> dp.PreferredAllocationResponse:
        responses = []
        for req in request.container_requests:
            size = int(req.allocation_size)
            favour = await self._allocator.preferred_gpus(size)
            ids = preferred(list(req.available_deviceIDs), list(req.must_include_deviceIDs), size, favour)
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return dp.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: dp.AllocateRequest, context: Context) -> dp.AllocateResponse:
        started = time.perf_counter()
        responses = []
        for req in request.container_requests:
            ids = tuple(req.devices_ids)
            try:
                grant = await self._allocator.allocate(ids)
            except AllocateError as exc:
                self._metrics.allocate_seconds.labels("error").observe(time.perf_counter() - started)
                self._metrics.errors.labels("allocate").inc()
                log.warning("Allocate %s refused: %s", list(ids), exc, extra={"devices": list(ids)})
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"tensor-fusion: {exc}")
            responses.append(to_response(grant))
        self._metrics.allocate_seconds.labels("ok").observe(time.perf_counter() - started)
        return dp.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: Context
    ) -> dp.PreStartContainerResponse:
        ids = tuple(request.devices_ids)
        try:
            await self._allocator.verify_start(ids)
        except AllocateError as exc:
            self._metrics.errors.labels("prestart").inc()
            log.warning("PreStartContainer %s refused: %s", list(ids), exc, extra={"devices": list(ids)})
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"tensor-fusion: {exc}")
        return dp.PreStartContainerResponse()
