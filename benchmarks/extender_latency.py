"""Extender latency and memory at cluster scale, over real HTTP.

Starts the extender (uvicorn, in a subprocess) on an in-memory API server holding N nodes × 8 GPUs
(A100 80Gi / 312 TFLOPS) and 1.25 × GPUs pods with allocations (the even fill: about 50% of VRAM
and TFLOPS reserved); then asks for a 1-GPU pod of 20 TFLOPS / 8 GiB, which fits on every node of the
even fill (every node is judged and scored), as kube-scheduler does in the nodeCacheCapable form: filter,
then prioritize of the passed nodes when more than one passed. It reports p50/p99 per verb and for the
decision ("pair"), decisions/s, the share of nodes that passed the filter, the share of decisions that
called prioritize, and the server's RSS after the first list.

Two cluster fills (``--fill``):
- ``even`` (the default): pod j on GPU j mod GPUs, each 125 TFLOPS / 32 GiB, so nodes come in two
  states (16 or 8 pods). The extender judges each node state once per cold decision, so this is the
  best case for that: most clusters have many nodes alike (empty ones, full ones, ones packed alike).
- ``mixed``: the same number of pods, each of one of four sizes (20-156 TFLOPS, 4-40 GiB), on a GPU
  drawn at random (seeded, ``--seed``; a draw that does not fit is skipped): almost every node is in a
  state of its own, the worst case for the state sharing, and some nodes reject the pending pod (the
  rejection's explanation is the slower path).

Two request shapes, both reported:
- ``warm``: the same pod request every round (replicas of one workload). The extender's per-node
  memo answers all but the one or two nodes whose state changed (the pod's own tentative
  reservation, released by filter and taken again by prioritize).
- ``cold``: a request the extender has never seen every round (the VRAM request differs by 1 MiB),
  so the core judges and scores every node: the first pod of a new workload.

The client is one keep-alive ``http.client`` connection (as light as Python gets; kube-scheduler's
Go client is lighter still), so the figures are mostly the server's; ``--client httpx`` times with
httpx instead (what this benchmark used first: it adds client-side cost to every figure).

    .venv/bin/python benchmarks/extender_latency.py                 # 1,000 and 5,000 nodes
    .venv/bin/python benchmarks/extender_latency.py --nodes 5000 --rounds 300
    git worktree add /tmp/before HEAD~1 && \
    .venv/bin/python benchmarks/extender_latency.py --nodes 5000 --fill mixed --against /tmp/before

``--against`` runs a server on another checkout's extender code beside this one's and times them in
turns, request by request, printing both and the ratio of their pair times: on a machine whose speed
drifts, the only before/after comparison that holds.

Targets: p99 filter+prioritize ≤ 5 ms at 1,000 nodes, ≤ 20 ms at 5,000 (warm), ≤ 40 ms at 5,000
(cold, issue 14); RSS ≤ 300 MB at 5,000 nodes / 40,000 GPUs / 50,000 pods.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
# The extender code the server runs: this checkout, or another one given with --against.
CODE_ENV = "TF_BENCH_CODE"
sys.path.insert(0, os.environ.get(CODE_ENV, str(ROOT)))

from scheduler_extender.gateway import Kind, PodEvent  # noqa: E402
from tf_shell.kube.api import Listing, RawObject, WatchEvent  # noqa: E402
from vgpu.contract import allocation as allocation_contract  # noqa: E402
from vgpu.contract import inventory as inventory_contract  # noqa: E402
from vgpu.contract import resolved as resolved_contract  # noqa: E402
from vgpu.contract.allocation import GpuGrant, Handoff, PodAllocation  # noqa: E402
from vgpu.contract.inventory import GpuInfo, NodeInventory  # noqa: E402
from vgpu.names import EnforcementBackend, Qos, SystemAnnotation  # noqa: E402
from vgpu.request import GpuRequest  # noqa: E402

GI = 1024**3
GPUS_PER_NODE = 8
GPU_TFLOPS, GPU_VRAM = 312_000, 80 * GI
POD_TFLOPS, POD_VRAM = 125_000, 32 * GI  # 1.25 pods per GPU on average ≈ 50% of capacity


def node_object(i: int) -> RawObject:
    name = f"node-{i:05d}"
    inv = NodeInventory(
        node=name,
        pool="default-pool",
        gpus=tuple(
            GpuInfo(uuid=f"GPU-{i:05d}-{g}", index=g, model="NVIDIA A100-SXM4-80GB", tflops=GPU_TFLOPS, vram=GPU_VRAM)
            for g in range(GPUS_PER_NODE)
        ),
        slices_per_gpu=SLOTS_PER_GPU,
        backend=EnforcementBackend.HAMI_CORE,
        heartbeat="2026-01-01T00:00:00Z",
    )
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {SystemAnnotation.NODE_INVENTORY.value: inventory_contract.encode(inv)},
        }
    }


def request(tflops: int, vram: int) -> GpuRequest:
    return GpuRequest(
        pool="default-pool",
        containers=("main",),
        gpu_count=1,
        tflops_request=tflops,
        tflops_limit=tflops,
        vram_request=vram,
        vram_limit=vram,
        qos=Qos.MEDIUM,
    )


MIXED_SIZES = ((20_000, 4 * GI), (50_000, 10 * GI), (125_000, 32 * GI), (156_000, 40 * GI))
SLOTS_PER_GPU = 4


def layout(fill: str, gpus: int, pods: int, seed: int) -> list[tuple[int, int, int]]:
    """(GPU, TFLOPS, VRAM) of each pod: see the module docstring."""
    if fill == "even":
        return [(j % gpus, POD_TFLOPS, POD_VRAM) for j in range(pods)]
    rng = random.Random(seed)
    used: dict[int, tuple[int, int, int]] = {}
    placed: list[tuple[int, int, int]] = []
    for _ in range(pods):
        gpu = rng.randrange(gpus)
        tflops, vram = rng.choice(MIXED_SIZES)
        t, v, n = used.get(gpu, (0, 0, 0))
        if t + tflops <= GPU_TFLOPS and v + vram <= GPU_VRAM and n < SLOTS_PER_GPU:
            used[gpu] = (t + tflops, v + vram, n + 1)
            placed.append((gpu, tflops, vram))
    return placed


def pod_object(j: int, gpu: int, tflops: int = POD_TFLOPS, vram: int = POD_VRAM, name: str | None = None) -> RawObject:
    name = name or f"pod-{j:06d}"
    uid = f"uid-{j:06d}"
    node = f"node-{gpu // GPUS_PER_NODE:05d}"
    grant = GpuGrant(
        uuid=f"GPU-{gpu // GPUS_PER_NODE:05d}-{gpu % GPUS_PER_NODE}",
        index=gpu % GPUS_PER_NODE,
        tflops_request=tflops,
        tflops_limit=tflops,
        vram_request=vram,
        vram_limit=vram,
        gpu_tflops=GPU_TFLOPS,
    )
    alloc = PodAllocation(
        pod_uid=uid,
        node=node,
        pool="default-pool",
        qos=Qos.MEDIUM,
        containers=("main",),
        gpus=(grant,),
        bound_at="2026-01-01T00:00:00Z",
    )
    receipt = Handoff(pod_uid=uid, node=node, devices=(("main", ("dev",)),), at="2026-01-01T00:00:01Z")
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid,
            "labels": {"tensor-fusion.ai/enabled": "true", "app": "bench"},
            "annotations": {
                SystemAnnotation.RESOLVED_REQUEST.value: resolved_contract.encode(request(tflops, vram)),
                SystemAnnotation.ALLOCATION.value: allocation_contract.encode(alloc),
                SystemAnnotation.HANDOFF.value: allocation_contract.encode_handoff(receipt),
            },
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.invalid/app:1"}]},
        "status": {"phase": "Running"},
    }


class StaticCluster:
    """A KubeGateway whose list builds the cluster on demand and whose watch never has news."""

    def __init__(self, nodes: int, pods: int, fill: str = "even", seed: int = 0) -> None:
        self.nodes = nodes
        self.pods = layout(fill, nodes * GPUS_PER_NODE, pods, seed)
        self.stop = threading.Event()
        self.lease_reads = 0

    def list(self, kind: Kind) -> Listing:
        if kind is Kind.NODE:
            return Listing([node_object(i) for i in range(self.nodes)], "1")
        return Listing([pod_object(j, *pod) for j, pod in enumerate(self.pods)], "1")

    def watch(self, kind: Kind, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:  # noqa: ARG002
        self.stop.wait(timeout_seconds)
        return iter(())

    def get_pod(self, namespace: str, name: str) -> RawObject | None:  # noqa: ARG002
        return None

    def get_lease(self, namespace: str, name: str) -> RawObject:  # noqa: ARG002
        """A lease another replica renews at every read: this one follows, so what is timed is the verbs
        every replica serves, without the leader's background passes (status, autoscaler) beside them."""
        self.lease_reads += 1
        return {
            "metadata": {"name": name, "resourceVersion": str(self.lease_reads)},
            "spec": {"holderIdentity": "another-replica", "leaseDurationSeconds": 15},
        }

    def patch_pod_annotations(self, namespace: str, name: str, uid: str, changes: Mapping[str, str | None]) -> None:  # noqa: ARG002
        return None

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:  # noqa: ARG002
        return None

    def record_event(self, event: PodEvent) -> None:  # noqa: ARG002
        return None

    def list_resources(self, plural: str) -> list[dict[str, object]]:  # noqa: ARG002
        return []

    def patch_resource_status(self, plural: str, namespace: str | None, name: str, body: dict[str, object]) -> None:  # noqa: ARG002
        return None


