"""Isolation modes on the cluster: where a pod asking for one lands, what its container gets, and the MPS daemon.

Placement: pool ``e2e-isolation`` holds two kubelet-less nodes, one whose plugin runs HAMi-core (it serves
``shared`` and ``soft``) and one running MPS (``hard``); a ``hard`` pod lands on the MPS node, a ``soft`` one
on the other, and a ``hard`` pod in the default pool, where every GPU runs HAMi-core, stays Pending with the
filter's reason in its FailedScheduling event. The pool's status counts GPUs per mode.

The container record, on the kubelet node: ``shared`` and ``soft`` under its HAMi-core plugin (shared: no
compute cap, VRAM capped); then the plugin is restarted with the MPS backend and the stand-in
``nvidia-cuda-mps-control`` (tests/device_plugin/fake_mps_control.py): the daemon is started for the node's GPUs,
a ``hard`` pod's container gets MPS's variables, the pipe directory and the server's /dev/shm, the daemon is held
to the ceiling of the node's grants (what a client that raises its own variables can reach), a killed daemon
takes the node's GPUs out of its allocatable until it runs again (and gets the ceiling again), and the plugin
quits it when it stops.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi

from device_plugin.enforcement.envs import granted_percents
from vgpu.contract import allocation
from vgpu.names import (
    CRD_GROUP,
    CRD_VERSION,
    PLURAL_GPU_POOL,
    Annotation,
    EnforcementBackend,
    Env,
    IsolationMode,
)

from .cluster import REAL_NODE, Cluster, vgpu_allocatable
from .fake_nodes import fake_nvml_yaml, gpus
from .kube import events_for, eventually, wait_bound, wait_running
from .pods import allocation_of, created, gpu_pod

POOL = "e2e-isolation"
SHARE = {Annotation.TFLOPS_REQUEST: "10", Annotation.TFLOPS_LIMIT: "20", Annotation.VRAM_REQUEST: "4Gi"}
STAND_IN = Path(__file__).parents[1] / "device_plugin" / "fake_mps_control.py"


def asking(name: str, mode: IsolationMode, **extra: str) -> dict[str, Any]:
    return gpu_pod(name, {**SHARE, Annotation.ISOLATION: mode.value, **extra})


def on_real_node(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    return pod


def test_a_pod_lands_only_on_gpus_that_serve_its_mode(cluster: Cluster, core: CoreV1Api, fresh: str) -> None:
    cluster.add_fake_node("e2e-iso-hami", gpus("isohami", 1), pool=POOL)
    cluster.add_fake_node("e2e-iso-mps", gpus("isomps", 1), pool=POOL, backend=EnforcementBackend.MPS)
    core.create_namespaced_pod(fresh, asking("hard", IsolationMode.HARD, **{Annotation.GPUPOOL: POOL}))
    core.create_namespaced_pod(fresh, asking("soft", IsolationMode.SOFT, **{Annotation.GPUPOOL: POOL}))
    hard, soft = wait_bound(core, fresh, "hard"), wait_bound(core, fresh, "soft")
    assert (hard.spec.node_name, soft.spec.node_name) == ("e2e-iso-mps", "e2e-iso-hami")
    assert (allocation_of(hard).isolation, allocation_of(soft).isolation) == (IsolationMode.HARD, IsolationMode.SOFT)

    # Every GPU of the default pool runs HAMi-core: a hard pod there waits, and says why.
    core.create_namespaced_pod(fresh, asking("hard-nowhere", IsolationMode.HARD))
    reason = "no GPU on node serves isolation hard (its GPUs serve shared, soft)"

    def explained() -> list[str] | None:
        found = [e for e in events_for(core, fresh, "hard-nowhere") if reason in e]
        return found or None

    assert eventually("the FailedScheduling reason", explained, timeout=60)[0].startswith("FailedScheduling")
    assert core.read_namespaced_pod("hard-nowhere", fresh).spec.node_name is None

    def counted() -> dict[str, int] | None:
        pool = CustomObjectsApi(cluster.admin).get_cluster_custom_object(CRD_GROUP, CRD_VERSION, PLURAL_GPU_POOL, POOL)
        modes: dict[str, int] | None = (pool.get("status") or {}).get("isolationModes")
        return modes if modes == {"hard": 1, "shared": 1, "soft": 1} else None

    eventually("the pool status counting GPUs per mode", counted, timeout=60)


def test_shared_and_soft_reach_the_container_as_their_environment(
    cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    for mode in (IsolationMode.SHARED, IsolationMode.SOFT):
        core.create_namespaced_pod(fresh, on_real_node(asking(mode.value, mode)))
    shared, soft = (created(cluster.node, wait_running(core, fresh, m), "main")["env"] for m in ("shared", "soft"))
    assert (shared[Env.HAMI_SM_LIMIT], shared[f"{Env.HAMI_SM_LIMIT}_0"]) == ("100", "100")  # no compute cap
    assert (soft[Env.HAMI_SM_LIMIT], soft[f"{Env.HAMI_SM_LIMIT}_0"]) == ("7", "7")  # 20 of 312 TFLOPS, rounded up
    assert shared[f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0"] == soft[f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0"] == "4096m"
    assert Env.MPS_PIPE_DIRECTORY not in shared and Env.MPS_PIPE_DIRECTORY not in soft


def daemon_record(cluster: Cluster) -> list[dict[str, Any]]:
    path = cluster.mps_dir / "log" / "fake-mps-control.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ceilings_sent(cluster: Cluster) -> list[int]:
    """Each compute ceiling the stand-in daemon was given as its default, in order."""
    prefix = "set_default_active_thread_percentage "
    commands = [r["command"] for r in daemon_record(cluster) if r.get("event") == "command"]
    return [int(c.removeprefix(prefix)) for c in commands if c.startswith(prefix)]


def widest_cap_on_node(core: CoreV1Api) -> int:
    """The widest compute cap of the grants of the pods still running on the kubelet node."""
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={REAL_NODE}").items
    running = [p for p in pods if p.status.phase in ("Pending", "Running") and not p.metadata.deletion_timestamp]
    allocs = [allocation_of(p) for p in running if allocation.KEY in (p.metadata.annotations or {})]
    return max(p for a in allocs for p in granted_percents(a).values())


@pytest.fixture
def mps_plugin(cluster: Cluster) -> Iterator[None]:
    """The kubelet node's plugin on the MPS backend, with the stand-in daemon; back on HAMi-core afterwards."""
    mps, hami = EnforcementBackend.MPS, EnforcementBackend.HAMI_CORE
    cluster.restart_device_plugin(lambda inv: inv.backend is mps, fake_nvml_yaml(cluster.gpus, {}), STAND_IN)
    try:
        yield
    finally:
        cluster.restart_device_plugin(lambda inv: inv.backend is hami)


