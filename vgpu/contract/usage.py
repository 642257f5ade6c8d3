"""Per-container GPU usage: what a device plugin measured on its node, as it serves it on ``/usage``.

The device plugin samples its GPUs (per-process SM share and memory), maps each process to its pod and
container, and keeps the latest figures per container and GPU. Everything that needs *use* rather than
*reservation* — the custom-metrics API (HPA), ``tfctl top``, the autoscaler — reads this document from
the plugins instead of a Prometheus the user may not have. Versioned JSON, decoded strictly like every
contract between the binaries. TFLOPS in milli, bytes for memory, RFC 3339 times.

A process that could not be mapped to a container is not dropped: its use is counted per GPU under
``unattributed``. Where the driver reports no per-process utilisation (older drivers, MIG instances),
only memory is measured: ``tflopsMeasured`` is false and ``tflopsUsed`` is 0 by convention, so that no
reader takes "not measured" for "idle" (an autoscaler would scale such a workload down).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from vgpu.contract.strict import Reader, dump, load
from vgpu.quantity import format_bytes, format_milli, parse_bytes, parse_milli

VERSION: Final = "v1"
NAME: Final = "node usage"
PATH: Final = "/usage"  # on the device plugin's metrics port


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerUsage:
    """One container's use of one GPU at the last sample, beside what it reserved and may use."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    gpu: str  # GPU (or MIG instance) UUID
    tflops_used: int
    vram_used: int
    tflops_measured: bool  # False: the driver gives no per-process utilisation here; tflops_used is 0
    tflops_request: int
    tflops_limit: int
    vram_request: int
    vram_limit: int


PodGpu = tuple[str, str]  # (pod UID, GPU UUID): a pod's containers on one GPU, taken together


def per_pod_gpu(rows: Iterable[ContainerUsage]) -> dict[PodGpu, list[ContainerUsage]]:
    """``rows`` by pod and GPU, in their order: what a pod holds and uses of a GPU is its containers' sum there."""
    out: dict[PodGpu, list[ContainerUsage]] = {}
    for c in rows:
        out.setdefault((c.pod_uid, c.gpu), []).append(c)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Unattributed:
    """Use on one GPU by processes no container could be found for (exited, not ours, unknown cgroup)."""

    gpu: str
    processes: int
    tflops_used: int
    vram_used: int
    tflops_measured: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeUsage:
    node: str
    sampled_at: str  # RFC 3339, the plugin's clock
    interval_s: float  # how often the plugin samples: figures older than two intervals are stale
    containers: tuple[ContainerUsage, ...]
    unattributed: tuple[Unattributed, ...] = ()


def encode(usage: NodeUsage) -> str:
    return dump(
        {
            "version": VERSION,
            "node": usage.node,
            "sampledAt": usage.sampled_at,
            "intervalSeconds": usage.interval_s,
            "containers": [
                {
                    "namespace": c.namespace,
                    "pod": c.pod,
                    "podUID": c.pod_uid,
                    "container": c.container,
                    "gpu": c.gpu,
                    "tflopsUsed": format_milli(c.tflops_used),
                    "vramUsed": format_bytes(c.vram_used),
                    "tflopsMeasured": c.tflops_measured,
                    "tflopsRequest": format_milli(c.tflops_request),
                    "tflopsLimit": format_milli(c.tflops_limit),
                    "vramRequest": format_bytes(c.vram_request),
                    "vramLimit": format_bytes(c.vram_limit),
                }
                for c in usage.containers
            ],
            "unattributed": [
                {
                    "gpu": u.gpu,
                    "processes": u.processes,
                    "tflopsUsed": format_milli(u.tflops_used),
                    "vramUsed": format_bytes(u.vram_used),
                    "tflopsMeasured": u.tflops_measured,
                }
                for u in usage.unattributed
            ],
        }
    )


def decode(text: str) -> NodeUsage:
    r = load(text, NAME, (VERSION,))
    usage = NodeUsage(
        node=r.text("node"),
        sampled_at=r.text("sampledAt"),
        interval_s=r.positive_number("intervalSeconds"),
        containers=r.items("containers", _container),
        unattributed=r.items("unattributed", _unattributed),
    )
    r.done()
    return usage


def _container(r: Reader) -> ContainerUsage:
    c = ContainerUsage(
        namespace=r.text("namespace"),
        pod=r.text("pod"),
        pod_uid=r.text("podUID"),
        container=r.text("container"),
        gpu=r.text("gpu"),
        tflops_used=r.quantity("tflopsUsed", parse_milli),
        vram_used=r.quantity("vramUsed", parse_bytes),
        tflops_measured=r.flag("tflopsMeasured"),
        tflops_request=r.quantity("tflopsRequest", parse_milli),
        tflops_limit=r.quantity("tflopsLimit", parse_milli),
        vram_request=r.quantity("vramRequest", parse_bytes),
        vram_limit=r.quantity("vramLimit", parse_bytes),
    )
    r.done()
    return c


def _unattributed(r: Reader) -> Unattributed:
    u = Unattributed(
        gpu=r.text("gpu"),
        processes=r.integer("processes"),
        tflops_used=r.quantity("tflopsUsed", parse_milli),
        vram_used=r.quantity("vramUsed", parse_bytes),
        tflops_measured=r.flag("tflopsMeasured"),
    )
    r.done()
    return u
