"""Which containers hold more GPU memory than their VRAM limit by the driver's count, and which process to stop.

Inside the container a VRAM limit is held by HAMi-core or MPS, both of which a process of the container can
leave (docs/security.md). The driver's count of each process's memory (NVML, sampled every usage pass) is
what no process of the container can change, so the device plugin judges each container's use of each GPU
by it, as the kernel's OOM killer judges a cgroup: a container above its limit by more than the tolerance
in two passes in a row loses its largest holder on that GPU. Two passes, because one sample can catch
memory the driver is still releasing; the tolerance, because the driver's count includes what the
in-container limiters do not see (the context's own growth). Pure: the guard
(:mod:`device_plugin.enforcement.vram_guard`) does the signalling and the reporting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from device_plugin.usage.usage import Holder, HolderKey
from vgpu.contract.usage import ContainerUsage
from vgpu.quantity import humanize_bytes

PASSES: Final = 2  # passes in a row above the limit before the guard acts


class OveruseAction(StrEnum):
    """What the plugin does about a container past its VRAM limit (``--vram-overuse``)."""

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
    """One container past its limit on one GPU, and the process to stop: its largest holder there."""

    usage: ContainerUsage
    victim: Holder

    def message(self, tolerance: int, outcome: Outcome, why: str = "") -> str:
        c = self.usage
        pid, held = self.victim.pid, humanize_bytes(self.victim.memory)
        what = {
            Outcome.KILLED: f"its process {pid} ({held}) was killed",
            Outcome.GONE: f"its process {pid} ({held}) had exited",
            Outcome.KILL_FAILED: f"its process {pid} ({held}) could not be killed: {why}",
            Outcome.REPORTED: f"its largest process is {pid} ({held}); reported only (--vram-overuse=report)",
        }[outcome]
        return (
            f"container {c.container} of pod {c.namespace}/{c.pod} held {humanize_bytes(c.vram_used)} of GPU {c.gpu} "
            f"by the driver's count, over its VRAM limit {humanize_bytes(c.vram_limit)} by more than "
            f"{humanize_bytes(tolerance)} in {PASSES} samples in a row: {what}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Judgement:
    """What to act on after a pass, and each row's passes in a row above its limit, for the next pass."""

    act: tuple[Overuse, ...]
    streaks: Mapping[HolderKey, int]


def judge(
    containers: Iterable[ContainerUsage],
    holders: Mapping[HolderKey, tuple[Holder, ...]],
    *,
    tolerance: int,
    streaks: Mapping[HolderKey, int],
    again: bool,
) -> Judgement:
    """The rows above ``vram_limit + tolerance`` for :data:`PASSES` passes in a row (``streaks``: the last
    judgement's). ``again``: a row still above its limit is acted on again after :data:`PASSES` more passes
    (a kill: the next holder goes); else once until it falls back under its limit (a report). A row without
    a VRAM limit (0) is not judged."""
    act: list[Overuse] = []
    now: dict[HolderKey, int] = {}
    for c in containers:
        key = (c.pod_uid, c.container, c.gpu)
        procs = holders.get(key, ())
        if c.vram_limit <= 0 or c.vram_used <= c.vram_limit + tolerance or not procs:
            continue
        streak = streaks.get(key, 0) + 1
        if streak == PASSES:
            act.append(Overuse(usage=c, victim=max(procs, key=lambda h: (h.memory, h.pid))))
            if again:
                streak = 0
        now[key] = streak
    return Judgement(act=tuple(act), streaks=now)
