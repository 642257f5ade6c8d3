"""The autoscaler: applies the three layers' decisions, from inside the extender, on the leader only.

It lives in the extender because the extender is the one writer of allocations and the one owner of
the ledger, and the limits layer changes allocations; it runs only in the replica holding the
extender's Lease (``leader.py``), and every allocation write is conditional on the pod's
resourceVersion. Every ``--autoscaler-interval`` seconds it reads the autoscaled workloads
(``members.py``) and the plugins' ``/usage`` (tf_shell.usage_feed), feeds the pure state
(``vgpu.autoscale.evaluate``), and applies what is due: limits as allocation patches, requests in the
workload's status (``report.py``, ``resize.py``), replicas through an HPA (``hpa.py``), and
checkpoints of the histograms in ConfigMaps. Why, and each step: docs/autoscaling.md, section
"How it is applied".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduler_extender.arbiter import Arbiter
from scheduler_extender.autoscaler import checkpoints, hpa
from scheduler_extender.autoscaler.members import Autoscaled, autoscaled
from scheduler_extender.autoscaler.report import autoscaling_status
from scheduler_extender.autoscaler.resize import InPlace, RequestResizer
from scheduler_extender.cache import ClusterCache
from scheduler_extender.events import EventRecorder
from scheduler_extender.gateway import KubeGateway
from scheduler_extender.objects import OwnerRef, PodRef, controller_of
from scheduler_extender.status import Condition, ObjectRef, Status, StatusOf
from tf_shell.kube.api import GatewayError
from tf_shell.usage_feed import UsageFeed
from vgpu import metric_names
from vgpu.autoscale.evaluate import Autoscaler, Evaluation, LimitDecision, WorkloadKey, samples_of
from vgpu.contract.allocation import PodAllocation
from vgpu.contract.usage import NodeUsage
from vgpu.names import AUTOSCALING_CONDITIONS
from vgpu.timefmt import rfc3339
from vgpu.usage_samples import sampled

log = logging.getLogger(__name__)
Dated = tuple[NodeUsage, float]  # a plugin's document and when it was sampled


def dated(document: NodeUsage) -> Dated:
    """What the autoscaler holds of a plugin's document: the document and its time (ValueError when unreadable)."""
    return document, sampled(document).at


RUNNING: Final = "AutoscalerRunning"
Report = tuple[dict[str, Any], tuple[Condition, ...]]
KEEP: Final[Report] = ({}, ())  # report(): nothing evaluated yet in this term, keep what the status says