def serve(nodes: int, pods: int, fill: str, seed: int, port: int) -> None:
    import uvicorn

    from scheduler_extender.app import create_app
    from scheduler_extender.settings import Settings

    app = create_app(Settings(), StaticCluster(nodes, pods, fill, seed))
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, loop="uvloop", http="httptools"
    )


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def pending_body(nodes: int, vram: int) -> bytes:
    """A filter/prioritize body for a 1-GPU pod asking 20 TFLOPS and ``vram``, offering every node by name."""
    pending = pod_object(10**7, 0, name="bench-pending")
    pending["metadata"]["annotations"] = {
        SystemAnnotation.RESOLVED_REQUEST.value: resolved_contract.encode(request(20_000, vram))
    }
    del pending["spec"]["nodeName"]
    names = [f"node-{i:05d}" for i in range(nodes)]
    return json.dumps({"Pod": pending, "Nodes": None, "NodeNames": names}).encode()


Client = http.client.HTTPConnection | httpx.Client


def post(conn: Client, path: str, body: bytes) -> bytes:
    if isinstance(conn, httpx.Client):
        reply = conn.post(path, content=body, headers={"Content-Type": "application/json"})
        assert reply.status_code == 200, reply.text[:200]
        return reply.content
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    assert response.status == 200, data[:200]
    return data


