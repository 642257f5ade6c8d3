"""The lean bind on the real API server (v1.36.2): the Binding grants, the claims Lease arbitrates, only the
extender may grant through a Binding, and pods bound by the earlier protocol keep counting.

On a kubelet-less node with one A100 (80Gi) in a pool of its own:
- a pod bound the earlier way (the allocation patched on the pod with the extender's identity, then a
  Binding without it, then the device plugin's receipt) holds 60Gi;
- through the cluster's extender, a pod asking for 30Gi is refused (it no longer fits beside the old grant),
  one asking for 10Gi is bound in one write with its allocation, and its claim is on the node's Lease;
- a cluster admin's Binding carrying an allocation is refused by the binding-contract policy.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from kubernetes.client import ApiException, CoordinationV1Api, CoreV1Api

from scheduler_extender.claim_board import lease_name
from scheduler_extender.objects import allocated_node_label
from tf_shell.kube.client import api_client
from vgpu.contract import allocation
from vgpu.contract import claims as claims_contract
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.names import LABEL_ALLOCATED_NODE, Annotation, Qos

from . import deploy
from .cluster import Cluster
from .extenders import call, knowing
from .fake_nodes import gpus
from .kube import eventually
from .pods import hand_over, parked_gpu_pod

POOL = "e2e-lean"
NODE = "e2e-lean-0"
GI = 1024**3


def share(vram: str) -> dict[Annotation | str, str]:
    return {Annotation.TFLOPS_REQUEST: "50", Annotation.VRAM_REQUEST: vram, Annotation.GPUPOOL: POOL}


def bound_the_earlier_way(cluster: Cluster, namespace: str, pod: Any) -> str:
    """What a bind of the earlier protocol wrote: the allocation and label (extender's identity), then a Binding
    without them, then the receipt (device plugin's identity). Returns the allocation's text."""
    gpu = gpus(NODE, 1)[0]
    grant = GpuGrant(uuid=gpu.uuid, index=0, tflops_request=100_000, tflops_limit=100_000, vram_request=60 * GI,
                     vram_limit=60 * GI, gpu_tflops=gpu.model.tflops_milli)  # fmt: skip
    at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    alloc = PodAllocation(pod_uid=pod.metadata.uid, node=NODE, pool=POOL, qos=Qos.MEDIUM, containers=("main",),
                          gpus=(grant,), bound_at=at)  # fmt: skip
    text = allocation.encode(alloc)
    extender = CoreV1Api(api_client(str(cluster.kubeconfigs["extender"])))
    patch = {"metadata": {"annotations": {allocation.KEY: text}, "labels": {LABEL_ALLOCATED_NODE: NODE}}}
    extender.patch_namespaced_pod(pod.metadata.name, namespace, patch)
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod.metadata.name},
            "target": {"kind": "Node", "name": NODE}}  # fmt: skip
    extender.create_namespaced_pod_binding(pod.metadata.name, namespace, body, _preload_content=False)
    plugin = CoreV1Api(api_client(str(cluster.kubeconfigs["device-plugin"])))
    hand_over(plugin, cluster.core.read_namespaced_pod(pod.metadata.name, namespace))
    return text


@pytest.mark.timeout(180)
def test_the_binding_grants_beside_a_pod_bound_the_earlier_way(cluster: Cluster, core: CoreV1Api, fresh: str) -> None:
    cluster.add_fake_node(NODE, gpus(NODE, 1), pool=POOL)
    try:
        old = core.create_namespaced_pod(fresh, parked_gpu_pod("old", share("60Gi")))
        old_text = bound_the_earlier_way(cluster, fresh, old)
        uids = {n: core.create_namespaced_pod(fresh, parked_gpu_pod(n, share(v))).metadata.uid
                for n, v in (("big", "30Gi"), ("small", "10Gi"))}  # fmt: skip
        port = cluster.extender_verbs_port
        knowing((port,), fresh, "big", [NODE], POOL)

        def bind(name: str) -> str:
            body = {"PodName": name, "PodNamespace": fresh, "PodUID": uids[name], "Node": NODE}
            reply: dict[str, str] = call(port, f"{deploy.EXTENDER_PREFIX}/bind", body)
            return reply["Error"]

        refused, granted = bind("big"), bind("small")
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(fresh).items}
        claims = claims_contract.decode(
            claims_lease(cluster).metadata.annotations[claims_contract.KEY]  # type: ignore[index]
        )
        print(f"earlier-protocol pod holding 60Gi: a 30Gi pod refused ({refused!r}); a 10Gi pod bound: "
              f"{granted == ''}; claims on {NODE}: {[c.pod for c in claims.claims]}")  # fmt: skip
        assert "no longer fits on e2e-lean-0" in refused and "VRAM" in refused
        assert granted == "" and pods["small"].spec.node_name == NODE and not pods["big"].spec.node_name
        small = allocation.decode(pods["small"].metadata.annotations[allocation.KEY])
        assert (small.node, small.pod_uid, small.gpus[0].vram_request) == (NODE, uids["small"], 10 * GI)
        assert pods["small"].metadata.labels[LABEL_ALLOCATED_NODE] == allocated_node_label(NODE)
        assert [c.pod for c in claims.claims] == [f"{fresh}/small"]
        assert pods["old"].metadata.annotations[allocation.KEY] == old_text and pods["old"].spec.node_name == NODE
        owner = claims_lease(cluster).metadata.owner_references[0]
        assert (owner.kind, owner.name) == ("Node", NODE)
    finally:
        core.delete_node(NODE)
    eventually("the claims Lease deleted with its node", lambda: not leases_of_node(cluster), timeout=60)


def leases_of_node(cluster: Cluster) -> list[Any]:
    leases = CoordinationV1Api(cluster.admin).list_namespaced_lease(deploy.system_namespace()).items
    return [lease for lease in leases if lease.metadata.name == lease_name(NODE)]


def claims_lease(cluster: Cluster) -> Any:
    return CoordinationV1Api(cluster.admin).read_namespaced_lease(lease_name(NODE), deploy.system_namespace())


def test_only_the_extender_may_grant_through_a_binding(core: CoreV1Api, fresh: str) -> None:
    """A Binding's annotations reach the pod without pod admission; the binding-contract policy guards them."""
    core.create_namespaced_pod(fresh, parked_gpu_pod("forged", share("1Gi")))
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "forged", "annotations": {allocation.KEY: "{}"}},
        "target": {"kind": "Node", "name": NODE},
    }
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod_binding("forged", fresh, body, _preload_content=False)
    assert refused.value.status == 403 and "tensor-fusion-binding-contract" in str(refused.value.body)
    assert "only the tensor-fusion scheduler extender may grant" in str(refused.value.body)
    assert not core.read_namespaced_pod("forged", fresh).spec.node_name
