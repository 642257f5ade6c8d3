"""MIG on the kubelet node (issue 18): one of its GPUs is put in MIG mode (7 × 1g.5gb) as an operator
does — the device plugin stopped, the GPU reconfigured, the plugin started again — beside three plain
A100s. Pods asking ``gpu-model: 1g.5gb`` run, each with a MIG instance of its own in its env; an eighth
waits Pending; a fractional pod runs on a plain GPU; the MIG GPU's own UUID is handed to no container.
Afterwards the GPU leaves MIG mode again the same way, so later scenarios find the node as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api

from vgpu.contract import allocation
from vgpu.names import Annotation

from .cluster import REAL_NODE, Cluster, inventory_of
from .fake_nodes import fake_nvml_yaml
from .kube import events_for, eventually, wait_running
from .pods import created_gpus, gpu_pod

UNITS = 7
UNIT_MIB = 4864  # 1g.5gb on an A100-40GB


def unit_uuid(i: int) -> str:
    return f"MIG-e2e{i}0000-0000-0000-0000-000000000000"


def held_gpus(core: CoreV1Api) -> set[str]:
    """GPU UUIDs the live pods of the node hold allocations on."""
    held = set()
    for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={REAL_NODE}").items:
        text = (p.metadata.annotations or {}).get(allocation.KEY)
        if text and p.status.phase not in ("Succeeded", "Failed"):
            held |= {g.uuid for g in allocation.decode(text).gpus}
    return held


@pytest.fixture
def mig_gpu(cluster: Cluster, core: CoreV1Api) -> Iterator[str]:
    """A GPU of the node no pod holds, in MIG mode for the test; back to a plain A100 afterwards."""
    free = [g for g in cluster.gpus if g.uuid not in held_gpus(core)]
    assert free, "every GPU of the kubelet node holds pods"
    gpu = free[-1]
    doc = yaml.safe_load(fake_nvml_yaml(cluster.gpus, {}))
    entry = next(e for e in doc["gpus"] if e["uuid"] == gpu.uuid)
    entry |= {"name": "NVIDIA A100-SXM4-40GB", "memoryMiB": 40960, "mig": True, "migSlices": 7}
    entry["migDevices"] = [{"uuid": unit_uuid(i), "slices": 1, "memoryMiB": UNIT_MIB} for i in range(UNITS)]
    cluster.restart_device_plugin(lambda inv: sum(g.parent == gpu.uuid for g in inv.gpus) == UNITS, yaml.safe_dump(doc))
    try:
        yield gpu.uuid
    finally:
        for ns in [n.metadata.name for n in core.list_namespace().items if n.metadata.name.startswith("e2e-mig")]:
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            eventually(f"pods of {ns} gone", lambda ns=ns: not core.list_namespaced_pod(ns).items, timeout=120)
        cluster.restart_device_plugin(lambda inv: not any(g.mig for g in inv.gpus), fake_nvml_yaml(cluster.gpus, {}))


def pod(name: str, **share: str) -> dict[str, Any]:
    spec = gpu_pod(name, {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "4Gi", **share})
    spec["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    return spec


@pytest.mark.timeout(400)
def test_pods_naming_a_mig_profile_get_distinct_instances_and_the_parent_uuid_is_never_handed_out(
    cluster: Cluster, core: CoreV1Api, mig_gpu: str
) -> None:
    ns = cluster.namespace("e2e-mig")
    inv = inventory_of(core)
    units = {g.uuid for g in inv.gpus if g.parent == mig_gpu}
    assert {g.model for g in inv.gpus if g.uuid in units} == {"A100-SXM4-40GB MIG 1g.5gb"}
    names = [f"mig-{i}" for i in range(UNITS)]
    for name in names:
        core.create_namespaced_pod(ns, pod(name, **{Annotation.GPU_MODEL: "1g.5gb"}))
    core.create_namespaced_pod(ns, pod("fractional"))
    running = {n: wait_running(core, ns, n, timeout=120) for n in [*names, "fractional"]}
    seen = {n: created_gpus(cluster.node, p, "main") for n, p in running.items()}
    print(
        f"{UNITS} MIG pods on {len({seen[n] for n in names})} distinct instances; fractional pod on {seen['fractional']}"
    )
    assert {seen[n] for n in names} == units  # seven pods, seven instances, each its own
    assert seen["fractional"] not in units | {mig_gpu}  # a plain GPU
    assert mig_gpu not in seen.values()
    core.create_namespaced_pod(ns, pod("mig-late", **{Annotation.GPU_MODEL: "a100-1g.5gb"}))
    lines = eventually(
        "the eighth MIG pod refused a place",
        lambda: [e for e in events_for(core, ns, "mig-late") if e.startswith("FailedScheduling")] or None,
        timeout=60,
    )
    assert not core.read_namespaced_pod("mig-late", ns).spec.node_name, lines
