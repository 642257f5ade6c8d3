"""Which pods use more of a GPU's compute than their TFLOPS limit lets them, by the driver's count, over a window.

On a hami-core node the TFLOPS limit is held by HAMi-core inside the pod's processes (``soft``), as a share of
the GPU's SMs. A process can leave it (a static binary, no preloaded library, its own environment), and it holds
each container of a pod alone (docs/security.md). The driver's per-process SM utilisation, attributed to
containers every usage pass, is what no process can change: a pod whose containers on a GPU used, on average
over the window, more of it than its cap by more than a margin (points of the GPU) is reported, once until it
falls back. Reported only, not stopped: compute is shared by time, and nothing a neighbour was promised stays
held once the process yields; and HAMi-core itself overshoots in bursts (docs/isolation.md), which the window
and the margin are there to absorb. Pure: the guard (:mod:`device_plugin.enforcement.compute_guard`) reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from vgpu.contract.usage import ContainerUsage, PodGpu, per_pod_gpu


class ComputeOveruseAction(StrEnum):
    """What the plugin does about a pod past its compute cap (``--compute-overuse``)."""

    REPORT = "report"  # a Warning Event on the pod and the node, a counter
    OFF = "off"


@dataclass(frozen=True, slots=True, kw_only=True)
class Share:
    """A pod's use of one GPU in one pass (``rows``: its containers there) against the cap its limiter is given,
    both in percent of the GPU."""

    rows: tuple[ContainerUsage, ...]
    used: float
    cap: int

    @property
    def key(self) -> PodGpu:
        return (self.rows[0].pod_uid, self.rows[0].gpu)


def shares(rows: Iterable[ContainerUsage], caps: Mapping[PodGpu, tuple[int, int]]) -> tuple[Share, ...]:
    """The pass's measured rows, per pod and GPU, for each pod whose limiter holds a cap there (``caps``: the
    cap in percent and the GPU's milli-TFLOPS); rows without a measured share, or of pods without a cap, are
    not judged."""
    out = []
    for key, found in per_pod_gpu(c for c in rows if c.tflops_measured and (c.pod_uid, c.gpu) in caps).items():
        cap, capacity = caps[key]
        if capacity > 0:
            out.append(Share(rows=tuple(found), used=100 * sum(c.tflops_used for c in found) / capacity, cap=cap))
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeOveruse:
    """A pod whose mean share of a GPU over the window passed its cap by more than the margin."""

    share: Share  # the last pass's
    mean: float
    window_s: float

    def message(self, margin: int) -> str:
        c, rows = self.share.rows[0], self.share.rows
        who = (
            f"container {c.container} of pod {c.namespace}/{c.pod}"
            if len(rows) == 1
            else f"pod {c.namespace}/{c.pod}'s containers {', '.join(r.container for r in rows)} together"
        )
        return (
            f"{who} used {self.mean:.0f}% of GPU {c.gpu} on average over {self.window_s:g}s by the driver's count, "
            f"over the {self.share.cap}% its TFLOPS limit gives HAMi-core by more than {margin} points: a process "
            "the limiter does not hold (one that left it, or containers each held alone); reported only "
            "(--compute-overuse)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Judgement:
    """What to report after a pass; each pod's shares of the last passes, and the pods reported and still over."""

    report: tuple[ComputeOveruse, ...]
    history: Mapping[PodGpu, tuple[float, ...]]
    reported: frozenset[PodGpu]


def judge(
    found: Iterable[Share],
    *,
    margin: int,
    passes: int,
    window_s: float,
    history: Mapping[PodGpu, tuple[float, ...]],
    reported: frozenset[PodGpu],
) -> Judgement:
    """Each pod's last ``passes`` shares (a pod missing from a pass starts again); one whose mean over a full
    window is above its cap by more than ``margin`` is reported, once until its mean falls back within it."""
    report: list[ComputeOveruse] = []
    now: dict[PodGpu, tuple[float, ...]] = {}
    still: set[PodGpu] = set()
    for share in found:
        key = share.key
        seen = (*history.get(key, ()), share.used)[-passes:]
        now[key] = seen
        mean = sum(seen) / len(seen)
        if len(seen) < passes or mean <= share.cap + margin:
            continue
        still.add(key)
        if key not in reported:
            report.append(ComputeOveruse(share=share, mean=mean, window_s=window_s))
    return Judgement(report=tuple(report), history=now, reported=frozenset(still))