class AutoscalerController:
    """One pass (:meth:`tick`) of the three layers; :meth:`report` is what the status writer adds."""

    def __init__(
        self,
        gateway: KubeGateway,
        cache: ClusterCache,
        events: EventRecorder,
        feed: UsageFeed[Dated],
        arbiter: Arbiter,
        *,
        namespace: str,
        max_replicas: int,
        checkpoint_interval: float,
        clock: Callable[[], float],
        leading: Callable[[], bool],
        ready: Callable[[], bool],
        registry: CollectorRegistry,
    ) -> None:
        self._gateway, self._cache, self._events, self._feed = gateway, cache, events, feed
        self._namespace, self._max_replicas = namespace, max_replicas
        self._checkpoint_interval, self._clock, self._leading, self._ready = checkpoint_interval, clock, leading, ready
        self._state = Autoscaler()
        self._lock = threading.Lock()
        self._reports: dict[WorkloadKey, Report] = {}
        self._passed = False  # a pass ran in this term as leader: the reports are this replica's
        self._last_changes: dict[WorkloadKey, dict[str, str]] = {}
        self._applied_hpa: dict[WorkloadKey, dict[str, Any]] = {}
        # (namespace, controller kind, name, UID, workload) → what the HPA scales, or why nothing
        self._targets: dict[tuple[str, str, str, str, str], tuple[OwnerRef | None, str | None]] = {}
        self._checkpoints: dict[WorkloadKey, str] | None = None  # read once per leadership
        self._restored: set[WorkloadKey] = set()
        self._next_checkpoint = 0.0
        prefix = metric_names.AUTOSCALER
        self.decisions = Counter(
            f"{prefix}_decisions_total", "Decisions made, by layer and reason.", ["layer", "reason"], registry=registry
        )
        self.writes = Counter(
            f"{prefix}_writes_total", "Writes the autoscaler made, by what and result.", ["what", "result"],
            registry=registry,
        )  # fmt: skip
        self.workloads = Gauge(f"{prefix}_workloads", "Workloads with a layer enabled.", registry=registry)
        self.pass_seconds = Histogram(f"{prefix}_pass_seconds", "Time one pass took.", registry=registry)
        self._in_place = InPlace(gateway, cache, arbiter)
        self._resizer = RequestResizer(
            self._in_place, cache, events, lambda result: self.writes.labels("requests", result).inc()
        )

    # --- the pass ----------------------------------------------------------------------------------
    def tick(self) -> None:
        if not self._ready() or not self._leading():
            with self._lock:
                self._passed = False
            self._checkpoints = None  # a new term reads them again: another leader may have written since
            self._restored.clear()
            return
        with self.pass_seconds.time():
            self._pass()
        with self._lock:
            self._passed = True

    def report(self, ref: ObjectRef) -> Report | None:
        """The workload's autoscaling status; :data:`KEEP` until this replica's first pass as leader (a new
        leader must not blank what its predecessor wrote in the seconds before it has evaluated anything)."""
        namespace, name = ref
        with self._lock:
            if not self._passed:
                return KEEP
            return None if namespace is None else self._reports.get((namespace, name))

    def _pass(self) -> None:
        found = autoscaled(self._cache.records(), self._cache.nodes(), max_replicas=self._max_replicas)
        self.workloads.set(len(found))
        if not found:
            self._state.feed((), ())
            with self._lock:
                self._reports = {}
            return
        self._feed.poll()
        self._state.feed(samples_of(self._feed.held()), (a.workload for a in found.values()))
        self._restore(found)
        now = self._clock()
        reports = {}
        for key, item in found.items():
            evaluation = self._state.evaluate(item.workload, now)
            self._count(evaluation)
            self._apply_limits(key, evaluation.limits, now)
            hpa_name, problem = self._apply_replicas(key, item, evaluation)
            self._note_requests(key, evaluation, now)
            no_room = 0
            if item.workload.config.requests.enable:
                done, no_room = self._resizer.apply(item.workload, evaluation.requests_tflops, evaluation.requests_vram)
                if done:
                    self._last_changes.setdefault(key, {})["requests"] = rfc3339(now)
            reports[key] = autoscaling_status(
                item.workload,
                evaluation,
                hpa=hpa_name,
                replicas_problem=problem,
                predictions=item.predictions,
                last_changes=self._last_changes.get(key, {}),
                no_room=no_room,
            )
        with self._lock:
            self._reports = reports
        self._forget_hpas(found)
        if now >= self._next_checkpoint:
            self._next_checkpoint = now + self._checkpoint_interval
            self._save(found)

    def _count(self, evaluation: Evaluation) -> None:
        for d in evaluation.limits:
            self.decisions.labels("limits", d.tflops.reason.value).inc()
        for layer, decision in (
            ("requests", evaluation.requests_tflops),
            ("requests", evaluation.requests_vram),
            ("replicas", evaluation.replicas),
        ):
            if decision is not None:
                self.decisions.labels(layer, decision.reason.value).inc()

    # --- limits ------------------------------------------------------------------------------------
    def _apply_limits(self, key: WorkloadKey, decisions: tuple[LimitDecision, ...], now: float) -> None:
        by_pod: dict[str, list[LimitDecision]] = {}
        for d in decisions:
            if d.changed:
                by_pod.setdefault(d.pod, []).append(d)
        for pod, changes in by_pod.items():
            if self._write_limits(key[0], pod, changes):
                self._last_changes.setdefault(key, {})["limits"] = rfc3339(now)

    def _write_limits(self, namespace: str, name: str, changes: list[LimitDecision]) -> bool:
        """Change the pod's limits as decided, through the ledger like a bind (``InPlace``): a raised VRAM
        limit is held on the GPU, so it is judged against what the ledger holds *now* (a pod placed there
        since the decision) under the cache's lock, written conditional on the pod's resourceVersion, and
        checked against the node's allocations listed after the write (another replica's placement)."""
        ref = PodRef(namespace=namespace, name=name, uid=changes[0].pod_uid)
        record = self._cache.record(ref.uid)
        current = None if record is None or record.terminal or record.deleting else record.allocation
        if current is None:
            return False  # gone since the decision
        updated = _with_limits(current, changes)
        if updated is None:  # the allocation moved since the decision: decide again next pass
            self.writes.labels("limits", "stale").inc()
            return False
        outcome = self._in_place.change(ref, current, updated, "limits")
        self.writes.labels("limits", outcome).inc()
        if outcome != "ok":
            return False
        for d in changes:
            for decision in (d.tflops, d.vram):
                if decision.changed:
                    self._events.normal(ref, decision.reason.value, f"GPU {d.gpu}: {decision.message}")
        return True

    # --- replicas ----------------------------------------------------------------------------------
    def _apply_replicas(
        self, key: WorkloadKey, item: Autoscaled, evaluation: Evaluation
    ) -> tuple[str | None, str | None]:
        workload = item.workload
        if not workload.config.replicas.enable:
            return None, None
        if item.owner is None:
            return None, "the workload's pods have no controller (bare pods): there is no scale to set"
        target, refused = self._scale_target(workload.namespace, item.owner, workload.name)
        if target is None:
            return None, refused
        body, clamped = hpa.manifest(
            workload.namespace,
            workload.name,
            target,
            workload.config.replicas,
            target_tflops=evaluation.replica_target_tflops,
            min_replicas=workload.min_replicas,
            max_replicas=workload.max_replicas,
        )
        name = body["metadata"]["name"]
        if self._applied_hpa.get(key) != body:
            try:
                self._gateway.upsert_hpa(workload.namespace, body)
            except GatewayError as exc:
                self.writes.labels("hpa", "api-error").inc()
                return None, f"cannot apply HorizontalPodAutoscaler {workload.namespace}/{name}: {exc}"
            self.writes.labels("hpa", "ok").inc()
            self._applied_hpa[key] = body
        problem = "; ".join(clamped) or None
        return name, problem

    def _scale_target(self, namespace: str, owner: OwnerRef, workload: str) -> tuple[OwnerRef | None, str | None]:
        """What the HPA may scale for pods controlled by ``owner``: the ReplicaSet's Deployment (or the
        StatefulSet, or a bare ReplicaSet) — only when it is the object the pods name and its own template
        opts in (``hpa.opted_in``); else None and why. Read once per controller and workload."""
        cached = (namespace, owner.kind, owner.name, owner.uid, workload)
        if cached in self._targets:
            return self._targets[cached]
        if owner.kind not in hpa.SCALABLE:
            found: tuple[OwnerRef | None, str | None] = (
                None,
                f"the pods' controller is a {owner.kind}; the autoscaler scales {', '.join(hpa.SCALABLE)} only",
            )
        else:
            try:
                found = self._read_target(namespace, owner, workload)
            except GatewayError as exc:
                return None, f"cannot read {owner.kind} {namespace}/{owner.name} yet: {exc}"
        self._targets[cached] = found
        return found

    def _read_target(self, namespace: str, owner: OwnerRef, workload: str) -> tuple[OwnerRef | None, str | None]:
        obj = self._gateway.get_controller(owner.kind, namespace, owner.name)
        if obj is None:
            return None, f"{owner.kind} {namespace}/{owner.name} does not exist"
        target, above = owner, controller_of(obj) if owner.kind == "ReplicaSet" else None
        if above is not None:  # the pods' ReplicaSet must be the one named, and its Deployment scales
            problem = hpa.opted_in(obj, owner, workload)
            if problem or above.kind != "Deployment":
                return None, problem or f"ReplicaSet {owner.name} is controlled by a {above.kind}, not a Deployment"
            target, obj = above, self._gateway.get_controller("Deployment", namespace, above.name) or {}
        problem = hpa.opted_in(obj, target, workload)
        return (None, problem) if problem else (target, None)

    def _forget_hpas(self, found: Mapping[WorkloadKey, Autoscaled]) -> None:
        """Delete the HPAs of workloads whose live pods no longer enable the replicas layer (an HPA of a
        workload with no live pod stays: it is owned by its Deployment, and goes with it)."""
        for key in [k for k in self._applied_hpa if k in found and not found[k].workload.config.replicas.enable]:
            try:
                self._gateway.delete_hpa(key[0], self._applied_hpa[key]["metadata"]["name"])
            except GatewayError as exc:
                log.info("autoscaler: cannot delete the HPA of %s/%s yet: %s", *key, exc)
                continue
            del self._applied_hpa[key]

    # --- requests ----------------------------------------------------------------------------------
    def _note_requests(self, key: WorkloadKey, evaluation: Evaluation, now: float) -> None:
        if any(d is not None and d.changed for d in (evaluation.requests_tflops, evaluation.requests_vram)):
            self._last_changes.setdefault(key, {})["requests"] = rfc3339(now)

    # --- checkpoints -------------------------------------------------------------------------------
    def _restore(self, found: Mapping[WorkloadKey, Autoscaled]) -> None:
        if self._checkpoints is None:
            try:
                maps = self._gateway.list_config_maps(self._namespace, checkpoints.SELECTOR)
            except GatewayError as exc:
                log.warning("autoscaler: cannot read checkpoints yet (histograms start empty): %s", exc)
                return
            self._checkpoints = checkpoints.read(maps)
        for key, item in found.items():
            if key in self._restored:
                continue
            self._restored.add(key)
            text = self._checkpoints.get(key)
            if text is not None:
                ok = self._state.restore(text, item.workload)
                log.info("autoscaler: workload %s/%s %s its checkpoint", *key, "restored" if ok else "ignored")

    def _save(self, found: Mapping[WorkloadKey, Autoscaled]) -> None:
        for key in found:
            doc = self._state.checkpoint(key)
            if doc is None:
                continue
            try:
                self._gateway.upsert_config_map(self._namespace, checkpoints.config_map(self._namespace, key, doc))
            except GatewayError as exc:
                self.writes.labels("checkpoint", "api-error").inc()
                log.warning("autoscaler: checkpoint of %s/%s not saved: %s", *key, exc)
                continue
            self.writes.labels("checkpoint", "ok").inc()


