"""Calls the plugin makes to the kubelet: Register on ``kubelet.sock`` and PodResources ``List``.

Registration must happen while our own server is already serving, because the kubelet dials us
back (GetDevicePluginOptions, then ListAndWatch) before Register returns (reference §4). PodResources
tells, after Allocate, which pod and container really got which device IDs — the only
authoritative pod identity the kubelet offers — and keeps our hand-off receipts true.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

import grpc

from protos.gen.deviceplugin.v1beta1 import api_pb2 as dp
from protos.gen.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from protos.gen.podresources.v1 import api_pb2 as pr
from protos.gen.podresources.v1 import api_pb2_grpc as pr_grpc
from vgpu.names import RESOURCE_VGPU

API_VERSION: Final = "v1beta1"
KUBELET_SOCKET: Final = "kubelet.sock"
DEFAULT_PODRESOURCES_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"

# (namespace, pod) → container → device IDs of our resource, as the kubelet recorded them.
PodDevices = Mapping[tuple[str, str], Mapping[str, tuple[str, ...]]]


def unix_target(path: Path) -> str:
    return f"unix://{path.resolve()}"


async def register(
    plugin_dir: Path, endpoint: str, options: dp.DevicePluginOptions, *, timeout_s: float = 10.0
) -> None:
    """Register ``endpoint`` (our socket's file name) for :data:`RESOURCE_VGPU`; raises grpc.aio.AioRpcError."""
    async with grpc.aio.insecure_channel(unix_target(plugin_dir / KUBELET_SOCKET)) as channel:
        stub = dp_grpc.RegistrationStub(channel)
        request = dp.RegisterRequest(
            version=API_VERSION, endpoint=endpoint, resource_name=RESOURCE_VGPU, options=options
        )
        await stub.Register(request, timeout=timeout_s, wait_for_ready=True)


async def list_pod_devices(socket: Path, *, timeout_s: float = 5.0) -> PodDevices:
    """Device IDs of :data:`RESOURCE_VGPU` per pod and container, from PodResources v1 ``List``."""
    async with grpc.aio.insecure_channel(unix_target(socket)) as channel:
        stub = pr_grpc.PodResourcesListerStub(channel)
        response = await stub.List(pr.ListPodResourcesRequest(), timeout=timeout_s)
    return devices_of(response)


def devices_of(response: pr.ListPodResourcesResponse) -> PodDevices:
    """Our resource's IDs per container; the kubelet may split one container's IDs over entries."""
    found: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            ids = tuple(i for d in container.devices if d.resource_name == RESOURCE_VGPU for i in d.device_ids)
            if ids:
                found.setdefault((pod.namespace, pod.name), {})[container.name] = ids
    return found
