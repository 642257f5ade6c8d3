"""What filter and prioritize leave by pod UID for the next verb: the pod for its bind, the filter's tie for prioritize.

The pods kube-scheduler last showed filter and prioritize, so that a bind need not read its pod again.

kube-scheduler sends the whole pod, with its ``metadata.resourceVersion``, to filter and prioritize, and
binds it moments later. A bind used to start with a GET of the pod: one API call per GPU pod, spent on
what the scheduler had just sent. The binder takes the shown copy instead, but only where a conditional
write validates it: the allocation patch carries the copy's resourceVersion, so the API server refuses it
(409) unless the pod is still exactly that copy, and the binder then reads the pod and starts over as it
would have without a copy (``binder.py``). Each copy is taken once; a bind without one (a retry, an
extender restarted in between) reads the pod. Bounded: a pod shown and never bound (unschedulable) is
forgotten when newer ones push it out. The same bounded store keeps the nodes a deciding filter passed as
equals (verbs.py), so that prioritize scores them equal instead of ranking them again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final, Generic, TypeVar

from tf_shell.kube.api import RawObject

T = TypeVar("T")

# Between a pod's prioritize and its bind kube-scheduler schedules other pods; a few hundred binds in
# flight is far beyond what one scheduler keeps waiting (its binding goroutines wait on the extender).
MOST: Final = 512


class Recent(Generic[T]):
    """UID → the value last put for it, the oldest forgotten past ``most``. Thread-safe."""

    def __init__(self, most: int = MOST) -> None:
        self.most = most
        self._lock = threading.Lock()
        self._values: OrderedDict[str, T] = OrderedDict()

    def put(self, uid: str, value: T) -> None:
        with self._lock:
            self._values[uid] = value
            self._values.move_to_end(uid)
            while len(self._values) > self.most:
                self._values.popitem(last=False)

    def take(self, uid: str) -> T | None:
        """The value last put with this UID, forgotten here (None when none was)."""
        with self._lock:
            return self._values.pop(uid, None)


ShownPods = Recent[RawObject]  # the pod as kube-scheduler last sent it
