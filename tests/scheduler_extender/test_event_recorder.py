"""The Event recorder keeps up with a burst of binds: several Events are posted at once, and stop posts what is queued."""

from __future__ import annotations

import threading
from typing import cast

from scheduler_extender.events import REASON_GRANTED, WORKERS, EventRecorder
from scheduler_extender.gateway import KubeGateway, PodEvent
from scheduler_extender.objects import PodRef


class SlowApi:
    """An API server that answers an Event only once ``together`` posts are waiting on it at the same time."""

    def __init__(self, together: int) -> None:
        self.barrier = threading.Barrier(together, timeout=5)
        self.posted: list[str] = []
        self.lock = threading.Lock()

    def record_event(self, event: PodEvent) -> None:
        self.barrier.wait()
        with self.lock:
            self.posted.append(event.pod_name)


def pod(i: int) -> PodRef:
    return PodRef(namespace="team", name=f"p{i}", uid=f"u{i}")


def test_granted_events_are_posted_several_at_once() -> None:
    api = SlowApi(together=WORKERS)
    errors: list[int] = []
    recorder = EventRecorder(cast("KubeGateway", api), interval=0, on_error=lambda: errors.append(1))
    for i in range(2 * WORKERS):
        assert recorder.normal(pod(i), REASON_GRANTED, "GPU-0: 10 TFLOPS")
    recorder.start()
    recorder.stop(timeout=10)  # one poster at a time would break the barrier: each post waits for WORKERS
    assert errors == []
    assert sorted(api.posted) == sorted(f"p{i}" for i in range(2 * WORKERS))


def test_stop_posts_what_is_queued_and_ends_every_worker() -> None:
    api = SlowApi(together=1)
    recorder = EventRecorder(cast("KubeGateway", api), interval=0)
    recorder.start()
    for i in range(20):
        recorder.normal(pod(i), REASON_GRANTED, "GPU-0: 10 TFLOPS")
    recorder.stop(timeout=10)
    assert len(api.posted) == 20
    assert not [t for t in threading.enumerate() if t.name.startswith("event-recorder")]
