"""Per-container GPU usage on the node: a process's owner from its cgroup, the join of processes with pods
and grants (table-tested), the fake GPU file's scripted use, the sampler's counted skips, the metrics
and ``/usage`` it serves, and the whole loop in the real plugin assembly — no GPU, no cluster."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from device_plugin.cluster.pods import PodRecord, from_json
from device_plugin.gpus.fake_probe import FAKE_PID_BASE, FakeProbe, FakeProbeError
from device_plugin.gpus.probe import ComputeMode, GpuDevice, GpuSample, ProcessReport, ProcessSample, XidEvent
from device_plugin.metrics import PluginMetrics, UsageCollector
from device_plugin.usage.process_owner import ProcessOwner, ProcResolver, owner_from_cgroup
from device_plugin.usage.sampler import UsageSampler
from device_plugin.usage.usage import GpuProcesses, Skip, allocated, node_usage
from tests.device_plugin.fakes import (
    A100_TFLOPS,
    GIB,
    GPU0,
    GPU1,
    FakeKube,
    allocation,
    gpu_file,
    grant,
    make_pod,
    uid_of,
)
from tests.device_plugin.harness import plugin, run
from tf_shell.access import Access, Refusal
from vgpu import metric_names
from vgpu.contract import usage
from vgpu.contract.inventory import GpuInfo
from vgpu.contract.usage import ContainerUsage, NodeUsage, Unattributed

MIB = 1024 * 1024
UID = "0b6f3c1e-5d2a-4c8e-9f10-6a7b8c9d0e1f"
CID = "4f2a" + "0" * 56 + "beef"  # a runtime container ID: 64 hex digits
MIG = "MIG-9f2d0c1e-0000-0000-0000-000000000000"
GPU_A = GpuInfo(uuid=GPU0, index=0, model="A100-SXM4-80GB", tflops=A100_TFLOPS, vram=80 * GIB)
GPU_B = GpuInfo(uuid=GPU1, index=1, model="A100-SXM4-80GB", tflops=A100_TFLOPS, vram=80 * GIB)
UNIT = GpuInfo(uuid=MIG, index=0, model="A100-SXM4-80GB MIG 1g.10gb", tflops=44_571, vram=9984 * MIB, parent=GPU0)


# --- a process's pod and container, from its cgroup -----------------------------------------------------
SYSTEMD_UID = UID.replace("-", "_")


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        pytest.param(  # cgroup v1, cgroupfs driver: one line per hierarchy, the container's ID bare
            f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n",
            ProcessOwner(pod=UID, container_id=CID),
            id="v1-cgroupfs",
        ),
        pytest.param(  # cgroup v2, systemd driver, containerd
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
            f"cri-containerd-{CID}.scope\n",
            ProcessOwner(pod=UID, container_id=CID),
            id="v2-systemd-containerd",
        ),
        pytest.param(  # CRI-O, a Guaranteed pod (no QoS level in the path)
            f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/crio-{CID}.scope\n",
            ProcessOwner(pod=UID, container_id=CID),
            id="v2-systemd-crio-guaranteed",
        ),
        pytest.param(  # dockershim's spelling, seen from a container's own cgroup namespace
            f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/docker-{CID}.scope\n",
            ProcessOwner(pod=UID, container_id=CID),
            id="v2-relative-docker",
        ),
        pytest.param(  # cgroup v2, cgroupfs driver
            f"0::/kubepods/besteffort/pod{UID}/{CID}\n",
            ProcessOwner(pod=UID, container_id=CID),
            id="v2-cgroupfs",
        ),
        pytest.param(  # in the pod's cgroup but no container's (the pause process's parent, say)
            f"0::/kubepods/pod{UID}\n", ProcessOwner(pod=UID), id="pod-only"
        ),
        pytest.param(  # the leaf is no container ID (a sub-cgroup a workload made)
            f"0::/kubepods/pod{UID}/not-a-container/x\n", ProcessOwner(pod=UID), id="not-an-id"
        ),
        pytest.param("0::/system.slice/containerd.service\n", None, id="no-pod"),
        pytest.param("", None, id="empty"),
    ],
)
def test_the_cgroup_names_the_pod_and_the_container(cgroup: str, expected: ProcessOwner | None) -> None:
    assert owner_from_cgroup(cgroup) == expected


def test_proc_resolver_reads_the_cgroup_and_a_gone_process_has_no_owner(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    resolver = ProcResolver(tmp_path)
    assert resolver.owner(4242) == ProcessOwner(pod=UID, container_id=CID)
    assert resolver.owner(4343) is None  # exited between the driver's list and the read


def test_a_pod_record_keeps_each_running_containers_runtime_id() -> None:
    pod = make_pod("trainer", containers=[("main", 1), ("sidecar", 0)], init=[("setup", 0)])
    pod["status"] |= {
        "initContainerStatuses": [{"name": "setup", "containerID": "containerd://aaa"}],
        "containerStatuses": [
            {"name": "main", "containerID": f"cri-o://{CID}"},
            {"name": "sidecar"},  # waiting: no container yet
        ],
    }
    assert from_json(pod).container_ids == (("aaa", "setup"), (CID, "main"))


# --- the join: processes → containers → grants ------------------------------------------------------------
def record(
    name: str,
    *,
    containers: Sequence[str] = ("main",),
    granted: Sequence[str] | None = None,
    grants: Sequence[Any] = (),
    alloc: str | None = "",
    namespace: str = "ml",
    phase: str = "Running",
) -> PodRecord:
    """A running pod whose containers have IDs ``<name>-<container>``, its ``granted`` containers (default:
    all) given ``grants`` (default: 10 TFLOPS / 4 GiB of GPU0, limits 20 TFLOPS / 8 GiB), unless ``alloc``
    is given (None: no allocation)."""
    pod = make_pod(name, containers=[(c, 1) for c in containers], namespace=namespace, phase=phase)
    default = (grant(GPU0, tflops_limit=20_000, vram_limit=8 * GIB),)
    gpus = tuple(grants) or default
    text = allocation(uid_of(pod), containers=granted or containers, gpus=gpus) if alloc == "" else alloc
    if text is not None:
        pod["metadata"]["annotations"]["tensor-fusion.ai/allocation"] = text
    pod["status"]["containerStatuses"] = [{"name": c, "containerID": f"containerd://{name}-{c}"} for c in containers]
    return from_json(pod)


def report(*processes: tuple[int, int, int], supported: bool = True) -> ProcessReport:
    """(pid, SM percent, MiB) each."""
    return ProcessReport(
        processes=tuple(ProcessSample(pid, sm, mib * MIB) for pid, sm, mib in processes),
        until_us=0,
        sm_supported=supported,
    )


def owned(pod: PodRecord, container: str) -> ProcessOwner:
    return ProcessOwner(pod=pod.uid, container_id=f"{pod.name}-{container}")


def join(
    gpus: Sequence[tuple[GpuInfo, ProcessReport]], owners: dict[int, ProcessOwner | None], pods: Sequence[PodRecord]
) -> tuple[NodeUsage, list[tuple[str, int, Skip]]]:
    found = node_usage(
        node="node-a",
        sampled_at="2026-11-22T04:00:00.000Z",
        interval_s=5,
        gpus=[GpuProcesses(gpu=g, report=r) for g, r in gpus],
        owners=owners,
        pods=pods,
    )
    return found.usage, list(found.skipped)


def used(u: NodeUsage) -> list[tuple[str, str, str, int, int]]:
    return [(c.pod, c.container, c.gpu, c.tflops_used, c.vram_used) for c in u.containers]


def test_each_containers_processes_are_summed_per_gpu_and_measured_against_its_pods_grant() -> None:
    trainer = record("trainer", containers=("main", "helper"))
    both = record("both", grants=(grant(GPU0), grant(GPU1, index=1, tflops=30_000, vram=2 * GIB)))
    owners = {1: owned(trainer, "main"), 2: owned(trainer, "main"), 3: owned(trainer, "helper"), 4: owned(both, "main")}
    u, skipped = join(
        [(GPU_A, report((1, 10, 100), (2, 5, 200), (3, 1, 50), (4, 20, 1024))), (GPU_B, report((4, 50, 2048)))],
        owners,
        [trainer, both],
    )
    assert skipped == [] and u.unattributed == ()
    assert used(u) == [
        ("both", "main", GPU0, 62_400, GIB),  # 20 % of 312 TFLOPS
        ("both", "main", GPU1, 156_000, 2 * GIB),
        ("trainer", "helper", GPU0, 3_120, 50 * MIB),  # each container is measured against the pod's grant
        ("trainer", "main", GPU0, 46_800, 300 * MIB),  # two processes: 15 %
    ]
    main = u.containers[3]
    assert (main.namespace, main.pod_uid, main.tflops_request, main.tflops_limit) == ("ml", trainer.uid, 10_000, 20_000)
    assert (main.vram_request, main.vram_limit) == (4 * GIB, 8 * GIB)
    assert (u.containers[1].tflops_request, u.containers[1].vram_limit) == (30_000, 2 * GIB)
    assert (u.node, u.sampled_at, u.interval_s) == ("node-a", "2026-11-22T04:00:00.000Z", 5)


def test_a_mig_instance_has_tflops_of_its_own_and_a_memory_only_gpu_says_its_tflops_are_not_measured() -> None:
    small = record("small", grants=(grant(MIG, tflops=44_571, vram=9984 * MIB),))
    other = record("other")
    u, _ = join(
        [(UNIT, report((1, 50, 10))), (GPU_A, report((2, 0, 64), (3, 0, 8), supported=False))],
        {1: owned(small, "main"), 2: owned(other, "main"), 3: None},
        [small, other],
    )
    assert used(u) == [("other", "main", GPU0, 0, 64 * MIB), ("small", "main", MIG, 22_285, 10 * MIB)]
    assert [c.tflops_measured for c in u.containers] == [False, True]  # 0 there is "not measured", not "idle"
    assert [(x.gpu, x.tflops_measured) for x in u.unattributed] == [(GPU0, False)]


@pytest.mark.parametrize(
    ("owner", "reason"),
    [
        pytest.param(None, Skip.NO_POD, id="exited-or-not-in-a-pod"),
        pytest.param(ProcessOwner(pod="1f000000-0000-4000-8000-000000000000"), Skip.POD_UNKNOWN, id="deleted-pod"),
        pytest.param(ProcessOwner(pod="{uid}", container_id="f" * 64), Skip.CONTAINER_UNKNOWN, id="unknown-id"),
        pytest.param(ProcessOwner(pod="{uid}"), Skip.CONTAINER_UNKNOWN, id="no-container-in-cgroup"),
        pytest.param(ProcessOwner(pod="{uid}", container="sidecar"), Skip.NO_GRANT, id="container-without-grant"),
        pytest.param(ProcessOwner(pod="{other}", container="main"), Skip.NO_GRANT, id="pod-without-allocation"),
        pytest.param(ProcessOwner(pod="{broken}", container="main"), Skip.NO_GRANT, id="allocation-not-decodable"),
        pytest.param(ProcessOwner(pod="{elsewhere}", container="main"), Skip.NO_GRANT, id="grant-of-another-gpu"),
        pytest.param(ProcessOwner(pod="{split}", container="pre"), Skip.NO_GRANT, id="gpu-of-a-sibling-container"),
    ],
)
def test_a_process_no_granted_container_is_found_for_is_counted_unattributed_with_the_reason(
    owner: ProcessOwner | None, reason: Skip
) -> None:
    pods = {
        "uid": record("trainer", containers=("main", "sidecar"), granted=("main",)),
        "other": record("plain", alloc=None),
        "broken": record("broken", alloc='{"version": "v1"}'),
        "elsewhere": record("elsewhere", grants=(grant(GPU1, index=1),)),
        # container-gpu-count: GPU0 is inf's, pre's is GPU1
        "split": record("split", containers=("pre", "inf"), alloc=allocation(
            "u", containers=("pre", "inf"), gpus=(grant(GPU0), grant(GPU1, index=1)),
            container_gpus=(("pre", (GPU1,)), ("inf", (GPU0,))),
        )),
    }  # fmt: skip
    if owner is not None:
        owner = ProcessOwner(
            pod=owner.pod.format(**{k: p.uid for k, p in pods.items()}),
            container_id=owner.container_id,
            container=owner.container,
        )
    u, skipped = join(
        [(GPU_A, report((7, 10, 256), (8, 5, 256)))],
        {7: owner, 8: owned(pods["uid"], "main")},
        list(pods.values()),
    )
    assert skipped == [(GPU0, 7, reason)]
    assert u.unattributed == (
        Unattributed(gpu=GPU0, processes=1, tflops_used=31_200, vram_used=256 * MIB, tflops_measured=True),
    )
    assert used(u) == [("trainer", "main", GPU0, 15_600, 256 * MIB)]  # the other process still counts


def test_a_scripted_process_names_its_pod_by_uid_namespace_and_name_or_a_name_only_one_pod_has() -> None:
    a = record("a", namespace="team-1")
    twin1, twin2 = record("twin", namespace="team-1"), record("twin", namespace="team-2")
    owners: dict[int, ProcessOwner | None] = {
        1: ProcessOwner(pod="a", container="main"),
        2: ProcessOwner(pod="team-2/twin", container="main"),
        3: ProcessOwner(pod=twin1.uid, container="main"),
        4: ProcessOwner(pod="twin", container="main"),  # two pods have that name: which one is unknown
    }
    u, skipped = join([(GPU_A, report((1, 1, 1), (2, 2, 2), (3, 3, 3), (4, 4, 4)))], owners, [a, twin1, twin2])
    assert [(c.namespace, c.pod, c.vram_used) for c in u.containers] == [
        ("team-1", "a", MIB),
        ("team-1", "twin", 3 * MIB),
        ("team-2", "twin", 2 * MIB),
    ]
    assert skipped == [(GPU0, 4, Skip.POD_UNKNOWN)]


def test_allocated_counts_the_requests_of_pods_still_running() -> None:
    pods = [
        record("a", grants=(grant(GPU0, tflops=10_000, vram=GIB), grant(GPU1, index=1, tflops=5_000, vram=GIB))),
        record("b", grants=(grant(GPU0, tflops=2_500, vram=3 * GIB),)),
        record("done", phase="Succeeded"),
        record("plain", alloc=None),
    ]
    assert allocated(pods) == {GPU0: (12_500, 4 * GIB), GPU1: (5_000, GIB)}


# --- the fake GPU file's scripted use ---------------------------------------------------------------
def scripted(path: Path, usage_entries: list[dict[str, Any]], **gpu1: Any) -> Path:
    gpu_file(path, usage=usage_entries)
    doc = yaml.safe_load(path.read_text())
    doc["gpus"][1] |= gpu1
    path.write_text(yaml.safe_dump(doc))
    os.utime(path, (1000.0, 1000.0))  # the script's clock starts at the file's modification time
    return path


def test_the_fake_scripts_constant_ramp_and_step_use_per_pod_and_answers_for_its_synthetic_pids(
    tmp_path: Path,
) -> None:
    clock = [1000.0]
    entries = [
        {"pod": "trainer", "container": "main", "gpu": 0, "smPercent": 40, "vramMiB": {"constant": 1024}},
        {
            "pod": "ml/infer",
            "container": "srv",
            "gpu": GPU0,
            "smPercent": {"ramp": {"from": 0, "to": 80, "seconds": 20}},
        },
        {
            "pod": UID,
            "container": "main",
            "gpu": 1,
            "smPercent": {"step": {"before": 10, "after": 70, "atSeconds": 30}},
        },
    ]
    probe = FakeProbe(scripted(tmp_path / "gpus.yaml", entries), clock=lambda: clock[0])

    def now() -> list[tuple[int, int, int]]:
        reports = [probe.processes(g, 0) for g in (GPU0, GPU1)]
        return [(p.pid - FAKE_PID_BASE, p.sm_percent, p.memory_used // MIB) for r in reports for p in r.processes]

    assert now() == [(0, 40, 1024), (1, 0, 0), (2, 10, 0)]
    clock[0] = 1010.0
    assert now() == [(0, 40, 1024), (1, 40, 0), (2, 10, 0)]
    clock[0] = 1030.0
    assert now() == [(0, 40, 1024), (1, 80, 0), (2, 70, 0)]
    assert probe.processes(GPU0, 0).until_us == 1030 * 1_000_000
    assert probe.owner(FAKE_PID_BASE + 1) == ProcessOwner(pod="ml/infer", container="srv")
    assert probe.owner(FAKE_PID_BASE + 3) is None
    assert probe.owner(4242) is None  # a real process: not the script's


def test_a_fake_gpu_without_per_process_utilisation_is_memory_only_and_mig_instances_are_scripted(
    tmp_path: Path,
) -> None:
    unit = {"uuid": MIG, "slices": 1, "memoryMiB": 9984}
    entries = [
        {"pod": "a", "container": "main", "gpu": 1, "smPercent": 30, "vramMiB": 512},
        {"pod": "b", "container": "main", "gpu": MIG, "smPercent": 20, "vramMiB": 256},
    ]
    path = scripted(tmp_path / "gpus.yaml", entries, processUtilization=False, mig=True, migDevices=[unit])
    probe = FakeProbe(path, clock=lambda: 2000.0)
    assert probe.processes(GPU1, 0) == ProcessReport(
        processes=(ProcessSample(FAKE_PID_BASE, 0, 512 * MIB),), until_us=2000 * 1_000_000, sm_supported=False
    )
    assert probe.processes(MIG, 0) == ProcessReport(
        processes=(ProcessSample(FAKE_PID_BASE + 1, 0, 256 * MIB),),
        until_us=2000 * 1_000_000,
        sm_supported=False,  # the GPU's setting holds for its MIG instances too
    )
    assert probe.processes(GPU0, 0).processes == ()
    with pytest.raises(FakeProbeError, match="GPU GPU-gone is not in the fake GPU file"):
        probe.processes("GPU-gone", 0)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"pod": "a", "gpu": 0}, r"usage\[0\]: needs pod, container and gpu"),
        ({"pod": "a", "container": "c", "gpu": 0, "tflopsPercent": 5}, r"usage\[0\]\.tflopsPercent: unknown field"),
        ({"pod": "a", "container": "c", "gpu": 7}, r"usage\[0\]\.gpu: 7 is the index or UUID of no GPU"),
        ({"pod": "a", "container": "c", "gpu": 0, "smPercent": 120}, r"smPercent: must be .* from 0 to 100; got 120"),
        ({"pod": "a", "container": "c", "gpu": 0, "smPercent": {"ramp": {"from": 0}}}, r"smPercent: must be"),
        ({"pod": "a", "container": "c", "gpu": 0, "vramMiB": {"sine": 3}}, r"vramMiB: must be .* 0 or more"),
        ({"pod": "a", "container": "c", "gpu": 0, "vramMiB": -1}, r"vramMiB: must be"),
    ],
)
def test_a_malformed_usage_entry_is_named_with_its_field(entry: dict[str, Any], message: str, tmp_path: Path) -> None:
    with pytest.raises(FakeProbeError, match=message):
        FakeProbe(gpu_file(tmp_path / "gpus.yaml", usage=[entry]))


# --- the sampler ---------------------------------------------------------------------------------------
class Broken:
    """A probe whose process queries fail for some GPUs (``down``), else answer ``reports``."""

    def __init__(self, reports: dict[str, ProcessReport]) -> None:
        self.reports, self.down = reports, {GPU1}
        self.asked: list[tuple[str, int]] = []

    def devices(self) -> tuple[GpuDevice, ...]:
        return ()

    def wait_xid(self, timeout_s: float) -> tuple[XidEvent, ...]:
        return ()

    def check(self, uuid: str) -> str | None:
        return None

    def sample(self, uuid: str) -> GpuSample:
        return GpuSample(uuid=uuid)

    def processes(self, uuid: str, since_us: int) -> ProcessReport:
        self.asked.append((uuid, since_us))
        if uuid in self.down:
            raise RuntimeError("NVML: GPU is lost")
        return self.reports[uuid]

    def compute_mode(self, uuid: str) -> ComputeMode:
        return ComputeMode.DEFAULT

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        return None


class Owners:
    def __init__(self, owners: dict[int, ProcessOwner | None]) -> None:
        self.owners = owners

    def owner(self, pid: int) -> ProcessOwner | None:
        if pid == 666:
            raise OSError("permission denied")
        return self.owners.get(pid)


def skips(metrics: PluginMetrics) -> dict[str, float | None]:
    return {r.value: metrics.registry.get_sample_value("tf_device_plugin_usage_skips_total", {"reason": r.value})
            for r in Skip}  # fmt: skip


def test_a_failing_gpu_and_unmappable_processes_are_counted_logged_once_and_the_sampler_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pod = record("trainer")
    reports = {
        GPU0: ProcessReport(processes=(ProcessSample(1, 10, MIB), ProcessSample(666, 5, MIB)), until_us=77),
        GPU1: ProcessReport(processes=(), until_us=9),
        MIG: ProcessReport(processes=(), until_us=5, sm_supported=False),
    }
    probe = Broken(reports)
    metrics = PluginMetrics()
    parent = GpuInfo(uuid="GPU-parent", index=2, model="A100", tflops=1, vram=1, mig=True)
    sampler = UsageSampler(
        probe,
        Owners({1: owned(pod, "main")}),
        lambda: (GPU_A, GPU_B, parent, UNIT),
        lambda: [pod],
        metrics,
        node="node-a",
        interval_s=5,
    )
    caplog.set_level(logging.INFO)
    first = sampler.sample([pod])
    second = sampler.sample([pod])
    assert used(second) == used(first) == [("trainer", "main", GPU0, 31_200, MIB)]
    assert second.unattributed == (
        Unattributed(gpu=GPU0, processes=1, tflops_used=15_600, vram_used=MIB, tflops_measured=True),
    )
    # The MIG GPU itself is never asked (its instance is); each GPU is asked since its last answer.
    assert probe.asked == [(GPU0, 0), (GPU1, 0), (MIG, 0), (GPU0, 77), (GPU1, 0), (MIG, 5)]
    assert skips(metrics) == {"gpu_error": 2, "no_pod": 2} | dict.fromkeys(
        ("pod_unknown", "container_unknown", "no_grant")
    )
    assert caplog.text.count("cannot sample the processes of GPU " + GPU1) == 1
    assert caplog.text.count(f"process 666 on GPU {GPU0} is not attributed to a container: no_pod") == 1
    assert caplog.text.count(f"GPU {MIG}: the driver reports no per-process utilisation") == 1
    assert sampler.supported == {GPU0: True, MIG: False}
    assert sampler.allocated == {GPU0: (10_000, 4 * GIB)}
    assert metrics.registry.get_sample_value("tf_device_plugin_usage_sample_seconds_count") == 2
    probe.down = set()
    sampler.sample([pod])
    assert f"sampling the processes of GPU {GPU1} works again" in caplog.text
    assert probe.asked[-3:] == [(GPU0, 77), (GPU1, 0), (MIG, 5)]


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_usage_metrics_carry_node_and_container_with_ratios_of_request_and_limit() -> None:
    latest = NodeUsage(
        node="node-a",
        sampled_at="2026-11-22T04:00:00.000Z",
        interval_s=5,
        containers=(
            ContainerUsage(
                namespace="ml",
                pod="trainer",
                pod_uid=UID,
                container="main",
                gpu=GPU0,
                tflops_used=15_000,
                vram_used=GIB,
                tflops_measured=True,
                tflops_request=10_000,
                tflops_limit=20_000,
                vram_request=0,
                vram_limit=4 * GIB,
            ),
        ),
        unattributed=(Unattributed(gpu=GPU0, processes=2, tflops_used=3_120, vram_used=MIB, tflops_measured=True),),
    )
    metrics = PluginMetrics()
    metrics.registry.register(UsageCollector("node-a", lambda: latest, lambda: {GPU0: True, GPU1: False}))
    values = metric_values(generate_latest(metrics.registry).decode())
    c = (("container", "main"), ("gpu", GPU0), ("namespace", "ml"), ("node", "node-a"), ("pod", "trainer"))
    assert {name: values[(name, c)] for name, labels in values if labels == c} == {
        "tf_container_tflops_used": 15.0,
        "tf_container_tflops_request": 10.0,
        "tf_container_tflops_limit": 20.0,
        "tf_container_tflops_used_ratio": 0.75,
        "tf_container_tflops_used_request_ratio": 1.5,  # bursting past the reservation
        "tf_container_vram_used_bytes": GIB,
        "tf_container_vram_request_bytes": 0,  # no ratio of a zero request
        "tf_container_vram_limit_bytes": 4 * GIB,
        "tf_container_vram_used_ratio": 0.25,
    }
    gpu0, gpu1 = (("gpu", GPU0), ("node", "node-a")), (("gpu", GPU1), ("node", "node-a"))
    assert [values[("tf_gpu_unattributed_processes", g)] for g in (gpu0, gpu1)] == [2, 0]
    assert values[("tf_gpu_unattributed_tflops_used", gpu0)] == 3.12
    assert ("tf_gpu_unattributed_tflops_used", gpu1) not in values  # memory only there: no TFLOPS, not a 0
    assert [values[("tf_gpu_unattributed_vram_used_bytes", g)] for g in (gpu0, gpu1)] == [MIB, 0]
    assert [values[("tf_gpu_process_utilization_supported", g)] for g in (gpu0, gpu1)] == [1, 0]


def test_every_metric_the_plugin_exports_is_in_the_names_table_and_the_table_in_the_docs() -> None:
    table = {m.name for m in metric_names.DEVICE_PLUGIN_METRICS}
    assert len(table) == len(metric_names.DEVICE_PLUGIN_METRICS)
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    assert [name for name in sorted(table) if f"`{name}`" not in docs] == []
    assert all(name.startswith(metric_names.PREFIX + "_") for name in table)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:  # 503 before the first pass
        with error:
            return error.code, error.read().decode()


def test_one_port_serves_metrics_and_the_latest_usage_document_503_until_the_first_pass() -> None:
    metrics = PluginMetrics()
    document: list[str | None] = [None]
    server = metrics.serve(0, lambda: document[0], "127.0.0.1")
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert get(base + usage.PATH) == (503, "no usage sampled yet\n")
        document[0] = usage.encode(NodeUsage(node="n", sampled_at="2026-11-22T04:00:00Z", interval_s=5, containers=()))
        assert get(base + usage.PATH) == (200, document[0])
        status, text = get(base + "/metrics")
        assert status == 200 and 'tf_build_info{component="device-plugin"' in text
    finally:
        server.shutdown()
        server.server_close()


def test_the_whole_loop_in_the_plugin_serves_scripted_use_on_usage_and_metrics(tmp_path: Path) -> None:
    """The real assembly with a fake GPU file: a pod granted a share of GPU0, its container scripted at 10 %
    of the GPU's SMs and 1 GiB, then stepped to 30 %; a process of a pod that is not on the node."""
    pod = make_pod("trainer", namespace="ml", alloc=None, phase="Running")
    pod["metadata"]["annotations"]["tensor-fusion.ai/allocation"] = allocation(
        uid_of(pod), gpus=(grant(GPU0, tflops_limit=62_400, vram_limit=4 * GIB),)
    )
    kube = FakeKube([pod])
    path = gpu_file(tmp_path / "gpus.yaml")
    port = free_port()
    entries = [
        {"pod": "trainer", "container": "main", "gpu": 0, "smPercent": 10, "vramMiB": 1024},
        {"pod": "gone", "container": "main", "gpu": 1, "smPercent": 5, "vramMiB": 64},
    ]

    async def scenario() -> None:
        async with plugin(
            tmp_path, kube, path, metrics_port=port, metrics_address="127.0.0.1", usage_interval=0.05
        ) as (daemon, _):
            base = f"http://127.0.0.1:{port}"
            gpu_file(path, usage=entries)

            async def containers(tflops: int) -> NodeUsage:
                while True:
                    status, body = await asyncio.to_thread(get, base + usage.PATH)
                    found = usage.decode(body) if status == 200 else None
                    if found is not None and [c.tflops_used for c in found.containers] == [tflops]:
                        return found
                    await asyncio.sleep(0.02)

            found = await containers(31_200)
            (c,) = found.containers
            assert (c.namespace, c.pod, c.pod_uid, c.container, c.gpu) == ("ml", "trainer", uid_of(pod), "main", GPU0)
            assert (c.vram_used, c.tflops_limit, c.vram_limit) == (GIB, 62_400, 4 * GIB)
            assert found.unattributed == (
                Unattributed(gpu=GPU1, processes=1, tflops_used=15_600, vram_used=64 * MIB, tflops_measured=True),
            )
            assert (found.node, found.interval_s) == ("node-a", 0.05)
            metrics = metric_values((await asyncio.to_thread(get, base + "/metrics"))[1])
            labels = (("container", "main"), ("gpu", GPU0), ("namespace", "ml"), ("node", "node-a"), ("pod", "trainer"))
            assert metrics[("tf_container_tflops_used", labels)] == 31.2
            assert metrics[("tf_container_tflops_used_ratio", labels)] == 0.5
            assert metrics[("tf_container_vram_used_bytes", labels)] == GIB

            gpu_file(path, usage=[{**entries[0], "smPercent": 30}, entries[1]])
            await containers(93_600)
            assert json.loads((await asyncio.to_thread(get, base + usage.PATH))[1])["version"] == "v1"
            assert daemon.sampler.latest is not None

    run(scenario())


