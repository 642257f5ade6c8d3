"""A tenant cannot lift its own limits through its container's environment.

The kubelet builds a container's environment as the device plugin's Allocate ``envs`` followed by the
container's own ``env`` and ``envFrom``, and the runtime keeps the last of two same-named variables. A
tenant with ``edit`` in its namespace (pods and ConfigMaps) asks for 1 TFLOPS / 1 GiB of one GPU and tries,
three ways, to set the variables the plugin sets to values of its own choosing — every GPU of the node,
80 GiB and 100 % for HAMi-core, its own identity, HAMi-core's shared region in ``/tmp`` (where the plugin
cannot rewrite live limits):

1. in the container spec's ``env``: the webhook removes them at admission;
2. through ``envFrom`` a ConfigMap, which no admission check can read;
3. HAMi-core's region alone, through ``envFrom`` with a ``prefix`` that spells its name.

Each container must end with exactly its grant in the effective environment the fake runtime built, as
containerd or CRI-O would: the kubelet's CRI envs, then the edits of the CDI device the plugin named in
its answer. Counted over every variable the plugin sets and every container: 0 containers beyond their
grant, where the CRI envs alone (a runtime without CDI) would have left 2 of them beyond it.

And pods that are not ours: an unlabelled pod, with no GPU resource, placed on the GPU node by name, asks
for every GPU in ``NVIDIA_VISIBLE_DEVICES`` (its spec, and ``envFrom``). The kubelet node's NVIDIA toolkit is
set as docs/security.md asks (the fake runtime decides each container's GPUs by the toolkit's configuration,
as the toolkit does): 0 of them get a GPU, while GPU pods get theirs by volume mounts. With the toolkit's
defaults (the vector the setting closes) the same pods get every GPU, and the device plugin says so within
seconds: the node's ``envvar-guard`` label, a Warning Event on the node, ``tfctl nodes`` (exit 1).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from device_plugin.enforcement.delivery import REASON_UNGUARDED
from device_plugin.enforcement.envs import EnforcementPaths, LiveMount, Target, build
from vgpu.names import LABEL_NODE_ENVVAR_GUARD, Annotation, DeviceDelivery, EnforcementBackend, Env

from .cluster import REAL_NODE, VENV_BIN, Cluster
from .kube import eventually, wait_running
from .pods import IMAGE, allocation_of, assert_grant_matches_allocation, created, gpu_pod

GRANT: dict[Annotation | str, str] = {
    Annotation.TFLOPS_REQUEST: "1",
    Annotation.TFLOPS_LIMIT: "1",
    Annotation.VRAM_REQUEST: "1Gi",
    Annotation.VRAM_LIMIT: "1Gi",
}
SM_PERCENT = 1  # 1 TFLOPS of an A100's 312, rounded up
OWN_REGION = "/tmp/own.cache"


def lifted(all_gpus: str) -> dict[str, str]:
    """What the tenant would like its container to see: every variable the plugin sets, none its grant."""
    every = json.dumps(dict.fromkeys(all_gpus.split(","), 80 * 1024**3), separators=(",", ":"))
    full = json.dumps(dict.fromkeys(all_gpus.split(","), 100), separators=(",", ":"))
    return {
        Env.NVIDIA_VISIBLE_DEVICES: all_gpus,
        f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0": "81920m",
        f"{Env.HAMI_SM_LIMIT}_0": "100",
        Env.HAMI_SM_LIMIT: "100",
        Env.HAMI_UTILIZATION_POLICY: "disable",  # HAMi-core's limiter off
        Env.HAMI_SHARED_REGION: OWN_REGION,
        Env.TF_MEM_LIMIT: every,
        Env.TF_UP_LIMIT: full,
        Env.TF_UP_LIMIT_TFLOPS: full,
        Env.TF_POD_NAME: "someone-else",
        Env.TF_POD_NAMESPACE: "kube-system",
        Env.TF_CONTAINER_NAME: "other",
        Env.TF_POOL_NAME: "premium",
        Env.TF_LIVE_LIMITS: "/tmp/own-limits.json",
    }


def config_map(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


@pytest.fixture
def tenant(cluster: Cluster, fresh: str) -> CoreV1Api:
    """A user with ``edit`` in the scenario's namespace (pods and ConfigMaps) and nothing else."""
    return cluster.grant_tenant(fresh, "edit")