def test_hard_runs_the_mps_daemon_and_its_clients_get_its_pipe(
    cluster: Cluster, core: CoreV1Api, fresh: str, mps_plugin: None
) -> None:
    uuids = ",".join(g.uuid for g in cluster.gpus)
    starts = [r for r in daemon_record(cluster) if r.get("event") == "start"]
    assert starts and starts[-1]["env"]["CUDA_VISIBLE_DEVICES"] == uuids, daemon_record(cluster)

    core.create_namespaced_pod(fresh, on_real_node(asking("hard", IsolationMode.HARD)))
    record = created(cluster.node, wait_running(core, fresh, "hard"), "main")
    env, mounts = record["env"], {m["containerPath"]: m["hostPath"] for m in record["mounts"]}
    assert env[Env.MPS_ACTIVE_THREAD_PERCENTAGE] == "7" and env[Env.MPS_PINNED_MEM_LIMIT] == "0=4096M"
    assert Env.HAMI_SM_LIMIT not in env  # no HAMi-core on an MPS node
    assert mounts[env[Env.MPS_PIPE_DIRECTORY]] == str(cluster.mps_dir / "pipe")
    assert mounts["/dev/shm"] == str(cluster.mps_dir / "shm")
    # Its grant is on the node before its Allocate answered: the daemon's ceiling is the widest cap granted here.
    widest = widest_cap_on_node(core)
    assert widest >= 7 and ceilings_sent(cluster)[-1:] == [widest], daemon_record(cluster)
    device = [g.uuid for g in cluster.gpus].index(allocation_of(core.read_namespaced_pod("hard", fresh)).gpus[0].uuid)
    pinned = [r["command"] for r in daemon_record(cluster) if r.get("event") == "command"]
    assert any(c.startswith(f"set_default_device_pinned_mem_limit {device} ") for c in pinned)

    # The daemon dies: the node's GPUs leave its allocatable until the plugin has it running again.
    capacity = vgpu_allocatable(core)
    pid = int((cluster.mps_dir / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    eventually("no vGPU allocatable while the daemon is down", lambda: vgpu_allocatable(core) == 0 or None, 60)
    eventually("vGPU allocatable again", lambda: vgpu_allocatable(core) == capacity or None, 90)
    assert len([r for r in daemon_record(cluster) if r.get("event") == "start"]) == len(starts) + 1
    restarted = max(i for i, r in enumerate(daemon_record(cluster)) if r.get("event") == "start")
    eventually(
        "the ceiling given to the restarted daemon",
        lambda: (
            any(
                r.get("command") == f"set_default_active_thread_percentage {widest}"
                for r in daemon_record(cluster)[restarted:]
            )
            or None
        ),
        30,
    )
    assert allocation_of(core.read_namespaced_pod("hard", fresh)).isolation is IsolationMode.HARD

    core.delete_namespaced_pod("hard", fresh, grace_period_seconds=0)
    cluster.ours["tf-device-plugin"].stop()  # the fixture starts it again, on HAMi-core
    assert [r for r in daemon_record(cluster) if r.get("event") == "quit"], daemon_record(cluster)
