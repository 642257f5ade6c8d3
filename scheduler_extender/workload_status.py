"""The status of each TensorFusionWorkload: how many of its pods hold GPUs and how much they reserve.

The webhook creates the workload; only the extender knows which of its pods hold an allocation, so
the extender writes ``status.replicas``, ``status.allocatedTflops`` and ``status.allocatedVram``
(what ``kubectl get tensorfusionworkloads`` shows, and what the auto-scaling work acts on). It
happens off the request path: once the cache has its first list, a worker thread sums the cache's
allocations every ``interval`` seconds and patches only the workloads whose totals changed. At its
first pass (and after a failed patch) it lists the workloads to learn what their status says now,
so totals that went stale while the extender was down (pods deleted meanwhile) are corrected.
With several extender replicas only the one holding the Lease (``leader.py``) writes; a replica
that is not leader writes nothing, and lists afresh once it becomes leader (another wrote meanwhile).

The arithmetic is pure (``workload_totals``, ``status_of``, ``pending_writes``, ``status_patch``);
``WorkloadStatusWriter`` is the thin shell around the gateway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler_extender.binder import rfc3339
from scheduler_extender.gateway import GatewayError, KubeGateway, RawObject
from scheduler_extender.objects import PodRecord
from scheduler_extender.periodic import Periodic
from vgpu.errors import DomainError
from vgpu.quantity import format_bytes, format_milli, parse_bytes, parse_milli

log = logging.getLogger(__name__)

WorkloadKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class WorkloadTotals:
    """What a workload's pods hold: pods with an allocation, TFLOPS (milli) and VRAM (bytes) reserved."""

    replicas: int = 0
    tflops_milli: int = 0
    vram_bytes: int = 0


EMPTY = WorkloadTotals()


def workload_totals(records: Iterable[PodRecord]) -> dict[WorkloadKey, WorkloadTotals]:
    """Sum the reserved (request) capacity of every pod that holds GPUs, by workload."""
    totals: dict[WorkloadKey, WorkloadTotals] = {}
    for record in records:
        alloc = record.allocation
        if record.workload is None or alloc is None or not record.holds_gpus:
            continue
        key = (record.ref.namespace, record.workload)
        old = totals.get(key, EMPTY)
        totals[key] = WorkloadTotals(
            replicas=old.replicas + 1,
            tflops_milli=old.tflops_milli + sum(g.tflops_request for g in alloc.gpus),
            vram_bytes=old.vram_bytes + sum(g.vram_request for g in alloc.gpus),
        )
    return totals


def status_of(workload: Mapping[str, Any]) -> WorkloadTotals | None:
    """The totals a listed workload's status states now; None when it states none (or garbage)."""
    status = workload.get("status")
    if not isinstance(status, Mapping) or "replicas" not in status:
        return None
    try:
        return WorkloadTotals(
            replicas=int(status["replicas"]),
            tflops_milli=parse_milli(str(status.get("allocatedTflops", "0"))),
            vram_bytes=parse_bytes(str(status.get("allocatedVram", "0"))),
        )
    except (DomainError, TypeError, ValueError):
        return None


def pending_writes(
    current: Mapping[WorkloadKey, WorkloadTotals], written: Mapping[WorkloadKey, WorkloadTotals | None]
) -> dict[WorkloadKey, WorkloadTotals]:
    """What must be patched: changed totals, and zeros for workloads whose pods all let go.

    ``written`` is what each known workload's status says; a workload not in it is only patched when
    its pods hold something (a workload with no pods and no status has nothing to correct).
    """
    writes = {key: totals for key, totals in current.items() if written.get(key) != totals}
    for key, stated in written.items():
        if key not in current and stated is not None and stated != EMPTY:
            writes[key] = EMPTY
    return writes


def status_patch(totals: WorkloadTotals, now_rfc3339: str) -> RawObject:
    """The merge-patch body for the workload's ``status`` subresource."""
    return {
        "status": {
            "replicas": totals.replicas,
            "allocatedTflops": format_milli(totals.tflops_milli),
            "allocatedVram": format_bytes(totals.vram_bytes),
            "lastUpdateTime": now_rfc3339,
        }
    }


def _listed_key(workload: Mapping[str, Any]) -> WorkloadKey | None:
    """(namespace, name) of a listed workload; None for an object without them."""
    meta = workload.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        return None
    return namespace, name


class WorkloadStatusWriter:
    """Keeps every TensorFusionWorkload's status equal to what the cache says its pods hold."""

    def __init__(
        self,
        gateway: KubeGateway,
        records: Callable[[], Iterable[PodRecord]],
        *,
        interval: float,
        clock: Callable[[], float],
        ready: Callable[[], bool] = lambda: True,
        leading: Callable[[], bool] = lambda: True,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.gateway = gateway
        self.records = records
        self.clock = clock
        self.ready = ready
        self.leading = leading
        self.on_error = on_error
        self._written: dict[WorkloadKey, WorkloadTotals | None] | None = None  # None: list first
        self._worker = Periodic("workload-status", interval, self._pass, on_error)

    def sync(self) -> int:
        """One pass: patch what changed. Returns how many workloads were patched.

        Nothing happens before the cache's first list has landed (an empty cache would zero every status),
        nor while this replica is not the leader.
        """
        if not self.leading():
            self._written = None  # the leader writes meanwhile: what it wrote is learnt by a list once leading
            return 0
        if not self.ready():
            return 0
        try:
            if self._written is None:
                listed = self.gateway.list_workloads()
                self._written = {k: status_of(w) for w in listed if (k := _listed_key(w)) is not None}
        except GatewayError as exc:
            self._failed(f"could not list TensorFusionWorkloads: {exc}")
            return 0
        written = self._written
        patched = 0
        for (namespace, name), totals in pending_writes(workload_totals(self.records()), written).items():
            try:
                self.gateway.patch_workload_status(namespace, name, status_patch(totals, rfc3339(self.clock())))
            except GatewayError as exc:
                if exc.status == 404:
                    # Pods name a workload that does not exist (deleted after admission): nothing to show
                    # it on. Remember the totals so it is not retried every pass.
                    written[(namespace, name)] = totals
                    continue
                self._failed(f"could not update the status of workload {namespace}/{name}: {exc}")
                self._written = None
                return patched
            written[(namespace, name)] = totals if totals != EMPTY else None
            patched += 1
        return patched

    def start(self) -> None:
        self._worker.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._worker.stop(timeout)

    def _pass(self) -> None:
        try:
            self.sync()
        except Exception:  # a status is best effort: the worker logs it and goes on, relisting next pass
            self._written = None
            raise

    def _failed(self, message: str) -> None:
        log.warning("%s", message)
        if self.on_error is not None:
            self.on_error()