def _with_limits(alloc: PodAllocation, changes: list[LimitDecision]) -> PodAllocation | None:
    """The allocation with the decided limits, or None when a grant no longer holds what was decided from."""
    by_gpu = {d.gpu: d for d in changes}
    gpus = []
    for g in alloc.gpus:
        d = by_gpu.pop(g.uuid, None)
        if d is None:
            gpus.append(g)
            continue
        if (g.tflops_limit, g.vram_limit) != (d.tflops.current, d.vram.current):
            return None
        gpus.append(replace(g, tflops_limit=d.tflops.value, vram_limit=d.vram.value))
    return None if by_gpu else replace(alloc, gpus=tuple(gpus))


def with_autoscaling(base: StatusOf, report: Callable[[ObjectRef], Report | None]) -> StatusOf:
    """The workload status writer's ``status_of`` with the autoscaler's part added."""

    def status_of(ref: ObjectRef, workload: Mapping[str, Any]) -> Status:
        status = base(ref, workload)
        extra = report(ref)
        if extra is None:
            return status
        if extra is KEEP:
            stated = (workload.get("status") or {}).get("conditions") or ()
            kept = tuple(
                Condition(str(c["type"]), c.get("status") == "True", str(c.get("reason")), str(c.get("message") or ""))
                for c in stated
                if isinstance(c, Mapping) and c.get("type") in (*AUTOSCALING_CONDITIONS, RUNNING)
            )
            return Status(status.fields, status.conditions + kept)
        fields, conditions = extra
        return Status({**status.fields, "autoScaling": fields}, status.conditions + conditions)

    return status_of


def autoscaler_off(cache: ClusterCache, max_replicas: int) -> Callable[[ObjectRef], Report | None]:
    """The report of an extender running without its autoscaler (``--autoscaler-interval 0``): every workload
    whose pods enable a layer says, in a False ``AutoscalerRunning`` condition, that nothing acts on it.
    Made once per status pass: the autoscaled workloads are read from the cache once, not per workload."""
    found = autoscaled(cache.records(), (), max_replicas=max_replicas)

    def report(ref: ObjectRef) -> Report | None:
        namespace, name = ref
        if namespace is None:
            return None
        if (namespace, name) not in found:
            return None
        return {}, (
            Condition(
                RUNNING,
                False,
                "Disabled",
                "the extender runs with --autoscaler-interval 0: autoSetLimits, autoSetRequests and "
                "autoSetReplicas are not acted on",
            ),
        )

    return report
