"""Allocate latency with 50 pods in flight on one node, over the plugin's real unix socket.

Runs the real plugin assembly (fake GPU file instead of NVML, in-memory Kubernetes instead of an
API server) against the test kubelet, and drives it the way the extender and kubelet do:

* ``handoff``: for each of N pods the extender writes the allocation on the pod (the per-node gate
  admits one pod at a time) and the kubelet calls Allocate at once, racing the watch, so latency
  includes the event-driven wait for the pod cache; the earlier pods stay on the node, so every
  lookup scans all of them.
* ``reboot``: all N pods hold receipts and the kubelet re-allocates every one concurrently (node
  reboot): N Allocate RPCs in flight at the same time. Each still decides on a LIST begun after it
  arrived, shared with the Allocates that arrived while the previous LIST was in flight
  (:mod:`device_plugin.kubelet.fresh_read`), so the burst costs a LIST per round trip, not one each.

Prints p50/p99/max per mode, the process's peak RSS and the hardware. Target: p99 ≤ 10 ms. The RSS
counts what the real daemon loads but this run does not use, the Kubernetes client
(:mod:`device_plugin.cluster.kube`) and pynvml (:mod:`device_plugin.gpus.nvml_backend`), both imported first;
it also counts the test kubelet and the in-memory API sharing the process, and leaves out what
only a real node pays: the NVML driver library that ``nvmlInit`` loads and the Kubernetes client's
connections and watch buffers.

    .venv/bin/python -m benchmarks.allocate_latency [--pods 50]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path

from device_plugin.gpus.slices import slice_id
from tests.device_plugin.fakes import GPU0, GPU1, FakeKube, allocation, gpu_file, grant, make_pod, uid_of
from tests.device_plugin.harness import plugin
from vgpu.names import SystemAnnotation

# What the real daemon imports but this run never calls: loaded anyway so that the RSS counts them.
DAEMON_ONLY_MODULES = ("device_plugin.cluster.kube", "device_plugin.gpus.nvml_backend")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(name: str, seconds: list[float]) -> None:
    ms = [s * 1000 for s in seconds]
    print(
        f"{name:8s} n={len(ms):3d}  p50={percentile(ms, 0.5):6.2f} ms  p99={percentile(ms, 0.99):6.2f} ms  "
        f"max={max(ms):6.2f} ms  mean={statistics.fmean(ms):6.2f} ms"
    )


async def bench(pods: int) -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        specs = [make_pod(f"pod-{i:03d}") for i in range(pods)]
        kube = FakeKube(specs)
        slices_per_gpu = (pods + 1) // 2
        async with plugin(tmp, kube, gpu_file(tmp / "gpus.yaml"), slices_per_gpu=slices_per_gpu) as (_, kubelet):
            ids: list[str] = []
            handoff: list[float] = []
            for i, pod in enumerate(specs):
                gpu = (GPU0, GPU1)[i % 2]
                device = slice_id(gpu, i // 2)
                ids.append(device)
                text = allocation(uid_of(pod), gpus=[grant(gpu, index=i % 2, tflops=1000)])
                began = time.perf_counter()
                kube.annotate(uid_of(pod), SystemAnnotation.ALLOCATION.value, text)
                await kubelet.allocate(device, pod=pod["metadata"]["name"])
                handoff.append(time.perf_counter() - began)
                while kube.annotation(uid_of(pod), SystemAnnotation.HANDOFF.value) is None:  # the gate opens
                    await asyncio.sleep(0.0005)
            report("handoff", handoff)

            async def timed(device: str) -> float:
                began = time.perf_counter()
                await kubelet.allocate(device)
                return time.perf_counter() - began

            report("reboot", list(await asyncio.gather(*(timed(d) for d in ids))))
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS {rss_mib:.1f} MiB (plugin with its Kubernetes client and pynvml loaded, + test kubelet)")
    print(
        f"hardware: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=50)
    args = parser.parse_args()
    for name in DAEMON_ONLY_MODULES:
        importlib.import_module(name)
    asyncio.run(bench(args.pods))


if __name__ == "__main__":
    main()
