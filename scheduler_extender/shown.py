"""The pods kube-scheduler last showed filter and prioritize, by UID, so that a bind need not read its pod again.

kube-scheduler sends the whole pod, with its ``metadata.resourceVersion``, to filter and prioritize, and
binds it moments later. A bind used to start with a GET of the pod: one API call per GPU pod, spent on
what the scheduler had just sent. The binder takes the shown copy instead, but only where a conditional
write validates it: the allocation patch carries the copy's resourceVersion, so the API server refuses it
(409) unless the pod is still exactly that copy, and the binder then reads the pod and starts over as it
would have without a copy (``binder.py``). Each copy is taken once; a bind without one (a retry, an
extender restarted in between) reads the pod. Bounded: a pod shown and never bound (unschedulable) is
forgotten when newer ones push it out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final

from tf_shell.kube.api import RawObject

# Between a pod's prioritize and its bind kube-scheduler schedules other pods; a few hundred binds in
# flight is far beyond what one scheduler keeps waiting (its binding goroutines wait on the extender).
MOST: Final = 512


class ShownPods:
    """UID → the pod as kube-scheduler last sent it. Thread-safe."""

    def __init__(self, most: int = MOST) -> None:
        self.most = most
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, RawObject] = OrderedDict()

    def put(self, uid: str, pod: RawObject) -> None:
        with self._lock:
            self._pods[uid] = pod
            self._pods.move_to_end(uid)
            while len(self._pods) > self.most:
                self._pods.popitem(last=False)

    def take(self, uid: str) -> RawObject | None:
        """The pod last shown with this UID, forgotten here (None when none was)."""
        with self._lock:
            return self._pods.pop(uid, None)
