"""Acts on each usage pass's pods past their VRAM limit (:mod:`device_plugin.enforcement.vram_overuse`).

After every pass of the usage sampler, the judgement runs over the pass's rows and processes; each pod judged
past its limit on a GPU loses its largest process there to SIGKILL (``--vram-overuse=kill``, through a
:class:`~device_plugin.usage.process_kill.ProcessKiller`, in a worker thread), or is only reported
(``report``). Either way it is counted, logged, and posted as a Warning Event on the pod and on the node, like
the kubelet's own evictions: whoever owns the pod sees why its process died. The plugin needs the ``KILL``
capability to signal another user's process (the chart adds it); without it each kill fails and says so, once
per process (not again every two passes while it stays over).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from device_plugin.enforcement.vram_overuse import Outcome, Overuse, OveruseAction, judge
from device_plugin.metrics import PluginMetrics
from device_plugin.usage.process_kill import KillRefused, ProcessKiller
from device_plugin.usage.usage import Attribution
from vgpu.contract.usage import PodGpu

log = logging.getLogger(__name__)

Report = Callable[[Overuse, str], None]  # (the overuse, its message): posts the Events, on the event loop


class VramGuard:
    """The judgement's memory between passes, and its acts; :meth:`enforce` after each pass."""

    def __init__(
        self, action: OveruseAction, tolerance: int, killer: ProcessKiller, metrics: PluginMetrics, report: Report
    ) -> None:
        self._action, self._tolerance, self._killer = action, tolerance, killer
        self._metrics, self._report = metrics, report
        self._streaks: Mapping[PodGpu, int] = {}
        self._refused: set[int] = set()  # PIDs whose kill failed: said once, not tried again every two passes

    async def enforce(self, found: Attribution) -> None:
        """Judge one pass and act on it; the signals are sent from a worker thread."""
        if self._action is OveruseAction.OFF:
            return
        judged = judge(
            found.usage.containers,
            found.holders,
            tolerance=self._tolerance,
            streaks=self._streaks,
            again=self._action is OveruseAction.KILL,
        )
        self._streaks = judged.streaks
        listed = {h.pid for procs in found.holders.values() for h in procs}
        self._refused &= listed  # a PID that left the driver's list may come back as another process
        for overuse in judged.act:
            if overuse.victim.pid in self._refused:
                continue
            outcome, why = await asyncio.to_thread(self._act, overuse)
            if outcome is Outcome.KILL_FAILED:
                self._refused.add(overuse.victim.pid)
            message = overuse.message(self._tolerance, outcome, why)
            self._metrics.vram_overuse.labels(outcome.value).inc()
            log.warning("%s", message)
            self._report(overuse, message)

    def _act(self, overuse: Overuse) -> tuple[Outcome, str]:
        if self._action is not OveruseAction.KILL:
            return Outcome.REPORTED, ""
        try:
            sent = self._killer.kill(overuse.victim.pid, overuse.victim.owner)
        except KillRefused as exc:
            return Outcome.KILL_FAILED, str(exc)
        return (Outcome.KILLED, "") if sent else (Outcome.GONE, "")