def test_on_a_gpu_shared_through_mps_a_containers_tflops_are_unmeasured_never_0_or_the_servers() -> None:
    # NVML counts every MPS client's work to the MPS server process (4242, in no pod): the client's own
    # share reads 0 and the server's is everyone's. Neither is the container's.
    pod = record("trainer")
    probe = Broken({GPU0: report((1, 0, 1), (4242, 80, 0))})  # (PID, SM %, MiB)
    probe.down = set()

    def sampler(sm_unknown: frozenset[str]) -> UsageSampler:
        owners = Owners({1: owned(pod, "main")})
        return UsageSampler(
            probe,
            owners,
            lambda: (GPU_A,),
            lambda: [pod],
            PluginMetrics(),
            node="n",
            interval_s=5,
            sm_unknown=sm_unknown,
        )

    mps = sampler(frozenset({GPU0})).sample([pod])
    (container,) = mps.containers
    assert (container.tflops_measured, container.tflops_used, container.vram_used) == (False, 0, MIB)
    assert mps.unattributed == (Unattributed(gpu=GPU0, processes=1, tflops_used=0, vram_used=0, tflops_measured=False),)
    (plain,) = sampler(frozenset()).sample([pod]).containers  # the same figures off MPS: taken as measured
    assert (plain.tflops_measured, plain.tflops_used) == (True, 0)


