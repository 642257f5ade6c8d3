"""``scripts/demo``: a local cluster with fake GPU nodes runs deploy/examples/, then shows what each pod got.

WHY: the first thing a newcomer runs. It uses the same cluster as the end-to-end tests (real
API server, scheduler, kubelet; our webhook, extender and device plugin), so what it prints is
what the tests check: pod → node, GPU UUID, TFLOPS and VRAM granted, and the env one container
was created with. Everything is stopped before it returns.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from vgpu.names import LABEL_ENABLED, Env
from vgpu.quantity import format_bytes, format_milli

from . import deploy
from .cluster import REAL_NODE, Cluster
from .fake_nodes import gpus
from .kube import apply, eventually
from .pods import allocation_of, created_env

NAMESPACE = "demo"


def rows(pods: Sequence[Any]) -> list[tuple[str, ...]]:
    out = [("POD", "NODE", "GPU", "TFLOPS req/limit", "VRAM req/limit", "PHASE")]
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        alloc = allocation_of(pod)
        for grant in alloc.gpus:
            out.append(
                (
                    pod.metadata.name,
                    pod.spec.node_name,
                    grant.uuid,
                    f"{format_milli(grant.tflops_request)}/{format_milli(grant.tflops_limit)}",
                    f"{format_bytes(grant.vram_request)}/{format_bytes(grant.vram_limit)}",
                    pod.status.phase,
                )
            )
    return out


def table(lines: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in lines)


def run(keep: bool) -> None:
    started = time.monotonic()
    with Cluster(gpus=gpus("demo0", 4), keep_root=keep) as cluster:
        print(f"cluster up in {time.monotonic() - started:.0f}s (logs under {cluster.root})")
        cluster.add_fake_node("demo-fake-a100", gpus("demo1", 2))
        cluster.add_fake_node("demo-fake-h100", gpus("demo2", 2, "NVIDIA H100 80GB HBM3"))
        cluster.namespace(NAMESPACE)
        docs = deploy.examples()
        apply(cluster.admin, docs, namespace=NAMESPACE)
        print(f"applied deploy/examples/: {', '.join(d['kind'] + '/' + d['metadata']['name'] for d in docs)}")
        wanted = sum(int(d["spec"].get("replicas", 1)) for d in docs if d["kind"] == "Deployment")

        def scheduled() -> list[Any] | None:
            pods = cluster.core.list_namespaced_pod(NAMESPACE, label_selector=f"{LABEL_ENABLED}=true").items
            done = [p for p in pods if p.spec.node_name and p.metadata.annotations]
            placed = [p for p in done if p.status.phase == "Running" or p.spec.node_name != REAL_NODE]
            return placed if len(placed) >= wanted else None

        pods = eventually(f"{wanted} example pods placed", scheduled, timeout=180)
        print()
        print(table(rows(pods)))
        on_kubelet = [p for p in pods if p.status.phase == "Running"]
        if on_kubelet:
            pod = on_kubelet[0]
            container = pod.spec.containers[0].name
            env = created_env(cluster.node, pod, container)
            print(f"\nenv of {pod.metadata.name}/{container} as the kubelet created it (fake runtime's record):")
            for key in sorted(env):
                if key.startswith(("NVIDIA_", "TENSOR_FUSION_", "CUDA_")) or key == Env.NVIDIA_VISIBLE_DEVICES:
                    print(f"  {key}={env[key]}")
        print("\nstopping the cluster")
    print(f"demo took {time.monotonic() - started:.0f}s")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the cluster's logs and data directory")
    args = parser.parse_args(argv)
    run(keep=args.keep)


if __name__ == "__main__":
    main()
