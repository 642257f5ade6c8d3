"""One line that says why a pod does not fit, for the FailedScheduling event and the CLI.

kube-scheduler prints "0/12 nodes are available: 12 Insufficient cpu" — counts per reason. With
per-node GPU messages that line would repeat a dozen UUIDs, so we group by reason code and keep
only the most useful figure per group: how much the pod needs and the most any node has free,
e.g. ``0/12 nodes: 5 insufficient VRAM (need 4Gi per GPU, most free 2Gi on A100), 7 GPU model T4
not in [A100]``. Largest group first; the figures come from :class:`Reason`'s numeric fields.
"""

from __future__ import annotations

from collections.abc import Sequence

from vgpu import compute_percent
from vgpu.names import RESOURCE_VGPU
from vgpu.quantity import humanize_bytes, humanize_tflops
from vgpu.scheduling.filter import FilterResult
from vgpu.scheduling.model import Demand
from vgpu.scheduling.reasons import Reason, ReasonCode

R = ReasonCode
_ORDER = {code: i for i, code in enumerate(ReasonCode)}


def summarize(demand: Demand, result: FilterResult) -> str:
    """``<passed>/<total> nodes: <count> <reason> (<figure>), …`` grouped by reason, largest group first."""
    head = f"{len(result.passed)}/{result.total} nodes"
    ordered = _groups(result)
    if not ordered:
        return f"{head} fit"
    return f"{head}: " + ", ".join(f"{len(rs)} {_phrase(code, demand, rs)}" for code, rs in ordered)


def leading_reason(result: FilterResult) -> ReasonCode | None:
    """The reason that rejected the most nodes — the one :func:`summarize` names first; None when none was rejected."""
    ordered = _groups(result)
    return ordered[0][0] if ordered else None


def _groups(result: FilterResult) -> list[tuple[ReasonCode, list[Reason]]]:
    """The rejections grouped by reason code, largest group first (ties in the order of ReasonCode)."""
    groups: dict[ReasonCode, list[Reason]] = {}
    for reason in (*result.unresolvable.values(), *result.failed.values()):
        groups.setdefault(reason.code, []).append(reason)
    return sorted(groups.items(), key=lambda item: (-len(item[1]), _ORDER[item[0]]))


def _phrase(code: ReasonCode, d: Demand, rs: Sequence[Reason]) -> str:
    best = max(rs, key=lambda r: r.free)
    where = f" on {best.gpu_model}" if best.gpu_model else ""
    compute = f"{humanize_tflops(d.tflops)} TFLOPS"
    if d.compute_percent is not None:  # a share of each node's GPUs: its TFLOPS differ by node
        compute = f"{compute_percent.show(d.compute_percent)} of a GPU"
    share = f"{compute} / {humanize_bytes(d.vram_held)}"
    match code:
        case R.INSUFFICIENT_VRAM:
            need, free = humanize_bytes(d.vram_held), humanize_bytes(best.free)
            return f"insufficient VRAM (need {need} per GPU, most free {free}{where})"
        case R.INSUFFICIENT_TFLOPS:
            need, free = humanize_tflops(best.requested), humanize_tflops(best.free)
            if d.compute_percent is not None:
                need = f"{compute} ({need} TFLOPS there)"
            return f"insufficient TFLOPS (need {need} per GPU, most free {free}{where})"
        case R.GPU_SIZES_DIFFER:
            return f"with GPUs of different sizes for a share in percent ({_distinct(rs)} TFLOPS)"
        case R.GPU_MODEL:
            return f"GPU model {_distinct(rs)} not in [{d.gpu_model}]"
        case R.POOL_MISMATCH:
            return f"in GPU pool {_distinct(rs)} not {d.pool}"
        case R.NODE_AFFINITY:
            return "not matching the pod's node affinity"
        case R.NO_GPUS:
            return "without GPUs"
        case R.INVENTORY_ERROR:
            return "with unreadable GPU inventory"
        case R.TOO_FEW_GPUS:
            return f"with fewer than {d.gpu_count} healthy GPUs (most {best.free})"
        case R.GPU_TOO_SMALL:
            return f"with GPUs too small for {share} per GPU"
        case R.INSUFFICIENT_GPUS:
            return f"with fewer than {d.gpu_count} GPUs fitting {share} (most {best.free})"
        case R.WHOLE_GPU_BUSY:
            return f"with fewer than {d.gpu_count} idle GPUs (most {best.free})"
        case R.GPU_HELD_WHOLE:
            return f"with fewer than {d.gpu_count} GPUs not held whole (most {best.free})"
        case R.INSUFFICIENT_SLOTS:
            return f"insufficient {RESOURCE_VGPU} slots (need {best.requested}, most free {best.free})"
        case R.INSUFFICIENT_CPU:
            return f"insufficient cpu (need {d.cpu}m, most free {best.free}m)"
        case R.INSUFFICIENT_MEMORY:
            return f"insufficient memory (need {humanize_bytes(d.memory)}, most free {humanize_bytes(best.free)})"
        case _:  # unknown-node, and ledger codes (which never reach a FilterResult)
            return "unknown to the GPU extender" if code is R.UNKNOWN_NODE else code.value


def _distinct(reasons: Sequence[Reason]) -> str:
    return ", ".join(sorted({v for r in reasons for v in r.values}))
