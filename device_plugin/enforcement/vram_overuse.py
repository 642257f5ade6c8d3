"""Which pods hold more GPU memory than their VRAM limit by the driver's count, and which process to stop.

Inside the container a VRAM limit is held by HAMi-core or MPS, both of which a process of the container can
leave (docs/security.md). The driver's count of each process's memory (NVML, sampled every usage pass) is
what no process of the container can change, so the device plugin judges each pod's use of each GPU by it,
as the kernel's OOM killer judges a cgroup: the pod's GPU containers there together (the ledger books the
pod's grant once, however many of its containers see the GPU), above the limit by more than the tolerance in
two passes in a row, lose their largest holder on that GPU. Two passes, because one sample can catch memory
the driver is still releasing; the tolerance, because the driver's count includes what the in-container
limiters do not see (the context's own growth). Pure: the guard (:mod:`device_plugin.enforcement.vram_guard`)
does the signalling and the reporting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from device_plugin.usage.usage import Holder, HolderKey
from vgpu.contract.usage import ContainerUsage, PodGpu, per_pod_gpu
from vgpu.quantity import humanize_bytes

PASSES: Final = 2  # passes in a row above the limit before the guard acts


class OveruseAction(StrEnum):
    """What the plugin does about a pod past its VRAM limit on a GPU (``--vram-overuse``)."""

    KILL = "kill"  # SIGKILL its largest holder on that GPU, report it
    REPORT = "report"  # report it only (an Event on the pod and the node, a counter)
    OFF = "off"  # nothing


class Outcome(StrEnum):
    """What came of one overuse (the counter's ``outcome`` label)."""

    KILLED = "killed"
    GONE = "gone"  # the process had exited before the signal
    KILL_FAILED = "kill_failed"
    REPORTED = "reported"


@dataclass(frozen=True, slots=True, kw_only=True)
class Overuse:
    """One pod past its VRAM limit on one GPU (``rows``: its containers there), and the process to stop: the
    largest holder among them (``victim``, of container ``container``)."""

    rows: tuple[ContainerUsage, ...]
    container: str
    victim: Holder

    @property
    def pod(self) -> ContainerUsage:
        """The first row, for what all rows share: the pod's namespace, name, UID and the GPU."""
        return self.rows[0]

    @property
    def used(self) -> int:
        return _used(self.rows)

    @property
    def limit(self) -> int:
        return _limit(self.rows)

    def message(self, tolerance: int, outcome: Outcome, why: str = "") -> str:
        c, pid, held = self.pod, self.victim.pid, humanize_bytes(self.victim.memory)
        process = (
            f"its process {pid} ({held})" if len(self.rows) == 1 else f"process {pid} ({held}) of {self.container}"
        )
        what = {
            Outcome.KILLED: f"{process} was killed",
            Outcome.GONE: f"{process} had exited",
            Outcome.KILL_FAILED: f"{process} could not be killed: {why}",
            Outcome.REPORTED: f"the largest holder is {process}; reported only (--vram-overuse=report)",
        }[outcome]
        holder = (
            f"container {c.container} of pod {c.namespace}/{c.pod}"
            if len(self.rows) == 1
            else f"pod {c.namespace}/{c.pod}'s containers "
            + ", ".join(f"{r.container} ({humanize_bytes(r.vram_used)})" for r in self.rows)
            + " together"
        )
        return (
            f"{holder} held {humanize_bytes(self.used)} of GPU {c.gpu} by the driver's count, over the pod's VRAM "
            f"limit {humanize_bytes(self.limit)} by more than {humanize_bytes(tolerance)} in {PASSES} samples in a "
            f"row: {what}"
        )


def _used(rows: Sequence[ContainerUsage]) -> int:
    return sum(r.vram_used for r in rows)


def _limit(rows: Sequence[ContainerUsage]) -> int:
    """The pod's VRAM limit on the GPU: every row carries the one grant (the largest, were they ever to differ)."""
    return max(r.vram_limit for r in rows)


@dataclass(frozen=True, slots=True, kw_only=True)
class Judgement:
    """What to act on after a pass, and each pod's passes in a row above its limit on each GPU, for the next."""

    act: tuple[Overuse, ...]
    streaks: Mapping[PodGpu, int]


def judge(
    containers: Iterable[ContainerUsage],
    holders: Mapping[HolderKey, tuple[Holder, ...]],
    *,
    tolerance: int,
    streaks: Mapping[PodGpu, int],
    again: bool,
) -> Judgement:
    """The pods whose rows on a GPU sum above ``vram_limit + tolerance`` for :data:`PASSES` passes in a row
    (``streaks``: the last judgement's). ``again``: a pod still above its limit is acted on again after
    :data:`PASSES` more passes (a kill: the next holder goes); else once until it falls back under its limit
    (a report). Rows without a VRAM limit (0) are not judged."""
    act: list[Overuse] = []
    now: dict[PodGpu, int] = {}
    for key, rows in per_pod_gpu(c for c in containers if c.vram_limit > 0).items():
        procs = [(r.container, h) for r in rows for h in holders.get((r.pod_uid, r.container, r.gpu), ())]
        if _used(rows) <= _limit(rows) + tolerance or not procs:
            continue
        streak = streaks.get(key, 0) + 1
        if streak == PASSES:
            container, victim = max(procs, key=lambda p: (p[1].memory, p[1].pid))
            act.append(Overuse(rows=tuple(rows), container=container, victim=victim))
            if again:
                streak = 0
        now[key] = streak
    return Judgement(act=tuple(act), streaks=now)
