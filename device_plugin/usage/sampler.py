"""Samples each GPU's per-process use every ``--usage-interval`` seconds and keeps the node's latest usage.

A pass takes the node's pods from the pod cache on the event loop (a list of frozen records, nothing
more) and does everything that blocks or costs in a worker thread, never on the loop that serves the
kubelet's gRPC calls: the driver's process and utilisation queries per GPU, each PID's pod and container
(``/proc/<pid>/cgroup``, or the fake GPU file's script), and the join with the pods' grants
(:func:`device_plugin.usage.usage.node_usage`). What it keeps is what ``/usage`` and the per-container metrics
serve; each pass, with its processes, then goes to the guards (VRAM, compute) on the event loop. A GPU whose
calls fail, a process that exits before it is mapped, a pod deleted mid-sample, an unknown container ID: each
is a counted skip, logged when it first appears, and the pass goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from device_plugin.cluster.pods import PodRecord
from device_plugin.gpus.probe import GpuProbe
from device_plugin.metrics import PluginMetrics
from device_plugin.usage.process_owner import ProcessOwner, ProcessResolver
from device_plugin.usage.usage import Attribution, GpuProcesses, Skip, allocated, node_usage, sm_unknown
from vgpu.contract.inventory import GpuInfo
from vgpu.contract.usage import NodeUsage
from vgpu.timefmt import rfc3339

log = logging.getLogger(__name__)


class UsageSampler:
    """Runs the passes; :attr:`latest` (the last pass's document), :attr:`allocated` and
    :attr:`supported` are replaced whole by each pass, so other threads read them without a lock."""

    def __init__(
        self,
        probe: GpuProbe,
        resolver: ProcessResolver,
        gpus: Callable[[], Iterable[GpuInfo]],
        pods: Callable[[], Iterable[PodRecord]],
        metrics: PluginMetrics,
        *,
        node: str,
        interval_s: float,
        sm_unknown: frozenset[str] = frozenset(),
        after: Callable[[Attribution], Awaitable[None]] | None = None,
    ) -> None:
        """``sm_unknown``: GPUs whose per-process SM shares are not the processes' own (MPS): their
        containers' TFLOPS are reported unmeasured. ``after``: awaited on the event loop with each pass (the
        guards: :mod:`device_plugin.enforcement.vram_guard`, :mod:`device_plugin.enforcement.compute_guard`)."""
        self._after = after
        self._probe, self._resolver, self._gpus, self._pods = probe, resolver, gpus, pods
        self._sm_unknown = sm_unknown
        self._metrics, self._node, self.interval_s = metrics, node, interval_s
        self._since: dict[str, int] = {}  # per GPU, the driver's timestamp of the newest sample seen
        self._failing: set[str] = set()  # GPUs whose calls failed in the last pass
        self._skipped: frozenset[tuple[str, int, Skip]] = frozenset()
        self.latest: NodeUsage | None = None
        self.allocated: Mapping[str, tuple[int, int]] = {}  # GPU → requested (milli-TFLOPS, VRAM) of active pods
        self.supported: Mapping[str, bool] = {}  # GPU → the driver reports per-process SM share

    def sample(self, pods: Sequence[PodRecord]) -> NodeUsage:
        """One pass over every GPU; blocks (the daemon runs it in a thread)."""
        return self.attribute(pods).usage

    def attribute(self, pods: Sequence[PodRecord]) -> Attribution:
        """:meth:`sample`, with each row's processes and the skips."""
        started, now = time.perf_counter(), time.time()
        measured: list[GpuProcesses] = []
        for gpu in self._gpus():
            if gpu.mig:  # its MIG instances are sampled; the whole GPU would list their processes again
                continue
            try:
                report = self._probe.processes(gpu.uuid, self._since.get(gpu.uuid, 0))
            except Exception as exc:
                self._metrics.usage_skips.labels(Skip.GPU_ERROR.value).inc()
                if gpu.uuid not in self._failing:
                    log.warning("cannot sample the processes of GPU %s (%s); skipped until it answers", gpu.uuid, exc)
                self._failing.add(gpu.uuid)
                continue
            if gpu.uuid in self._failing:
                log.info("sampling the processes of GPU %s works again", gpu.uuid)
                self._failing.discard(gpu.uuid)
            self._since[gpu.uuid] = report.until_us
            if gpu.uuid in self._sm_unknown:
                report = sm_unknown(report)
            measured.append(GpuProcesses(gpu=gpu, report=report))
        owners = {p.pid: self._owner(p.pid) for m in measured for p in m.report.processes}
        result = node_usage(
            node=self._node,
            sampled_at=rfc3339(now, "milliseconds"),
            interval_s=self.interval_s,
            gpus=measured,
            owners=owners,
            pods=pods,
        )
        self._note_support({m.gpu.uuid: m.report.sm_supported for m in measured})
        self._note_skips(result.skipped)
        self.allocated = allocated(pods)
        self.latest = result.usage
        self._metrics.usage_sampled_at.set(now)
        self._metrics.usage_sample_seconds.observe(time.perf_counter() - started)
        return result

    def _owner(self, pid: int) -> ProcessOwner | None:
        try:
            return self._resolver.owner(pid)
        except Exception as exc:  # counted as no_pod with the others; the pass goes on
            log.debug("cannot map process %d to a pod: %s", pid, exc)
            return None

    def _note_support(self, now: Mapping[str, bool]) -> None:
        for uuid, supported in now.items():
            if not supported and self.supported.get(uuid, True) and uuid not in self._sm_unknown:
                log.warning(
                    "GPU %s: the driver reports no per-process utilisation; its containers' TFLOPS used read 0 "
                    "(memory only)",
                    uuid,
                )
        self.supported = {**self.supported, **now}

    def _note_skips(self, skipped: Sequence[tuple[str, int, Skip]]) -> None:
        for _, _, reason in skipped:
            self._metrics.usage_skips.labels(reason.value).inc()
        for gpu, pid, reason in sorted(set(skipped) - self._skipped):
            log.info("process %d on GPU %s is not attributed to a container: %s", pid, gpu, reason.value)
        self._skipped = frozenset(skipped)

    async def run(self) -> None:
        """A pass every interval until cancelled; a failed pass is logged and the next one runs."""
        while True:
            pods = list(self._pods())
            try:
                found = await asyncio.to_thread(self.attribute, pods)
                if self._after is not None:
                    await self._after(found)
            except Exception:
                log.exception("usage sampling pass failed; the next one runs in %.1fs", self.interval_s)
            await asyncio.sleep(self.interval_s)
