"""The usage sampler's cost: CPU per sampling pass and per GPU, with 1,000 containers' processes on a node.

Runs the daemon's own pass (:meth:`device_plugin.usage.sampler.UsageSampler.sample`) over

* the fake GPU file: 8 A100s and one scripted process per container, spread evenly, each on a step
  profile, so every pass computes every figure and re-checks the file;
* the real ``/proc`` resolver (:class:`device_plugin.usage.process_owner.ProcResolver`) over a synthetic
  ``/proc`` whose cgroup files name each process's pod and container as systemd and containerd spell
  them, so every pass opens, reads and parses one file per process;
* one pod record per container, each with its allocation and container status, as the pod cache holds them.

The budget (issue 15) is under 1 % of one core per GPU at the default interval. Prints CPU seconds per
pass (process time: the pass is single-threaded), per GPU, the share of one core per GPU at
``--interval``, the VRAM guard's judgement of each pass on its own
(:func:`device_plugin.enforcement.vram_overuse.judge`, every container judged, none over its limit), the
compute report's (each pod's cap from its allocation, its share, a full minute's window judged:
:mod:`device_plugin.enforcement.compute_guard`), and the hardware. Not in the figure: NVML's two calls per
GPU (the process list and the utilisation samples), which are driver ioctls on a real node.

    .venv/bin/python -m benchmarks.usage_sampling [--containers 1000] [--gpus 8] [--passes 200] [--interval 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.hardware import describe
from device_plugin.cluster.pods import PodRecord, from_json
from device_plugin.enforcement import compute_overuse
from device_plugin.enforcement.compute_guard import caps_of
from device_plugin.enforcement.vram_overuse import judge
from device_plugin.gpus.board import discover
from device_plugin.gpus.fake_probe import FAKE_PID_BASE, FakeProbe
from device_plugin.metrics import PluginMetrics
from device_plugin.usage.process_owner import ProcResolver
from device_plugin.usage.sampler import UsageSampler
from device_plugin.usage.usage import grant_of
from tests.device_plugin.fakes import allocation, grant, make_pod, uid_of
from vgpu.catalog import builtin


def node(root: Path, containers: int, gpus: int) -> tuple[Path, Path, list[PodRecord]]:
    """The fake GPU file, a synthetic /proc and the pods: container ``i`` runs process FAKE_PID_BASE + i
    on GPU ``i % gpus``, in pod ``p<i>`` granted 10 TFLOPS / 4 GiB of that GPU."""
    uuids = [f"GPU-{g:08d}-0000-0000-0000-000000000000" for g in range(gpus)]
    proc = root / "proc"
    pods, usage = [], []
    for i in range(containers):
        gpu = uuids[i % gpus]
        pod = make_pod(f"p{i}", phase="Running", namespace="bench")
        uid, container_id = uid_of(pod), f"{i:064x}"
        pod["metadata"]["annotations"]["tensor-fusion.ai/allocation"] = allocation(
            uid, gpus=(grant(gpu, index=i % gpus),)
        )
        pod["status"]["containerStatuses"] = [{"name": "main", "containerID": f"containerd://{container_id}"}]
        pods.append(from_json(pod))
        (proc / str(FAKE_PID_BASE + i)).mkdir(parents=True)
        (proc / str(FAKE_PID_BASE + i) / "cgroup").write_text(
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-{container_id}.scope\n"
        )
        step = {"step": {"before": 5, "after": 10, "atSeconds": 3600}}
        usage.append({"pod": uid, "container": "main", "gpu": gpu, "smPercent": step, "vramMiB": 1024})
    doc = {
        "gpus": [
            {"uuid": u, "index": g, "name": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920} for g, u in enumerate(uuids)
        ],
        "usage": usage,
    }
    gpu_file = root / "gpus.yaml"
    gpu_file.write_text(yaml.safe_dump(doc))
    return gpu_file, proc, pods


def bench(containers: int, gpus: int, passes: int, interval_s: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        gpu_file, proc, pods = node(Path(tmp), containers, gpus)
        probe = FakeProbe(gpu_file)
        board = discover(probe.devices(), builtin(), 0)
        sampler = UsageSampler(
            probe,
            ProcResolver(proc),
            lambda: board,
            lambda: pods,
            PluginMetrics(),
            node="bench",
            interval_s=interval_s,
        )
        first = sampler.sample(pods)  # warm: the allocation decode cache fills, the file is parsed
        assert len(first.containers) == containers and not first.unattributed, "every process attributed"
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(passes):
            sampler.sample(pods)
        cpu, wall = (time.process_time() - cpu) / passes, (time.perf_counter() - wall) / passes
        found = sampler.attribute(pods)
        judged = time.process_time()
        for _ in range(passes):
            judge(found.usage.containers, found.holders, tolerance=512 << 20, streaks={}, again=True)
        judged = (time.process_time() - judged) / passes
        grants = {p.uid: alloc for p in pods if (alloc := grant_of(p.allocation)) is not None}
        window = compute_overuse.judge((), margin=10, passes=12, window_s=60, history={}, reported=frozenset())
        reported = time.process_time()
        for _ in range(passes):
            window = compute_overuse.judge(
                compute_overuse.shares(found.usage.containers, caps_of(grants)),
                margin=10,
                passes=12,
                window_s=60,
                history=window.history,
                reported=window.reported,
            )
        reported = (time.process_time() - reported) / passes
        assert len(window.history) == containers and not window.report, "every pod judged, none over its cap"
    per_gpu = cpu / gpus
    share = 100 * per_gpu / interval_s
    print(f"{containers} containers' processes on {gpus} GPUs, {passes} passes")
    print(f"per pass: {cpu * 1000:.2f} ms CPU, {wall * 1000:.2f} ms wall")
    print(f"per GPU per pass: {per_gpu * 1000:.3f} ms CPU = {share:.4f} % of one core at {interval_s:g} s")
    print(f"the VRAM guard's judgement of a pass: {judged * 1000:.3f} ms CPU ({100 * judged / cpu:.1f} % of the pass)")
    print(f"the compute report's: {reported * 1000:.3f} ms CPU ({100 * reported / cpu:.1f} % of the pass)")
    print(f"hardware: {describe()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--containers", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--passes", type=int, default=200)
    p.add_argument("--interval", type=float, default=5.0, help="the sampler's interval, seconds (the default)")
    args = p.parse_args()
    bench(args.containers, args.gpus, args.passes, args.interval)


if __name__ == "__main__":
    main()
