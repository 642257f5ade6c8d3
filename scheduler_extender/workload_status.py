"""The status of each TensorFusionWorkload: how many of its pods hold GPUs, what they reserve, and Ready.

The webhook creates the workload; only the extender knows which of its pods hold an allocation, so it
writes ``status.replicas``, ``status.allocatedTflops`` and ``status.allocatedVram``, and one condition,
``Ready``: True when every desired pod holds its GPUs, else False with ``PodsPending`` or
``ReplicasMissing`` (a ``StandaloneWorkerMode`` condition says that spec field is recorded only).
Everything comes from the cache (``ClusterCache.workload_pods``). The fields and reasons:
deploy/README.md, section "Workload and pool status".

Pure; ``status.py`` lists the workloads, compares and patches (the leader only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from scheduler_extender.objects import PodRecord, WorkloadPod
from scheduler_extender.status import NOTHING, READY, Condition, ObjectRef, Reserved, Status, StatusOf, reserved_by

NAMED_PENDING: Final = 5  # pods a PodsPending message names; the rest are counted
STANDALONE_WORKER: Final = "StandaloneWorkerMode"


def _workload_of(record: PodRecord) -> ObjectRef | None:
    return None if record.workload is None else (record.ref.namespace, record.workload)


def workload_totals(records: Iterable[PodRecord]) -> dict[ObjectRef, Reserved]:
    """What the pods holding GPUs reserve, by (namespace, workload)."""
    return reserved_by(records, _workload_of)


def desired_replicas(spec: Mapping[str, Any]) -> int | None:
    """``spec.replicas`` where it counts: set, and the workload not in local-GPU mode; else None."""
    replicas = spec.get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or spec.get("isLocalGPU") is True:
        return None
    return replicas


def workload_ready(holding: int, waiting: Sequence[str], replicas: int | None) -> Condition:
    """Ready from ``holding`` pods with GPUs, the names of the live pods ``waiting`` for them, and the
    desired ``replicas`` (None: every live pod is desired)."""
    desired = holding + len(waiting) if replicas is None else replicas
    if holding == desired == 0 and not waiting:
        return Condition(READY, True, "NoPods", "no pod names this workload")
    held = f"{holding} of {desired} pods hold GPUs"
    if holding > desired:
        held = f"{holding} pods hold GPUs ({desired} desired)"
    if waiting:
        names = sorted(waiting)
        more = len(names) - NAMED_PENDING
        held += f"; pending: {', '.join(names[:NAMED_PENDING])}" + (f" and {more} more" if more > 0 else "")
    if holding >= desired:
        return Condition(READY, True, "PodsHoldGPUs", held)
    if waiting:
        return Condition(READY, False, "PodsPending", held)
    return Condition(READY, False, "ReplicasMissing", f"{held}; no other pod names this workload")


def standalone_worker(spec: Mapping[str, Any]) -> tuple[Condition, ...]:
    """A False ``StandaloneWorkerMode`` condition while the spec sets it: the field is kept (TensorFusion's
    interface) but nothing runs a separate worker, which admission also warns about — never silence."""
    if spec.get("standaloneWorkerMode") is not True:
        return ()
    return (
        Condition(
            STANDALONE_WORKER,
            False,
            "NotImplemented",
            "standaloneWorkerMode is recorded only: every pod uses its granted GPU from its own containers "
            "(there is no separate worker to run or skip)",
        ),
    )


def workload_statuses(records: Iterable[PodRecord], waiting: Iterable[WorkloadPod]) -> StatusOf:
    """What each TensorFusionWorkload's status should say, given the pods holding GPUs and those waiting."""
    totals = workload_totals(records)
    pending: dict[ObjectRef, list[str]] = {}
    for pod in waiting:
        pending.setdefault((pod.ref.namespace, pod.workload), []).append(pod.ref.name)

    def status_of(ref: ObjectRef, workload: Mapping[str, Any]) -> Status:
        held = totals.get(ref, NOTHING)
        spec = workload.get("spec")
        replicas = desired_replicas(spec if isinstance(spec, Mapping) else {})
        ready = workload_ready(held.pods, pending.get(ref, []), replicas)
        unkept = standalone_worker(spec if isinstance(spec, Mapping) else {})
        return Status({"replicas": held.pods, **held.allocated_fields()}, (ready, *unkept))

    return status_of
