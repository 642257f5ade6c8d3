"""Usage documents as device plugins serve them, and their samples, for the metrics API's tests."""

from __future__ import annotations

from datetime import UTC, datetime

from vgpu.contract.usage import ContainerUsage, NodeUsage, Unattributed
from vgpu.usage_samples import Snapshot, node_samples, snapshot

GI = 1024**3
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp()  # when the builders' documents are sampled


def used(
    pod: str,
    *,
    namespace: str = "team-a",
    container: str = "main",
    gpu: str = "GPU-0",
    tflops: int = 10_000,
    vram: int = 2 * GI,
    request: int = 20_000,
    limit: int = 40_000,
    vram_request: int = 4 * GI,
    vram_limit: int = 8 * GI,
    measured: bool = True,
) -> ContainerUsage:
    """One container's use of one GPU: TFLOPS in milli, its pod's grant there beside it."""
    return ContainerUsage(
        namespace=namespace,
        pod=pod,
        pod_uid=f"uid-{namespace}-{pod}",
        container=container,
        gpu=gpu,
        tflops_used=tflops,
        vram_used=vram,
        tflops_measured=measured,
        tflops_request=request,
        tflops_limit=limit,
        vram_request=vram_request,
        vram_limit=vram_limit,
    )


def node_usage(
    node: str,
    *containers: ContainerUsage,
    at: float = T0,
    interval_s: float = 5.0,
    unattributed: tuple[Unattributed, ...] = (),
) -> NodeUsage:
    stamp = datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
    return NodeUsage(node=node, sampled_at=stamp, interval_s=interval_s, containers=containers,
                     unattributed=unattributed)  # fmt: skip


def samples_of(*usages: NodeUsage) -> Snapshot:
    nodes, pods = [], []
    for u in usages:
        node, on_node = node_samples(u)
        nodes.append(node)
        pods.extend(on_node)
    return snapshot(nodes, pods)
