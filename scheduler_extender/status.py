"""The status the extender writes on our custom resources: plain fields and metav1.Conditions.

Only the extender knows which pods hold GPUs and what the nodes of every pool offer, so it writes the
status of TensorFusionWorkloads (``workload_status.py``) and GPUPools (``pool_status.py``), off the
request path: a worker thread lists each kind every ``interval`` seconds, works out from the cache
what each status should say, and patches only what differs. Only the replica holding the Lease
(``leader.py``) writes. Why it lists every pass, and when a patch is sent: deploy/README.md, section
"Workload and pool status".

The comparison and the patch body are pure (``status_patch``); ``StatusWriter`` is the thin shell.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from scheduler_extender.gateway import KubeGateway
from scheduler_extender.objects import PodRecord
from tf_shell.kube.api import GatewayError, RawObject
from tf_shell.periodic import Periodic
from vgpu.quantity import format_bytes, format_milli
from vgpu.timefmt import rfc3339

log = logging.getLogger(__name__)

ObjectRef = tuple[str | None, str]  # (namespace, None for a cluster-scoped object; name)
K = TypeVar("K", bound=Hashable)
READY: Final = "Ready"  # the one condition each of our kinds has: its type


@dataclass(frozen=True, slots=True)
class Condition:
    """A metav1.Condition as a pass decides it, without its times."""

    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Status:
    """What an object's status should say: its fields and its conditions."""

    fields: Mapping[str, object]
    conditions: tuple[Condition, ...]


# Per pass, read from the cache once: what the status of the listed object ``ref`` should say.
StatusOf = Callable[[ObjectRef, Mapping[str, Any]], Status]


@dataclass(frozen=True, slots=True)
class StatusKind:
    """One of our CRDs whose status the writer keeps; ``statuses`` reads the cache for one pass."""

    plural: str
    namespaced: bool
    statuses: Callable[[], StatusOf]


@dataclass(frozen=True, slots=True)
class Reserved:
    """What a group of pods holds: pods with an allocation, TFLOPS (milli) and VRAM (bytes) reserved."""

    pods: int = 0
    tflops_milli: int = 0
    vram_bytes: int = 0

    def allocated_fields(self) -> dict[str, object]:
        return {"allocatedTflops": format_milli(self.tflops_milli), "allocatedVram": format_bytes(self.vram_bytes)}


NOTHING = Reserved()


def reserved_by(records: Iterable[PodRecord], group: Callable[[PodRecord], K | None]) -> dict[K, Reserved]:
    """Sum the reserved (request, not limit) capacity of every pod that holds GPUs, by ``group`` (None: no group)."""
    totals: dict[K, Reserved] = {}
    for record in records:
        alloc = record.allocation
        key = group(record)
        if key is None or alloc is None or not record.holds_gpus:
            continue
        old = totals.get(key, NOTHING)
        totals[key] = Reserved(
            pods=old.pods + 1,
            tflops_milli=old.tflops_milli + sum(g.tflops_request for g in alloc.gpus),
            vram_bytes=old.vram_bytes + sum(g.vram_request for g in alloc.gpus),
        )
    return totals


def written_conditions(
    desired: Iterable[Condition], stated: Sequence[Mapping[str, Any]], generation: int | None, now_rfc3339: str
) -> list[RawObject]:
    """``desired`` as metav1.Conditions, each keeping the ``lastTransitionTime`` ``stated`` gives it while
    its status did not flip."""
    before = {c.get("type"): c for c in stated}
    conditions = []
    for want in desired:
        status = "True" if want.status else "False"
        old = before.get(want.type) or {}
        since = old.get("lastTransitionTime")
        condition: RawObject = {
            "type": want.type,
            "status": status,
            "reason": want.reason,
            "message": want.message,
            "lastTransitionTime": since if old.get("status") == status and isinstance(since, str) else now_rfc3339,
        }
        if generation is not None:
            condition["observedGeneration"] = generation
        conditions.append(condition)
    return conditions


def status_patch(obj: Mapping[str, Any], desired: Status, now_rfc3339: str) -> RawObject | None:
    """The merge-patch body of the ``status`` subresource that makes listed ``obj`` say ``desired``; None
    when it says so already (times aside)."""
    stated = _mapping(obj.get("status"))
    generation = _mapping(obj.get("metadata")).get("generation")
    generation = generation if isinstance(generation, int) else None
    raw = stated.get("conditions")
    before = [c for c in raw if isinstance(c, Mapping)] if isinstance(raw, list) else []
    conditions = written_conditions(desired.conditions, before, generation, now_rfc3339)
    if all(stated.get(k) == v for k, v in desired.fields.items()) and _timeless(conditions) == _timeless(before):
        return None
    return {"status": {**desired.fields, "conditions": conditions, "lastUpdateTime": now_rfc3339}}


def _timeless(conditions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conditions]


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def listed_ref(obj: Mapping[str, Any], namespaced: bool) -> ObjectRef | None:
    """(namespace, name) of a listed object; None for an object without them."""
    meta = _mapping(obj.get("metadata"))
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(name, str) or (namespaced and not isinstance(namespace, str)):
        return None
    return (namespace if namespaced else None), name


class StatusWriter:
    """Keeps the status of every object of ``kinds`` equal to what the cache says."""

    def __init__(
        self,
        gateway: KubeGateway,
        kinds: Sequence[StatusKind],
        *,
        interval: float,
        clock: Callable[[], float],
        ready: Callable[[], bool] = lambda: True,
        leading: Callable[[], bool] = lambda: True,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.gateway = gateway
        self.kinds = tuple(kinds)
        self.clock = clock
        self.ready = ready
        self.leading = leading
        self.on_error = on_error
        self._worker = Periodic("status", interval, self.sync, on_error)

    def sync(self) -> int:
        """One pass: patch what differs. Returns how many objects were patched.

        Nothing happens before the cache's first list has landed (an empty cache would zero every status),
        nor while this replica is not the leader.
        """
        if not self.leading() or not self.ready():
            return 0
        return sum(self._sync(kind) for kind in self.kinds)

    def start(self) -> None:
        self._worker.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._worker.stop(timeout)

    def _sync(self, kind: StatusKind) -> int:
        try:
            listed = self.gateway.list_resources(kind.plural)
        except GatewayError as exc:
            self._failed(f"could not list {kind.plural}: {exc}")
            return 0
        status_of = kind.statuses()
        now = rfc3339(self.clock())
        patched = 0
        for obj in listed:
            ref = listed_ref(obj, kind.namespaced)
            body = None if ref is None else status_patch(obj, status_of(ref, obj), now)
            if ref is None or body is None:
                continue
            try:
                self.gateway.patch_resource_status(kind.plural, *ref, body)
            except GatewayError as exc:
                if exc.status == 404:  # deleted since the list: nothing to show it on
                    continue
                self._failed(f"could not update the status of {kind.plural} {'/'.join(filter(None, ref))}: {exc}")
                return patched  # the next pass lists again and retries what is still off
            patched += 1
        return patched

    def _failed(self, message: str) -> None:
        log.warning("%s", message)
        if self.on_error is not None:
            self.on_error()
