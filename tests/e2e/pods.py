"""GPU pods as a user writes them, and what a user reads back from them.

WHY: every scenario creates pods with the TensorFusion interface (the opt-in label plus
annotations) and then checks the same things: where the pod went, which GPU share the extender
recorded on it, and which env its container was created with. Keeping the builders and readers
here keeps each scenario to what it asserts.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes.client import CoreV1Api

from vgpu.contract import allocation
from vgpu.names import LABEL_ENABLED, Annotation, Env

from .node import KubeletNode

IMAGE = "registry.local/cuda-app:1.0"


def rewrite_as_tenant(path: Path, text: str) -> None:
    """Replace a container's live-limits file with ``text`` as the container can, on the directory it sees
    read-write: a file written beside it, renamed over it."""
    staged = path.with_name(".tenant")
    staged.write_text(text)
    staged.replace(path)


def gpu_pod(
    name: str,
    annotations: Mapping[Annotation | str, str],
    containers: tuple[str, ...] = ("main",),
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod that opts in with the label and asks for a GPU share through annotations."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {LABEL_ENABLED: "true", **(labels or {})},
            "annotations": {str(k): v for k, v in annotations.items()},
        },
        "spec": {
            "containers": [{"name": c, "image": IMAGE} for c in containers],
            "terminationGracePeriodSeconds": 0,
        },
    }


def parked_gpu_pod(name: str, annotations: Mapping[Annotation | str, str]) -> dict[str, Any]:
    """A GPU pod no node matches: admitted (and counted by quota), never bound by kube-scheduler itself,
    so a scenario can send its bind to an extender by hand."""
    pod = gpu_pod(name, annotations)
    pod["spec"]["nodeSelector"] = {"e2e.tensor-fusion.ai/nowhere": "true"}
    return pod


def hand_over(plugin: CoreV1Api, pod: Any) -> None:
    """Write the receipt the device plugin writes once the kubelet admitted ``pod`` (a kubelet-less node
    has none), with the plugin's identity (``plugin``): the pod's containers got their devices, which frees
    the node's hand-off gate for the next bind (scheduler_extender/HANDOFF.md, "Release")."""
    body = receipt_patch(pod.metadata.uid, pod.spec.node_name, [c.name for c in pod.spec.containers])
    plugin.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, body)


def receipt_patch(uid: str, node: str, containers: Sequence[str]) -> dict[str, Any]:
    """The merge patch of :func:`hand_over`'s receipt for the pod ``uid`` bound to ``node``."""
    at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    devices = tuple((name, (f"vgpu-{i}",)) for i, name in enumerate(containers))
    receipt = allocation.Handoff(pod_uid=uid, node=node, devices=devices, at=at)
    return {"metadata": {"annotations": {allocation.HANDOFF_KEY: allocation.encode_handoff(receipt)}}}


def allocation_of(pod: Any) -> allocation.PodAllocation:
    """The allocation the extender recorded on the pod at bind."""
    text = (pod.metadata.annotations or {}).get(allocation.KEY)
    assert text, f"pod {pod.metadata.name} carries no {allocation.KEY} annotation"
    return allocation.decode(text)


def created(node: KubeletNode | None, pod: Any, container: str) -> dict[str, Any]:
    """The fake CRI's record of ``container`` of ``pod`` (latest attempt): its effective env, mounts, and the GPUs
    NVIDIA's toolkit would give it (tests/e2e/fake_cri/main.go)."""
    assert node is not None, "the cluster has no kubelet node"
    records = [r for r in node.creates() if r["podUid"] == pod.metadata.uid and r["container"] == container]
    assert records, f"the runtime never created {pod.metadata.name}/{container}"
    return records[-1]


def created_env(node: KubeletNode | None, pod: Any, container: str) -> dict[str, str]:
    """The env the kubelet created ``container`` of ``pod`` with (latest attempt), from the fake CRI."""
    env: dict[str, str] = created(node, pod, container)["env"]
    return env


def created_gpus(node: KubeletNode | None, pod: Any, container: str) -> str:
    """The GPUs ``container`` of ``pod`` got (latest attempt), as NVIDIA's toolkit reads its request: comma-joined."""
    return ",".join(created(node, pod, container)["gpus"])


def assert_grant_matches_allocation(
    record: Mapping[str, Any], alloc: allocation.PodAllocation, sm_percent: int
) -> None:
    """The container gets exactly its granted GPUs, each capped at its granted limits (design §7).

    ``sm_percent`` is the compute cap the scenario expects on every granted GPU (each GPU of an e2e
    pod has the same share of the same A100), written out by the scenario rather than recomputed
    here. The cluster's device plugin runs the hami-core backend, so HAMi's variables are checked
    too: its per-GPU ``CUDA_DEVICE_SM_LIMIT_<i>`` and the shared ``CUDA_DEVICE_SM_LIMIT``, which
    device_plugin/enforcement/envs.py sets to the largest per-GPU percent (here the same one).
    """
    uuids = [g.uuid for g in alloc.gpus]
    env: Mapping[str, str] = record["env"]
    assert record["gpus"] == uuids, (record["gpus"], uuids)
    mem = json.loads(env[Env.TF_MEM_LIMIT])
    tflops = json.loads(env[Env.TF_UP_LIMIT_TFLOPS])
    assert set(mem) == set(tflops) == set(uuids), (mem, tflops, uuids)
    assert json.loads(env[Env.TF_UP_LIMIT]) == dict.fromkeys(uuids, sm_percent), env
    for i, grant in enumerate(alloc.gpus):
        assert mem[grant.uuid] == grant.vram_limit, (grant, mem)
        assert round(float(tflops[grant.uuid]) * 1000) == grant.tflops_limit, (grant, tflops)
        assert env[f"{Env.HAMI_MEMORY_LIMIT_PREFIX}{i}"] == f"{grant.vram_limit >> 20}m", (grant, env)
        assert env[f"{Env.HAMI_SM_LIMIT}_{i}"] == str(sm_percent), (grant, env)
    per_gpu = {k for k in env if k.startswith(f"{Env.HAMI_SM_LIMIT}_")}
    assert per_gpu == {f"{Env.HAMI_SM_LIMIT}_{i}" for i in range(len(uuids))}, env
    assert env[Env.HAMI_SM_LIMIT] == str(sm_percent), env