def prioritize_body(body: bytes, passed: list[str]) -> bytes:
    """What kube-scheduler sends prioritize after that filter: the same pod, offering the nodes that passed."""
    args = json.loads(body)
    return json.dumps({**args, "NodeNames": passed}).encode()


def rounds_of(conns: list[Client], bodies: Iterator[bytes], rounds: int, nodes: int) -> list[dict[str, Any]]:
    """Time each body's decision on each server as kube-scheduler makes it: filter, then prioritize of the nodes
    that passed when more than one did (one passed node is bound without scoring). The servers go in turns (which
    goes first alternates by round, so a slow moment of the machine falls on each alike); the replies are checked
    after the clock stops. ``pair`` is the decision's time, prioritize's when called."""
    timings: list[dict[str, list[float]]] = [{"filter": [], "prioritize": [], "pair": []} for _ in conns]
    passed = [0] * len(conns)
    prioritized = [0] * len(conns)
    for i in range(rounds):
        body = next(bodies)
        order = range(len(conns)) if i % 2 == 0 else range(len(conns) - 1, -1, -1)
        for k in order:
            t0 = time.perf_counter()
            f = post(conns[k], "/filter", body)
            names = json.loads(f)["NodeNames"]
            t1 = time.perf_counter()
            p = post(conns[k], "/prioritize", prioritize_body(body, names)) if len(names) > 1 else None
            t2 = time.perf_counter()
            reply = json.loads(f)
            judged = [reply["NodeNames"], reply.get("FailedNodes") or {}, reply.get("FailedAndUnresolvableNodes") or {}]
            assert names and sum(map(len, judged)) <= nodes, f[:200]
            assert p is None or len(json.loads(p)) == len(names)
            passed[k] += len(names)
            timings[k]["filter"].append(t1 - t0)
            if p is not None:
                prioritized[k] += 1
                timings[k]["prioritize"].append(t2 - t1)
            timings[k]["pair"].append(t2 - t0)
    results: list[dict[str, Any]] = []
    for times, fitted, scored in zip(timings, passed, prioritized, strict=True):
        result: dict[str, Any] = {}
        for verb, values in times.items():
            if values:
                result[f"{verb}_p50_ms"] = round(statistics.median(values) * 1000, 2)
                result[f"{verb}_p99_ms"] = round(percentile(values, 0.99) * 1000, 2)
        result["decisions_per_s"] = round(1 / statistics.mean(times["pair"]), 1)
        result["nodes_passed"] = round(fitted / rounds / nodes, 3)
        result["prioritized"] = round(scored / rounds, 3)
        results.append(result)
    return results


