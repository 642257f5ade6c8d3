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
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client import CoreV1Api

from device_plugin.enforcement.envs import EnforcementPaths, LiveMount, Target, build
from vgpu.names import Annotation, EnforcementBackend, Env

from .cluster import Cluster
from .kube import api_client, wait_running
from .pods import allocation_of, assert_env_matches_allocation, gpu_pod

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


def test_a_tenant_setting_the_plugins_variables_gets_exactly_its_grant_however_it_sets_them(
    cluster: Cluster, fresh: str
) -> None:
    assert cluster.node is not None
    cluster.grant_tenant(fresh, "edit")
    tenant = CoreV1Api(api_client(cluster.tenant_kubeconfig))
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
            grant = build(alloc, target, EnforcementBackend.HAMI_CORE, EnforcementPaths(), LiveMount("-")).envs
            assert record["cdiDevices"] == [f"tensor-fusion.ai/vgpu={pod.metadata.uid}_{record['container']}"]
            if any(record["env"].get(k) != v for k, v in grant.items()):
                beyond.append((pod.metadata.name, {k: record["env"].get(k) for k in grant}))
            if any(record["criEnv"].get(k) != v for k, v in grant.items()):
                beyond_without_cdi.append(pod.metadata.name)
        assert_env_matches_allocation(records[-1]["env"], allocation_of(pod), SM_PERCENT)
        assert records[-1]["env"][Env.HAMI_SHARED_REGION] == "/run/tensor-fusion/limits/hami.cache"
    assert (containers, len(beyond)) == (3, 0), beyond
    assert sorted(beyond_without_cdi) == ["env-from", "own-region"], "what a runtime without CDI would start"
