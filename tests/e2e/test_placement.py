"""Where pods land and what they get: profiles, GPU model and pool, several GPUs, and a full pool.

Besides the real kubelet node (4× A100, default pool) this module adds kubelet-less nodes:
pool ``e2e-models`` with an H100 node and a T4 node, and pool ``e2e-small`` with two L4s.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi

from device_plugin.cluster.receipts import ReceiptFile
from device_plugin.gpus.slices import gpu_of
from vgpu.contract.allocation import decode_handoff
from vgpu.names import (
    CRD_GROUP,
    CRD_VERSION,
    KIND_WORKLOAD_PROFILE,
    PLURAL_GPU_POOL,
    RESOURCE_MILLI_TFLOPS,
    RESOURCE_VGPU,
    Annotation,
)
from vgpu.quantity import parse_bytes, parse_milli

from .cluster import REAL_NODE, Cluster
from .fake_nodes import FakeGpu, gpus
from .kube import api_client, apply, emptied, events_for, eventually, wait_bound, wait_running
from .pods import allocation_of, assert_grant_matches_allocation, created, gpu_pod, hand_over

NAMESPACE = "e2e-placement"
H100 = gpus("h100", 2, "NVIDIA H100 80GB HBM3")
T4 = gpus("t4", 2, "Tesla T4")
L4 = gpus("l4", 2, "NVIDIA L4")  # 48Gi in all: a 40Gi pod fits the node's totals, not a GPU


@pytest.fixture(scope="module")
def ns(cluster: Cluster) -> Iterator[str]:
    cluster.add_fake_node("e2e-h100", H100, pool="e2e-models")
    cluster.add_fake_node("e2e-t4", T4, pool="e2e-models")
    cluster.add_fake_node("e2e-small-0", L4, pool="e2e-small")
    yield cluster.namespace(NAMESPACE)
    emptied(cluster.core, NAMESPACE)


def test_annotation_beats_workload_profile_which_fills_the_rest(cluster: Cluster, core: CoreV1Api, ns: str) -> None:
    profile = {
        "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}",
        "kind": KIND_WORKLOAD_PROFILE,
        "metadata": {"name": "training", "namespace": ns},
        "spec": {
            "resources": {"requests": {"tflops": "5", "vram": "3Gi"}, "limits": {"tflops": "15", "vram": "3Gi"}},
            "qos": "medium",
            "gpuCount": 1,
        },
    }
    apply(cluster.admin, [profile], namespace=ns)
    pod = gpu_pod("profiled", {Annotation.WORKLOAD_PROFILE: "training", Annotation.TFLOPS_REQUEST: "7"})
    core.create_namespaced_pod(ns, pod)
    running = wait_running(core, ns, "profiled")
    grant = allocation_of(running).gpus[0]
    assert grant.tflops_request == parse_milli("7"), "the pod's own annotation wins"
    assert grant.tflops_limit == parse_milli("15"), "the profile fills what the pod left out"
    assert grant.vram_request == grant.vram_limit == parse_bytes("3Gi")
    assert running.spec.node_name == REAL_NODE
    assert_grant_matches_allocation(
        created(cluster.node, running, "main"), allocation_of(running), sm_percent=5
    )  # 15 of 312 TFLOPS, rounded up


@pytest.mark.parametrize(("model", "node", "fleet"), [("H100", "e2e-h100", H100), ("T4", "e2e-t4", T4)])
def test_gpu_model_and_pool_pick_the_node(
    core: CoreV1Api, ns: str, model: str, node: str, fleet: tuple[FakeGpu, ...]
) -> None:
    name = f"wants-{model.lower()}"
    annotations = {
        Annotation.GPUPOOL: "e2e-models",
        Annotation.GPU_MODEL: model,
        Annotation.TFLOPS_REQUEST: "10",
        Annotation.VRAM_REQUEST: "2Gi",
    }
    core.create_namespaced_pod(ns, gpu_pod(name, annotations))
    bound = wait_bound(core, ns, name)
    assert bound.spec.node_name == node
    alloc = allocation_of(bound)
    assert alloc.pool == "e2e-models" and alloc.node == node
    assert {g.uuid for g in alloc.gpus} <= {g.uuid for g in fleet}


def test_gpu_count_two_gets_two_distinct_gpus_in_its_env(cluster: Cluster, core: CoreV1Api, ns: str) -> None:
    annotations = {Annotation.GPU_COUNT: "2", Annotation.TFLOPS_REQUEST: "20", Annotation.VRAM_REQUEST: "4Gi"}
    core.create_namespaced_pod(ns, gpu_pod("two-gpus", annotations))
    running = wait_running(core, ns, "two-gpus")
    alloc = allocation_of(running)
    assert len({g.uuid for g in alloc.gpus}) == 2
    assert running.spec.containers[0].resources.limits[RESOURCE_VGPU] == "2"
    assert_grant_matches_allocation(
        created(cluster.node, running, "main"), alloc, sm_percent=7
    )  # 20 of 312 TFLOPS on each, rounded up


def test_exhausted_pool_leaves_the_pod_pending_with_our_reason(core: CoreV1Api, ns: str) -> None:
    annotations = {Annotation.GPUPOOL: "e2e-small", Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "40Gi"}
    core.create_namespaced_pod(ns, gpu_pod("too-big", annotations))

    def explained() -> list[str] | None:
        lines = [e for e in events_for(core, ns, "too-big") if "vram" in e.lower()]
        return lines or None

    lines = eventually("an event explaining the missing VRAM", explained, timeout=60)
    assert any("e2e-small-0" in line or "GPU-l4" in line for line in lines), lines
    pod = core.read_namespaced_pod("too-big", ns)
    assert pod.status.phase == "Pending" and not pod.spec.node_name


def test_gpu_indices_pin_the_pod_to_those_gpus_of_its_node(cluster: Cluster, core: CoreV1Api, ns: str) -> None:
    """tensor-fusion.ai/gpu-indices 3: the pod runs on the kubelet node's GPU 3 (the one binpack would choose
    last) and its container gets exactly that GPU."""
    pod = gpu_pod(
        "pinned", {Annotation.GPU_INDICES: "3", Annotation.TFLOPS_REQUEST: "5", Annotation.VRAM_REQUEST: "1Gi"}
    )
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    core.create_namespaced_pod(ns, pod)
    running = wait_running(core, ns, "pinned")
    (grant,) = allocation_of(running).gpus
    third = next(g for g in cluster.gpus if g.index == 3)
    assert (grant.index, grant.uuid) == (3, third.uuid)
    assert created(cluster.node, running, "main")["gpus"] == [third.uuid]


def test_container_gpu_count_gives_each_container_its_own_gpus_in_the_kubelets_record(
    cluster: Cluster, core: CoreV1Api, ns: str
) -> None:
    """tensor-fusion.ai/container-gpu-count {"pre": 1, "inference": 2} on the kubelet node: the pod is granted 3
    GPUs, the kubelet allocates each container its own count (1 and 2 device IDs, on its own GPUs), and the
    runtime creates each container with exactly its GPUs and their limits: distinct, together the grant."""
    split = {
        Annotation.CONTAINER_GPU_COUNT: '{"pre": 1, "inference": 2}',
        Annotation.TFLOPS_REQUEST: "10",
        Annotation.TFLOPS_LIMIT: "20",
        Annotation.VRAM_REQUEST: "2Gi",
    }
    pod = gpu_pod("split", split, containers=("pre", "inference"))
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    core.create_namespaced_pod(ns, pod)
    running = wait_running(core, ns, "split")
    alloc = allocation_of(running)
    assert len({g.uuid for g in alloc.gpus}) == 3 and alloc.container_gpus is not None
    assert [(c, len(uuids)) for c, uuids in alloc.container_gpus] == [("pre", 1), ("inference", 2)]
    limits = {c.name: c.resources.limits[RESOURCE_VGPU] for c in running.spec.containers}
    assert limits == {"pre": "1", "inference": "2"}
    seen = {}
    for container, uuids in alloc.container_gpus:
        record = created(cluster.node, running, container)
        own = replace(alloc, gpus=alloc.gpus_of(container), container_gpus=None)
        assert_grant_matches_allocation(record, own, sm_percent=7)  # 20 of 312 TFLOPS, rounded up
        seen[container] = tuple(record["gpus"])
        assert seen[container] == uuids
    assert set(seen["pre"]).isdisjoint(seen["inference"])
    assert sorted(seen["pre"] + seen["inference"]) == sorted(g.uuid for g in alloc.gpus)

    def receipt() -> dict[str, tuple[str, ...]] | None:
        receipts = ReceiptFile(cluster.root / "handoff" / "receipts.json").load()
        text = receipts.get(running.metadata.uid)
        return None if text is None else dict(decode_handoff(text).devices)

    devices = eventually("the plugin's hand-off receipt", receipt, timeout=30)
    # The kubelet's device IDs: 1 for pre, 2 for inference, each on the container's own GPUs (the plugin's
    # preferred allocation steers it there).
    assert {c: tuple(sorted(gpu_of(d) for d in ids)) for c, ids in devices.items()} == {
        c: tuple(sorted(uuids)) for c, uuids in alloc.container_gpus
    }


def test_a_profiles_preferred_node_affinity_picks_among_nodes_the_gpu_policy_scores_alike(
    cluster: Cluster, core: CoreV1Api, ns: str
) -> None:
    """Two empty, identical A100 nodes score alike for the GPU policy; the profile prefers the one labelled
    disk=ssd. The webhook adds that preferred term to each pod's spec, and kube-scheduler's NodeAffinity score
    breaks the tie: five pods in turn (each handed over, so that its node's gate is open again, and deleted once
    bound) all land there (by chance: 1 in 32)."""
    plugin = CoreV1Api(api_client(str(cluster.kubeconfigs["device-plugin"])))
    for name in ("e2e-prefer-a", "e2e-prefer-b"):
        cluster.add_fake_node(name, gpus(name, 1), pool="e2e-prefer")
    core.patch_node("e2e-prefer-b", {"metadata": {"labels": {"e2e.tensor-fusion.ai/disk": "ssd"}}})
    term = {"weight": 100, "preference": {"matchExpressions": [
        {"key": "e2e.tensor-fusion.ai/disk", "operator": "In", "values": ["ssd"]}]}}  # fmt: skip
    profile = {
        "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}",
        "kind": KIND_WORKLOAD_PROFILE,
        "metadata": {"name": "prefers-ssd", "namespace": ns},
        "spec": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}},
    }
    apply(cluster.admin, [profile], namespace=ns)
    try:
        landed = []
        for i in range(5):
            share = {Annotation.WORKLOAD_PROFILE: "prefers-ssd", Annotation.GPUPOOL: "e2e-prefer",
                     Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "1Gi"}  # fmt: skip
            core.create_namespaced_pod(ns, gpu_pod(f"prefers-{i}", share))
            pod = wait_bound(core, ns, f"prefers-{i}")
            assert pod.spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution[0].weight == 100
            landed.append(pod.spec.node_name)
            hand_over(plugin, pod)  # a kubelet-less node: the receipt the plugin would write opens its gate
            core.delete_namespaced_pod(f"prefers-{i}", ns, grace_period_seconds=0)
            eventually(f"prefers-{i} gone", lambda i=i: not [p for p in core.list_namespaced_pod(ns).items
                                                            if p.metadata.name == f"prefers-{i}"])  # fmt: skip
        print(f"a profile preferring disk=ssd: 5 pods landed on {landed}")
        assert landed == ["e2e-prefer-b"] * 5
    finally:
        for name in ("e2e-prefer-a", "e2e-prefer-b"):
            core.delete_node(name)


def test_filter_decides_alone_unless_the_pod_asks_kube_scheduler_to_weigh_nodes(
    cluster: Cluster, core: CoreV1Api, ns: str
) -> None:
    """Two identical one-A100 nodes, pool e2e-decide. The first binpack pod finds them alike: filter passes both
    and kube-scheduler's own scores choose. The next has one best node (the fuller): filter passes it alone, and
    kube-scheduler binds it there without scoring (no prioritize call). A pod that asks kube-scheduler to weigh
    nodes for it (a preferred node affinity, here for the other node) gets both scored, and still lands where
    the GPU policy puts it: one extender point outweighs any in-tree score."""
    plugin = CoreV1Api(api_client(str(cluster.kubeconfigs["device-plugin"])))
    for name in ("e2e-decide-a", "e2e-decide-b"):
        cluster.add_fake_node(name, gpus(name, 1), pool="e2e-decide")
    passes = {k: f'tf_extender_filter_passes_total{{passed="{k}"}}' for k in ("one", "tie", "every")}
    prioritized = 'tf_extender_request_seconds_count{verb="prioritize"}'

    def counts() -> dict[str, float]:
        return {k: cluster.extender_metric(v) for k, v in {**passes, "prioritize": prioritized}.items()}

    def bound(name: str, affinity: dict[str, Any] | None = None) -> tuple[str, dict[str, float]]:
        share = {Annotation.GPUPOOL: "e2e-decide", Annotation.PLACEMENT_POLICY: "binpack",
                 Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "1Gi"}  # fmt: skip
        before = counts()
        pod = gpu_pod(name, share)
        if affinity is not None:
            pod["spec"]["affinity"] = affinity
        core.create_namespaced_pod(ns, pod)
        placed = wait_bound(core, ns, name)
        hand_over(plugin, placed)  # a kubelet-less node: the receipt the plugin would write opens its gate
        return placed.spec.node_name, {k: v - before[k] for k, v in counts().items()}

    try:
        first, changed = bound("decide-0")
        assert changed == {"one": 0, "tie": 1, "every": 0, "prioritize": 1}
        other = ({"e2e-decide-a", "e2e-decide-b"} - {first}).pop()
        assert bound("decide-1") == (first, {"one": 1, "tie": 0, "every": 0, "prioritize": 0})
        core.patch_node(other, {"metadata": {"labels": {"e2e.tensor-fusion.ai/decide": "other"}}})
        term = {"weight": 100, "preference": {"matchExpressions": [
            {"key": "e2e.tensor-fusion.ai/decide", "operator": "In", "values": ["other"]}]}}  # fmt: skip
        weighed = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}
        assert bound("decide-2", weighed) == (first, {"one": 0, "tie": 0, "every": 1, "prioritize": 1})
    finally:
        for name in ("e2e-decide-a", "e2e-decide-b"):
            core.delete_node(name)


def test_compute_percent_is_half_of_an_a100_there_and_half_of_an_l4_there(
    cluster: Cluster, core: CoreV1Api, ns: str
) -> None:
    """compute-percent-request 50 (TensorFusion v2): the same pod spec granted 156 TFLOPS on the kubelet node's
    A100 (whose container runs capped at 50 % of its SMs) and 60.5 on the L4 node of pool e2e-small; admission
    charges each the share of the largest GPU its pool lists, which is what its resource requests (quota,
    kube-scheduler's node totals) count."""
    plugin = CoreV1Api(api_client(str(cluster.kubeconfigs["device-plugin"])))
    pools = CustomObjectsApi(cluster.admin)

    def listed(pool: str) -> dict[str, str] | None:
        status = pools.get_cluster_custom_object(CRD_GROUP, CRD_VERSION, PLURAL_GPU_POOL, pool).get("status") or {}
        sizes: dict[str, str] | None = status.get("gpuTflops") or None
        return sizes

    assert list(eventually("pool e2e-small's GPU sizes", lambda: listed("e2e-small")).values()) == ["121"]  # L4
    default = eventually("the default pool's GPU sizes", lambda: listed("default-pool"))
    assert "312" in default.values()  # the kubelet node's A100s
    largest = max(parse_milli(t) for t in default.values())  # other modules may add bigger GPUs to the pool
    half = {Annotation.COMPUTE_PERCENT_REQUEST: "50", Annotation.VRAM_REQUEST: "2Gi"}
    a100 = gpu_pod("half-a100", half)
    a100["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    core.create_namespaced_pod(ns, a100)
    core.create_namespaced_pod(ns, gpu_pod("half-l4", {**half, Annotation.GPUPOOL: "e2e-small"}))
    running = wait_running(core, ns, "half-a100")
    on_l4 = wait_bound(core, ns, "half-l4")
    hand_over(plugin, on_l4)  # a kubelet-less node: the receipt the plugin would write opens its gate
    (a100_grant,) = allocation_of(running).gpus
    (l4_grant,) = allocation_of(on_l4).gpus
    assert (a100_grant.tflops_request, a100_grant.tflops_limit, a100_grant.gpu_tflops) == (156_000, 156_000, 312_000)
    assert (l4_grant.tflops_request, l4_grant.tflops_limit, l4_grant.gpu_tflops) == (60_500, 60_500, 121_000)
    assert on_l4.spec.node_name == "e2e-small-0"
    # the resource counts milli-TFLOPS, a plain number (the API server writes 156000 as 156k)
    charged = {p.metadata.name: parse_milli(p.spec.containers[0].resources.requests[RESOURCE_MILLI_TFLOPS]) // 1000
               for p in (running, on_l4)}  # fmt: skip
    assert charged == {"half-a100": -(-largest // 2), "half-l4": l4_grant.tflops_request}
    assert_grant_matches_allocation(created(cluster.node, running, "main"), allocation_of(running), sm_percent=50)
    for name in ("half-a100", "half-l4"):
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