def test_a_tenant_setting_the_plugins_variables_gets_exactly_its_grant_however_it_sets_them(
    cluster: Cluster, fresh: str, tenant: CoreV1Api
) -> None:
    assert cluster.node is not None
    wanted = lifted(",".join(g.uuid for g in cluster.gpus))

    in_spec = gpu_pod("in-spec", GRANT)
    in_spec["spec"]["containers"][0]["env"] = [
        {"name": "HOME", "value": "/home/tenant"},
        *({"name": str(k), "value": v} for k, v in wanted.items()),
    ]
    tenant.create_namespaced_config_map(fresh, config_map("lift", {str(k): v for k, v in wanted.items()}))
    env_from = gpu_pod("env-from", GRANT)
    env_from["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "lift"}}]
    # CUDA_DEVICE_MEMORY_ + SHARED_CACHE: the name appears nowhere in the pod.
    tenant.create_namespaced_config_map(fresh, config_map("region", {"SHARED_CACHE": OWN_REGION}))
    own_region = gpu_pod("own-region", GRANT)
    own_region["spec"]["containers"][0]["envFrom"] = [
        {"prefix": "CUDA_DEVICE_MEMORY_", "configMapRef": {"name": "region"}}
    ]
    for pod in (in_spec, env_from, own_region):
        tenant.create_namespaced_pod(fresh, pod)
    running = [wait_running(cluster.core, fresh, p["metadata"]["name"]) for p in (in_spec, env_from, own_region)]

    # The admission wall: the spec's copies are gone, the tenant's other variables kept.
    assert [(e.name, e.value) for e in running[0].spec.containers[0].env or ()] == [("HOME", "/home/tenant")]

    beyond, beyond_without_cdi, containers = [], [], 0
    for pod in running:
        records = [r for r in cluster.node.creates() if r["podUid"] == pod.metadata.uid]
        for record in records:
            containers += 1
            alloc = allocation_of(pod)
            target = Target(namespace=fresh, pod=pod.metadata.name, container=record["container"])
            paths, live, delivery = EnforcementPaths(), LiveMount("-"), DeviceDelivery.VOLUME_MOUNTS
            grant = build(alloc, target, EnforcementBackend.HAMI_CORE, paths, live, delivery).envs
            assert record["cdiDevices"] == [f"tensor-fusion.ai/vgpu={pod.metadata.uid}_{record['container']}"]
            if any(record["env"].get(k) != v for k, v in grant.items()):
                beyond.append((pod.metadata.name, {k: record["env"].get(k) for k in grant}))
            if any(record["criEnv"].get(k) != v for k, v in grant.items()):
                beyond_without_cdi.append(pod.metadata.name)
        assert_grant_matches_allocation(records[-1], allocation_of(pod), SM_PERCENT)
        assert records[-1]["env"][Env.HAMI_SHARED_REGION] == "/run/tensor-fusion/limits/hami.cache"
    assert (containers, len(beyond)) == (3, 0), beyond
    assert sorted(beyond_without_cdi) == ["env-from", "own-region"], "what a runtime without CDI would start"


def plain_pod(name: str, *, env: dict[str, str] | None = None, env_from: str | None = None) -> dict[str, Any]:
    """A pod that is not ours (no label, no GPU resource) placed on the GPU node by name, as any tenant may."""
    container: dict[str, Any] = {"name": "main", "image": IMAGE}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if env_from:
        container["envFrom"] = [{"configMapRef": {"name": env_from}}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": REAL_NODE, "containers": [container]},
    }


def guard_label(cluster: Cluster) -> str | None:
    return (cluster.core.read_node(REAL_NODE).metadata.labels or {}).get(LABEL_NODE_ENVVAR_GUARD)


@pytest.fixture
def toolkit_defaults(cluster: Cluster) -> Iterator[None]:
    """The kubelet node's toolkit on its defaults for the test; set back as the docs ask after it."""
    assert cluster.node is not None
    cluster.node.set_toolkit(guarded=False)
    try:
        yield
    finally:
        cluster.node.set_toolkit(guarded=True)
        eventually("the plugin seeing the guard on again", lambda: guard_label(cluster) == "on" or None, 30)


def tfctl_nodes(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    assert cluster.cp is not None
    argv = [str(VENV_BIN / "tfctl"), "nodes", "--kubeconfig", str(cluster.cp.kubeconfig("admin"))]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def asking_for_every_gpu(cluster: Cluster, tenant: CoreV1Api, namespace: str, suffix: str) -> list[list[str]]:
    """Two pods that are not ours ask for every GPU (spec env, envFrom); the GPUs each got, as the toolkit reads."""
    every = {str(Env.NVIDIA_VISIBLE_DEVICES): "all"}
    tenant.create_namespaced_config_map(namespace, config_map(f"all-gpus-{suffix}", every))
    pods = [plain_pod(f"by-env-{suffix}", env=every), plain_pod(f"by-env-from-{suffix}", env_from=f"all-gpus-{suffix}")]
    for pod in pods:
        tenant.create_namespaced_pod(namespace, pod)
    running = [wait_running(cluster.core, namespace, p["metadata"]["name"]) for p in pods]
    return [created(cluster.node, pod, "main")["gpus"] for pod in running]


def test_a_pod_that_is_not_ours_gets_no_gpu_by_environment_on_a_node_set_as_shipped(
    cluster: Cluster, fresh: str, tenant: CoreV1Api
) -> None:
    assert cluster.node is not None
    assert guard_label(cluster) == "on"
    shown = tfctl_nodes(cluster)
    (row,) = [line.split() for line in shown.stdout.splitlines() if line.startswith(REAL_NODE)]
    assert row[-3:] == ["shared,soft", "volume-mounts", "on"], shown.stdout  # HAMi-core: isolation shared, soft
    assert "let any pod take GPUs" not in shown.stdout or REAL_NODE not in shown.stdout.split("let any pod")[1]

    got = asking_for_every_gpu(cluster, tenant, fresh, "guarded")
    assert got == [[], []], "pods that are not ours got GPUs by environment"
    # Ours still get theirs, by volume mounts the toolkit reads.
    tenant.create_namespaced_pod(fresh, gpu_pod("ours", GRANT))
    ours = wait_running(cluster.core, fresh, "ours")
    assert_grant_matches_allocation(created(cluster.node, ours, "main"), allocation_of(ours), SM_PERCENT)


def test_on_the_toolkit_defaults_they_get_every_gpu_and_the_plugin_reports_the_node(
    cluster: Cluster, fresh: str, tenant: CoreV1Api, toolkit_defaults: None
) -> None:
    """The vector the shipped setting closes, and the report an operator gets for a node left open."""
    assert cluster.node is not None
    got = asking_for_every_gpu(cluster, tenant, fresh, "open")
    assert got == [["all"], ["all"]]

    eventually("the node labelled envvar-guard=off", lambda: guard_label(cluster) == "off" or None, 30)

    def warned() -> list[str] | None:
        events = cluster.core.list_namespaced_event("default", field_selector=f"involvedObject.name={REAL_NODE}")
        found = [e.message for e in events.items if e.reason == REASON_UNGUARDED and e.type == "Warning"]
        return found or None

    (message, *_) = eventually("a Warning Event on the node", warned, 30)
    assert "accept-nvidia-visible-devices-envvar-when-unprivileged = false" in message
    shown = tfctl_nodes(cluster)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert f"let any pod take GPUs by naming them in NVIDIA_VISIBLE_DEVICES: {REAL_NODE}" in shown.stdout
