"""Reports each usage pass's pods past their compute cap (:mod:`device_plugin.enforcement.compute_overuse`).

After every pass of the usage sampler, the judgement runs over the pass's measured rows, against the cap each
pod's HAMi-core is given on each GPU (its TFLOPS limit's share of the GPU; isolation ``shared``: none). A pod
whose mean share over the window passed it by more than the margin is counted, logged, and posted as a Warning
Event on the pod and on the node, once until it falls back. Runs on hami-core nodes only: under MPS the
per-container share is not measured, and without a backend no limiter holds a cap to hold a pod to.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping

from device_plugin.enforcement.compute_overuse import ComputeOveruse, judge, shares
from device_plugin.enforcement.envs import granted_percents
from device_plugin.metrics import PluginMetrics
from device_plugin.usage.usage import Attribution
from vgpu.contract.allocation import PodAllocation
from vgpu.contract.usage import PodGpu

log = logging.getLogger(__name__)

Report = Callable[[ComputeOveruse, str], None]  # (the overuse, its message): posts the Events, on the event loop


def caps_of(grants: Mapping[str, PodAllocation]) -> dict[PodGpu, tuple[int, int]]:
    """Each pod's cap on each of its GPUs, in percent (as HAMi-core is given it), with the GPU's milli-TFLOPS."""
    out: dict[PodGpu, tuple[int, int]] = {}
    for uid, alloc in grants.items():
        percents = granted_percents(alloc)
        for g in alloc.gpus:
            out[(uid, g.uuid)] = (percents[g.uuid], g.gpu_tflops)
    return out


class ComputeGuard:
    """The judgement's memory between passes, and its reports; :meth:`enforce` after each pass."""

    def __init__(
        self,
        margin: int,
        window_s: float,
        interval_s: float,
        grants: Callable[[], Mapping[str, PodAllocation] | None],
        metrics: PluginMetrics,
        report: Report,
    ) -> None:
        self._margin, self._window_s, self._grants = margin, window_s, grants
        self._passes = max(1, math.ceil(window_s / interval_s))
        self._metrics, self._report = metrics, report
        self._history: Mapping[PodGpu, tuple[float, ...]] = {}
        self._reported: frozenset[PodGpu] = frozenset()

    async def enforce(self, found: Attribution) -> None:
        """Judge one pass and report what it found."""
        grants = self._grants()
        if grants is None:  # the pods are not listed yet: nothing to hold them to
            return
        judged = judge(
            shares(found.usage.containers, caps_of(grants)),
            margin=self._margin,
            passes=self._passes,
            window_s=self._window_s,
            history=self._history,
            reported=self._reported,
        )
        self._history, self._reported = judged.history, judged.reported
        for overuse in judged.report:
            message = overuse.message(self._margin)
            self._metrics.compute_overuse.inc()
            log.warning("%s", message)
            self._report(overuse, message)
