"""Pod Events that tell users why their GPU pod is pending, or what it was granted, posted off the request path.

kube-scheduler's own FailedScheduling event carries our per-node reasons, but only as "N nodes
are available: …" fragments; ours adds the core's one-line summary (``0/12 nodes: 5 insufficient
VRAM (need 4Gi per GPU, most free 2Gi on A100), …``). A filter runs every backoff period (1–10 s)
for a pending pod, so the same message is posted at most once per ``interval`` per pod, and the
API call happens in worker threads so a slow API server never slows down filter. Every bound GPU pod gets a
GpuGranted Event, and a burst binds faster than one thread posts at the API server's latency, so ``WORKERS``
post (benchmarks/README.md, "The price list, read from the API server").
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Final, Literal

from scheduler_extender.gateway import KubeGateway, PodEvent
from scheduler_extender.objects import PodRef

log = logging.getLogger(__name__)

REASON_FAILED: Final = "FailedGpuScheduling"
REASON_GRANTED: Final = "GpuGranted"  # Normal, at bind: which GPUs and what share, as recorded on the pod
# The extender's own preemption (preemptor.py): on each victim, kube-scheduler's reason for its victims;
# on the preemptor, Normal when GPU room is held for it, Warning when a PodDisruptionBudget refused a victim.
REASON_PREEMPTED: Final = "Preempted"
REASON_PREEMPTING: Final = "GpuPreemption"
REASON_PREEMPTION_BLOCKED: Final = "GpuPreemptionBlocked"
# The most pods remembered for deduplication; the oldest are forgotten beyond it.
_MEMORY: Final = 10_000
_QUEUE: Final = 1_000
WORKERS: Final = 4  # threads posting at once: each waits on the API server for most of a post


class EventRecorder:
    """Deduplicating, rate-limited, asynchronous Event poster."""

    def __init__(
        self,
        gateway: KubeGateway,
        *,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.gateway = gateway
        self.interval = interval
        self.clock = clock
        self.on_error = on_error
        self._lock = threading.Lock()
        self._last: dict[str, tuple[str, float]] = {}  # pod uid -> (message, when)
        self._queue: queue.Queue[PodEvent | None] = queue.Queue(maxsize=_QUEUE)
        self._threads: list[threading.Thread] = []

    def warn(self, pod: PodRef, reason: str, message: str) -> bool:
        """Queue a Warning event unless the same one was queued for this pod within ``interval``."""
        now = self.clock()
        with self._lock:
            last = self._last.get(pod.uid)
            if last is not None and last[0] == f"{reason}:{message}" and now - last[1] < self.interval:
                return False
            self._last.pop(pod.uid, None)
            self._last[pod.uid] = (f"{reason}:{message}", now)
            while len(self._last) > _MEMORY:
                del self._last[next(iter(self._last))]
        return self._enqueue(self._event(pod, reason, message, "Warning"))

    def normal(self, pod: PodRef, reason: str, message: str) -> bool:
        """Queue a Normal event (one that happens once per pod, such as a grant: not deduplicated)."""
        return self._enqueue(self._event(pod, reason, message, "Normal"))

    @staticmethod
    def _event(pod: PodRef, reason: str, message: str, kind: Literal["Normal", "Warning"]) -> PodEvent:
        return PodEvent(
            namespace=pod.namespace, pod_name=pod.name, pod_uid=pod.uid, reason=reason, message=message, type=kind
        )

    def _enqueue(self, event: PodEvent) -> bool:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning("event queue full; dropping %s for %s/%s", event.reason, event.namespace, event.pod_name)
            return False
        return True

    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self._run, name=f"event-recorder-{i}", daemon=True) for i in range(WORKERS)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Post what is queued (within ``timeout`` in all), then end the workers."""
        if not self._threads:
            return
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    def drain(self) -> None:
        """Post everything queued now, in this thread (for tests and shutdown without a worker)."""
        while True:
            try:
                event = self._queue.get_nowait()
            except queue.Empty:
                return
            if event is not None:
                self._post(event)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            self._post(event)

    def _post(self, event: PodEvent) -> None:
        try:
            self.gateway.record_event(event)
        except Exception as exc:  # an event is best effort: never let it break scheduling
            log.warning("could not record %s on %s/%s: %s", event.reason, event.namespace, event.pod_name, exc)
            if self.on_error is not None:
                self.on_error()