class RecordingGate:
    """Stands in for tf_shell.access.Gate (tested there): records each question, allows only ``Bearer ok``."""

    def __init__(self) -> None:
        self.asked: list[tuple[str | None, str | None, Access]] = []

    def check(self, peer: str | None, authorization: str | None, access: Access) -> Refusal | None:
        self.asked.append((peer, authorization, access))
        return None if authorization == "Bearer ok" else Refusal(403, "Forbidden: not you")


def test_usage_and_metrics_ask_the_gate_as_the_kubelet_asks_for_its_own_healthz_does_not() -> None:
    metrics, gate = PluginMetrics(), RecordingGate()
    document = usage.encode(NodeUsage(node="n", sampled_at="2026-11-22T04:00:00Z", interval_s=5, containers=()))
    server = metrics.serve(0, lambda: document, "127.0.0.1", node="node-a", gate=gate)  # type: ignore[arg-type]
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def fetch(path: str, token: str | None) -> tuple[int, str]:
        request = urllib.request.Request(base + path, headers={"Authorization": token} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as error:
            with error:
                return error.code, error.read().decode()

    try:
        assert fetch(usage.PATH, None) == (403, "Forbidden: not you\n")
        assert fetch("/metrics", "Bearer nope") == (403, "Forbidden: not you\n")
        assert fetch(usage.PATH, "Bearer ok") == (200, document)
        assert fetch("/metrics", "Bearer ok")[0] == 200
        assert fetch("/healthz", None) == (200, "ok\n")
        stats = Access(verb="get", resource="nodes", subresource="stats", name="node-a")
        node_metrics = Access(verb="get", resource="nodes", subresource="metrics", name="node-a")
        assert gate.asked == [
            ("127.0.0.1", None, stats),
            ("127.0.0.1", "Bearer nope", node_metrics),
            ("127.0.0.1", "Bearer ok", stats),
            ("127.0.0.1", "Bearer ok", node_metrics),
        ]
    finally:
        server.shutdown()
        server.server_close()