def start(code: Path, nodes: int, pods: int, fill: str, seed: int) -> tuple[subprocess.Popen[bytes], int, float]:
    """A server running ``code``'s extender, once ready: the process, its port and the seconds it took."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(code), CODE_ENV: str(code)}
    cmd = [sys.executable, __file__, "--serve", "--nodes", str(nodes), "--pods", str(pods), "--port", str(port)]
    cmd += ["--fill", fill, "--seed", str(seed)]
    server = subprocess.Popen(cmd, env=env)
    started = time.monotonic()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        while True:
            try:
                if client.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() - started > 600:
                raise RuntimeError(f"extender of {code} did not become ready")
            time.sleep(0.2)
    return server, port, time.monotonic() - started


def measure(
    code: list[Path], nodes: int, pods: int, fill: str, seed: int, rounds: int, client_kind: str
) -> list[dict[str, Any]]:
    """One result per checkout in ``code``, their servers measured in turns (see rounds_of)."""
    servers: list[subprocess.Popen[bytes]] = []
    try:
        ports, syncs = [], []
        for checkout in code:  # one at a time: each sync has the machine to itself
            server, port, sync_s = start(checkout, nodes, pods, fill, seed)
            servers.append(server)
            ports.append(port)
            syncs.append(sync_s)
        time.sleep(1.0)
        rss = [rss_mb(server.pid) for server in servers]
        conns: list[Client] = [
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
            if client_kind == "httpx"
            else http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            for port in ports
        ]
        warm = pending_body(nodes, 8 * GI)
        rounds_of(conns, iter([warm] * 20), 20, nodes)  # warm-up, not reported
        warm_results = rounds_of(conns, iter([warm] * rounds), rounds, nodes)
        cold = (pending_body(nodes, 8 * GI + (i + 1) * 1024**2) for i in range(rounds))
        cold_results = rounds_of(conns, cold, rounds, nodes)
        for conn in conns:
            conn.close()
        results = []
        for k, checkout in enumerate(code):
            result: dict[str, Any] = {"code": str(checkout), "nodes": nodes, "gpus": nodes * GPUS_PER_NODE}
            result |= {"fill": fill, "pods": len(layout(fill, nodes * GPUS_PER_NODE, pods, seed))}
            result |= {"client": client_kind, "sync_s": round(syncs[k], 1)}
            result |= {"warm": warm_results[k], "cold": cold_results[k]}
            result |= {"rss_mb_ready": round(rss[k], 1), "rss_mb_after": round(rss_mb(servers[k].pid), 1)}
            results.append(result)
        return results
    finally:
        for server in servers:
            server.terminate()
            server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="node counts (default 1000 and 5000)")
    parser.add_argument("--pods", type=int, help="pods with allocations (default 1.25 × GPUs)")
    parser.add_argument("--rounds", type=int, default=200, help="filter+prioritize pairs measured per size")
    parser.add_argument("--fill", choices=("even", "mixed"), default="even", help="how the pods fill the GPUs")
    parser.add_argument("--seed", type=int, default=0, help="the mixed fill's draws")
    parser.add_argument(
        "--against",
        type=Path,
        action="append",
        default=[],
        help="another checkout (e.g. a git worktree of the code before a change) measured in turns with this one",
    )
    parser.add_argument(
        "--client", choices=("http.client", "httpx"), default="http.client", help="HTTP client timing the verbs"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.nodes[0], args.pods, args.fill, args.seed, args.port)
        return
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in lines if "model name" in line), platform.processor())
    print(f"hardware: {cpu}, {os.cpu_count()} CPUs; Python {platform.python_version()}; client and server on one host")
    for nodes in args.nodes or [1000, 5000]:
        pods = args.pods or nodes * GPUS_PER_NODE * 5 // 4
        results = measure([ROOT, *args.against], nodes, pods, args.fill, args.seed, args.rounds, args.client)
        for result in results:
            print(json.dumps(result))
        for other in results[1:]:
            ratios = {
                f"{phase}_{q}": round(other[phase][f"pair_{q}_ms"] / results[0][phase][f"pair_{q}_ms"], 2)
                for phase in ("warm", "cold")
                for q in ("p50", "p99")
            }
            print(json.dumps({"pair time, " + other["code"] + " / this checkout": ratios}))


if __name__ == "__main__":
    main()
