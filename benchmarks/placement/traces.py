"""Read the openb node and pod lists and turn them into the scheduling core's values.

The trace describes GPU shares with one scalar (``gpu_milli`` of one GPU, any model), while the
core reserves compute (milli-TFLOPS) and memory (bytes) separately. We map the trace exactly onto
the core by giving every GPU the same :data:`GPU_UNITS` of compute and of memory, so that a pod's
compute fraction = memory fraction = ``gpu_milli / 1000`` of the node's GPU (stated in every
report). Allowed GPU models (``gpu_spec``, ``A|B``) become a required node affinity on the
``tensor-fusion.ai/gpu-model`` label that every replayed node carries — what a user would write.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from vgpu.names import LABEL_NODE_GPU_MODEL
from vgpu.quantity import MIB
from vgpu.scheduling.affinity import REQUIRED
from vgpu.scheduling.model import Demand, GpuState, NodeState

MILLI: Final = 1000  # one GPU in trace units
GPU_UNITS: Final = 1000  # compute (milli-TFLOPS) and memory (MiB) of every replayed GPU
MAPPING_NOTE: Final = (
    "trace → core mapping: every GPU = 1000 compute units and 1000 MiB; a pod's compute fraction = "
    "memory fraction = gpu_milli/1000 of one GPU (1-D, as in the paper); gpu_spec → node affinity on the GPU model"
)
DEFAULT_TRACES: Final = Path("/work/shared/bench/traces/openb")
NODE_FILE: Final = "openb_node_list_gpu_node.csv"
TRACE_NAMES: Final = (
    "default",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One row of the node list."""

    name: str
    cpu: int  # millicores
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    """One row of a pod list (qos, phase and times are ignored by the protocol)."""

    name: str
    cpu: int  # millicores
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU, clipped to 0..1000
    gpu_spec: tuple[str, ...] = ()  # allowed models, empty = any

    @property
    def gpu_request(self) -> int:
        """Total GPU request in milli-GPUs (what "arrived" counts)."""
        return self.num_gpu * self.gpu_milli if self.num_gpu > 0 else 0


def _int(row: dict[str, str], key: str) -> int:
    text = (row.get(key) or "0").strip()
    return int(float(text)) if text else 0


def read_nodes(path: Path) -> list[TraceNode]:
    with path.open(newline="") as f:
        return [
            TraceNode(
                r["sn"], _int(r, "cpu_milli"), _int(r, "memory_mib"), _int(r, "gpu"), (r.get("model") or "").strip()
            )
            for r in csv.DictReader(f)
        ]


def read_pods(path: Path) -> list[TracePod]:
    pods: list[TracePod] = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            spec = tuple(s for s in (r.get("gpu_spec") or "").strip().split("|") if s)
            num_gpu = _int(r, "num_gpu")
            milli = min(max(_int(r, "gpu_milli"), 0), MILLI) if num_gpu > 0 else 0
            pods.append(TracePod(r["name"], _int(r, "cpu_milli"), _int(r, "memory_mib"), num_gpu, milli, spec))
    return pods


def pod_file(traces: Path, name: str) -> Path:
    return traces / f"openb_pod_list_{name}.csv"


def model_affinity(models: Sequence[str]) -> dict[str, Any] | None:
    """A required node affinity selecting nodes whose GPU model is one of ``models`` (None: any)."""
    if not models:
        return None
    expression = {"key": LABEL_NODE_GPU_MODEL, "operator": "In", "values": list(models)}
    return {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}}


def to_node_state(node: TraceNode) -> NodeState:
    gpus = tuple(
        GpuState(uuid=f"{node.name}-gpu{i}", index=i, model=node.model, tflops=GPU_UNITS, vram=GPU_UNITS * MIB)
        for i in range(node.gpus)
    )
    return NodeState(
        name=node.name,
        pool="openb",
        labels={LABEL_NODE_GPU_MODEL: node.model},
        gpus=gpus,
        cpu_free=node.cpu,
        memory_free=node.memory_mib * MIB,
    )


def to_demand(pod: TracePod, key: str) -> Demand:
    """The core's Demand for a trace pod; ``key`` makes inflated copies distinct."""
    whole = pod.num_gpu > 0 and pod.gpu_milli >= MILLI
    share = GPU_UNITS if whole else pod.gpu_milli * GPU_UNITS // MILLI
    return Demand(
        pod_key=key,
        gpu_count=pod.num_gpu if pod.gpu_milli > 0 else 0,
        tflops=share,
        vram=share * MIB,
        tflops_limit=share,
        vram_limit=share * MIB,
        node_affinity=model_affinity(pod.gpu_spec),
        whole_gpu=whole,
        cpu=pod.cpu,
        memory=pod.memory_mib * MIB,
    )
