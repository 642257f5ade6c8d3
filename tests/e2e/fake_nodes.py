"""Fake GPUs: the device plugin's fake-NVML file, and GPU Nodes that have no kubelet.

WHY: one real kubelet node proves the device-plugin path; pool, model and capacity scenarios
need several nodes with different GPUs, which cost nothing as plain Node objects. Such a node is
what the extender would see from a real one: Ready, an allocatable ``tensor-fusion.ai/vgpu``
count, the device plugin's pool/model labels, and the inventory annotation encoded with the shared
contract and written with the device plugin's own service-account identity (the admission policy
lets no one else write it). Pods bound to such a node are scheduled but never run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes.client import ApiClient, CoreV1Api

from device_plugin.cluster.publisher import node_labels
from device_plugin.enforcement.delivery import NodeSetup
from vgpu import catalog
from vgpu.contract import inventory
from vgpu.names import RESOURCE_VGPU, DeviceDelivery, EnforcementBackend, EnvvarGuard
from vgpu.node_resources import node_capacity

from .kube import untaint_not_ready

MIB = 1024 * 1024
SLICES_PER_GPU = 16
FAKE_SETUP = NodeSetup(EnvvarGuard.ON, DeviceDelivery.VOLUME_MOUNTS)  # what a plugin on a well-set node publishes


@dataclass(frozen=True, slots=True)
class FakeGpu:
    """One fake GPU, by NVML product name (TFLOPS and VRAM come from the catalog)."""

    uuid: str
    index: int
    name: str = "NVIDIA A100-SXM4-80GB"

    @property
    def model(self) -> catalog.GpuModel:
        found = catalog.builtin().lookup(self.name)
        if found is None:
            raise ValueError(f"{self.name!r} is not in the GPU catalog")
        return found


def gpus(prefix: str, count: int, name: str = "NVIDIA A100-SXM4-80GB") -> tuple[FakeGpu, ...]:
    """``count`` GPUs with recognisable UUIDs: GPU-<prefix>-0000…0, …1, …"""
    return tuple(FakeGpu(f"GPU-{prefix}-{i:012d}", i, name) for i in range(count))


def fake_nvml_yaml(
    fake: tuple[FakeGpu, ...], faults: Mapping[str, str], usage: Sequence[Mapping[str, Any]] = ()
) -> str:
    """The device plugin's fake-NVML file (device_plugin/gpus/fake_probe.py format); ``faults`` maps a
    GPU's UUID to the text its health check fails with; ``usage`` scripts pods' processes."""
    doc = {
        "gpus": [
            {"uuid": g.uuid, "index": g.index, "name": g.name, "memoryMiB": g.model.memory_mib, "numa": 0}
            | ({"fail": faults[g.uuid]} if g.uuid in faults else {})
            for g in fake
        ],
        "usage": list(usage),
    }
    return yaml.safe_dump(doc, sort_keys=False)


def add_fake_node(
    admin: ApiClient,
    plugin: ApiClient,
    name: str,
    fake: tuple[FakeGpu, ...],
    pool: str,
    backend: EnforcementBackend = EnforcementBackend.HAMI_CORE,
) -> None:
    inv = fake_inventory(name, fake, pool, backend)
    labels = {"kubernetes.io/hostname": name, **node_labels(inv, FAKE_SETUP)}
    CoreV1Api(admin).create_node({"metadata": {"name": name, "labels": labels}})
    publish_gpu_node(admin, plugin, inv)


def fake_inventory(
    name: str, fake: tuple[FakeGpu, ...], pool: str, backend: EnforcementBackend = EnforcementBackend.HAMI_CORE
) -> inventory.NodeInventory:
    """The inventory the device plugin would publish for ``fake`` on node ``name``, heartbeat now."""
    return inventory.NodeInventory(
        node=name,
        pool=pool,
        slices_per_gpu=SLICES_PER_GPU,
        backend=backend,
        heartbeat=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        gpus=tuple(
            inventory.GpuInfo(
                uuid=g.uuid,
                index=g.index,
                model=g.model.key,
                tflops=g.model.tflops_milli,
                vram=g.model.memory_mib * MIB,
            )
            for g in fake
        ),
    )


def publish_gpu_node(
    admin: ApiClient, plugin: ApiClient, inv: inventory.NodeInventory, machine: Mapping[str, str] | None = None
) -> None:
    """What a GPU node's kubelet and device plugin write once the Node exists: the kubelet (played by
    ``admin``) reports it Ready with ``machine``'s cpu/memory/pods and the plugin's vGPU slots, and the
    node-lifecycle controller lifts the not-ready taint; the device plugin (its own identity, ``plugin``)
    publishes its labels and the inventory in one patch, then the TFLOPS and VRAM node resources."""
    name, now = inv.node, inv.heartbeat
    core = CoreV1Api(admin)
    slots = str(len(inv.gpus) * inv.slices_per_gpu)
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110", **(machine or {}), RESOURCE_VGPU: slots}
    ready = {"type": "Ready", "status": "True", "reason": "FakeGpuNode", "lastHeartbeatTime": now,
             "lastTransitionTime": now}  # fmt: skip
    core.patch_node_status(name, {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}})
    untaint_not_ready(core, name)  # the API server adds it at create; the node is Ready
    published = {"labels": node_labels(inv, FAKE_SETUP), "annotations": {inventory.KEY: inventory.encode(inv)}}
    CoreV1Api(plugin).patch_node(name, {"metadata": published})
    shares = node_capacity(inv)  # what the device plugin advertises, with its identity (RBAC: nodes/status)
    CoreV1Api(plugin).patch_node_status(name, {"status": {"capacity": shares, "allocatable": shares}})
