"""The generated code is fresh, field numbers match the reference, and the recorded kubelet's
messages (reference/kubelet-captures/run2) parse into our protos and through our PodResources client."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from device_plugin.kubelet.kubelet_api import devices_of, list_pod_devices
from protos import generate
from protos.gen.deviceplugin.v1beta1 import api_pb2 as dp
from protos.gen.podresources.v1 import api_pb2 as pr
from protos.gen.podresources.v1 import api_pb2_grpc as pr_grpc
from tests.device_plugin.harness import run
from vgpu.names import RESOURCE_VGPU

# Copied from reference/kubelet-captures/run2 (kubelet v1.36.2 with a probe plugin).
CAPTURES = Path(__file__).parent / "captures"


def capture(name: str) -> Path:
    return CAPTURES / name


def test_generated_code_is_fresh() -> None:
    assert generate.stale(generate.render()) == []


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        (dp.RegisterRequest, "resource_name", 3),
        (dp.RegisterRequest, "options", 4),
        (dp.DevicePluginOptions, "get_preferred_allocation_available", 2),
        (dp.Device, "ID", 1),
        (dp.Device, "topology", 3),
        (dp.ContainerPreferredAllocationRequest, "must_include_deviceIDs", 2),
        (dp.ContainerPreferredAllocationRequest, "allocation_size", 3),
        (dp.ContainerAllocateRequest, "devices_ids", 1),
        (dp.ContainerAllocateResponse, "annotations", 4),
        (dp.ContainerAllocateResponse, "cdi_devices", 5),
        (dp.DeviceSpec, "permissions", 3),
        (pr.ContainerResources, "dynamic_resources", 5),
        (pr.ClaimResource, "share_id", 5),
        (pr.DynamicResource, "claim_name", 2),
        (pr.ContainerDevices, "topology", 3),
    ],
)
def test_field_numbers_match_the_reference(message: type, field: str, number: int) -> None:
    assert message.DESCRIPTOR.fields_by_name[field].number == number  # type: ignore[attr-defined]


def test_service_paths_are_the_kubelets() -> None:
    assert dp.DESCRIPTOR.services_by_name["DevicePlugin"].full_name == "v1beta1.DevicePlugin"
    assert dp.DESCRIPTOR.services_by_name["Registration"].methods_by_name["Register"].full_name == (
        "v1beta1.Registration.Register"
    )
    assert pr.DESCRIPTOR.services_by_name["PodResourcesLister"].full_name == "v1.PodResourcesLister"


def test_every_recorded_device_plugin_message_parses() -> None:
    kinds = {
        "register.ok": dp.RegisterRequest,
        "GetPreferredAllocation": dp.PreferredAllocationRequest,
        "Allocate": dp.AllocateRequest,
        "PreStartContainer": dp.PreStartContainerRequest,
    }
    seen = set()
    for line in capture("dp-events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] in kinds:
            json_format.ParseDict(event["request"], kinds[event["event"]]())  # strict: unknown fields fail
            seen.add(event["event"])
        if event["event"] == "Allocate":
            json_format.ParseDict(event["response"], dp.AllocateResponse())
            assert len(event["request"]["container_requests"]) == 1  # one container per RPC
        if event["event"] == "ListAndWatch.send":
            json_format.ParseDict(event["response"], dp.ListAndWatchResponse())
    assert seen == set(kinds)


def _recorded_list() -> pr.ListPodResourcesResponse:
    doc = json.loads(capture("podresources-2pods.json").read_text().replace("example.com/vgpu", RESOURCE_VGPU))
    return json_format.ParseDict(doc["List"], pr.ListPodResourcesResponse())


def test_devices_are_merged_per_container_from_the_recorded_list() -> None:
    assert devices_of(_recorded_list()) == {
        ("default", "vgpu-pod-1"): {"main": ("vgpu-3",)},
        ("default", "vgpu-pod-2"): {"main": ("vgpu-1", "vgpu-2")},  # two entries in the answer
    }


class _Lister(pr_grpc.PodResourcesListerServicer):
    async def List(self, request: pr.ListPodResourcesRequest, context: object) -> pr.ListPodResourcesResponse:
        return _recorded_list()


def test_podresources_client_over_a_unix_socket(tmp_path: Path) -> None:
    async def scenario() -> None:
        server = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(_Lister(), server)
        server.add_insecure_port(f"unix://{tmp_path / 'kubelet.sock'}")
        await server.start()
        try:
            got = await list_pod_devices(tmp_path / "kubelet.sock")
        finally:
            await server.stop(0)
        assert got[("default", "vgpu-pod-2")] == {"main": ("vgpu-1", "vgpu-2")}

    run(scenario())
