"""The autoscaler's state and its evaluation pass: samples and workloads in, decisions per layer out.

The recommender (:mod:`recommend`) decides one layer for one value; a controller needs more around it:
which usage streams exist (one per pod and GPU for the limits layer, one per workload for the requests
and replicas layers), feeding each sample exactly once (a plugin's document is read every pass, but is
new only when its ``sampledAt`` moved), evaluating each layer every ``evaluationPeriod`` of its own,
forgetting pods that left, and turning a workload's histograms into a checkpoint and back. All of that
is here, over plain values and an explicit ``now`` — no clock, no I/O — so a pass can be replayed in a
test exactly as the extender's controller (``scheduler_extender/autoscaler``) runs it.

Units: TFLOPS in milli, VRAM in bytes, times in seconds on the caller's clock (Unix time: samples carry
the plugins' timestamps).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from vgpu.autoscale.config import AutoScalingConfig, Resource
from vgpu.autoscale.histogram import DecayingHistogram, PeakHistogram, sample_weight, tflops_history, vram_history
from vgpu.autoscale.recommend import Decision, limit_ceiling, recommend_limit, recommend_replicas, recommend_request
from vgpu.autoscale.window import UsageWindow
from vgpu.contract.strict import load
from vgpu.contract.usage import NodeUsage, per_pod_gpu
from vgpu.errors import DomainError

CHECKPOINT_VERSION: Final = "v1"
WorkloadKey = tuple[str, str]  # (namespace, TensorFusionWorkload name)


@dataclass(frozen=True, slots=True)
class Sample:
    """One pod's use of one GPU (its containers there together) at one plugin sample."""

    pod_uid: str
    gpu: str
    tflops: int
    vram: int
    tflops_measured: bool
    at_s: float
    interval_s: float  # the plugin's sampling interval: how old a sample may be and still count
    tflops_limit: int  # the limits in force when it was taken (the plugin's view of the pod's grant)
    vram_limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """What a pod holds on one GPU now, and what the GPU could hold for it."""

    gpu: str
    tflops_request: int
    tflops_limit: int
    vram_request: int
    vram_limit: int
    tflops_capacity: int  # the GPU's TFLOPS
    vram_capacity: int  # the GPU's memory
    # What the GPU's other pods hold there, each the larger of its VRAM request and limit: a VRAM limit is never
    # raised past what they leave free (vram_capacity - vram_others), nor a request moved past it.
    vram_others: int = 0

    @property
    def vram_room(self) -> int:
        """The most this pod may hold on the GPU: its memory less what the other pods there hold."""
        return max(self.vram_capacity - self.vram_others, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """A live pod of an autoscaled workload, with its allocation's grants and what it was admitted with."""

    uid: str
    name: str
    grants: tuple[Grant, ...]  # empty: not placed yet
    admitted_tflops_limit: int  # per GPU, from the resolved request: the floor a lowered limit returns to
    admitted_vram_limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One TensorFusionWorkload whose pods enable a layer; ``config`` is its newest pod's."""

    namespace: str
    name: str
    config: AutoScalingConfig
    members: tuple[Member, ...]
    tflops_request: int  # per GPU, what its pods are admitted with now
    tflops_limit: int
    vram_request: int
    vram_limit: int
    gpu_count: int
    replicas: int  # what the owner asks for now (its scale), else the live members
    min_replicas: int
    max_replicas: int

    @property
    def key(self) -> WorkloadKey:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class LimitDecision:
    """The limits layer's decision for one pod on one GPU."""

    pod_uid: str
    pod: str
    gpu: str
    tflops: Decision
    vram: Decision

    @property
    def changed(self) -> bool:
        return self.tflops.changed or self.vram.changed


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What one pass decided for one workload; a layer not due this pass keeps its last decisions."""

    limits: tuple[LimitDecision, ...]
    requests_tflops: Decision | None
    requests_vram: Decision | None
    replicas: Decision | None
    replica_target_tflops: int  # the HPA's per-replica target: targetTFlopsOfLimits × the most a limit may reach


@dataclass(slots=True)
class _Stream:
    """One resource's use of one GPU by one pod over the last evaluation period, and the limit the newest
    sample was taken under (``limit``), with the time of the first sample taken under it (``since_s``)."""

    window: UsageWindow
    limit: int = -1
    since_s: float = 0.0

    def add(self, value: int | None, limit: int, at_s: float) -> None:
        """A sample taken under ``limit`` (a new one starts its ``since_s``); ``value`` None: not measured."""
        if limit != self.limit:
            self.limit, self.since_s = limit, at_s
        if value is not None:
            self.window.add_sample(value, at_s)

    def settled(self, limit: int, now_s: float) -> bool:
        """Whether the window ending at ``now_s`` holds only samples taken under ``limit``, the limit in force,
        after the first of them (taken while the use may still lag the change): lowering needs no less."""
        return self.limit == limit and self.window.begins_after(self.since_s, now_s)


@dataclass(slots=True)
class _PodStreams:
    tflops: _Stream
    vram: _Stream
    last_s: float = -1.0


@dataclass(slots=True)
class _WorkloadState:
    tflops: DecayingHistogram
    vram: PeakHistogram
    aggregation_period_s: float
    replicas: UsageWindow
    interval_s: float = 0.0
    last_scaled_s: float | None = None
    last_replicas: int | None = None
    due: dict[str, float] = field(default_factory=dict)  # layer → next evaluation time
    last: dict[str, Any] = field(default_factory=dict)  # layer → its last decisions
    pod_seen: dict[str, float] = field(default_factory=dict)  # pod UID → newest sample fed to the histograms


class Autoscaler:
    """Every autoscaled workload's usage state; :meth:`feed` samples, then :meth:`evaluate` at ``now``."""

    def __init__(self) -> None:
        self._workloads: dict[WorkloadKey, _WorkloadState] = {}
        self._pods: dict[tuple[str, str], _PodStreams] = {}  # (pod UID, GPU) → the limits layer's windows

    def __len__(self) -> int:
        return len(self._workloads)

    def streams(self) -> int:
        return len(self._pods)

    def feed(self, samples: Iterable[Sample], workloads: Iterable[Workload]) -> int:
        """Count each sample of a member once; forget the state of workloads and pods that are gone.
        Returns how many samples were new."""
        by_uid: dict[str, tuple[Workload, Member]] = {}
        live = {}
        for w in workloads:
            live[w.key] = w
            for m in w.members:
                by_uid[m.uid] = (w, m)
        for key in [k for k in self._workloads if k not in live]:
            del self._workloads[key]
        for key in [k for k in self._pods if k[0] not in by_uid]:
            del self._pods[key]
        fed = 0
        per_pod: dict[tuple[str, float], list[Sample]] = {}
        for s in samples:
            owner = by_uid.get(s.pod_uid)
            if owner is None:
                continue
            w, m = owner
            streams = self._pod(w, m.uid, s.gpu)
            if s.at_s <= streams.last_s:
                continue
            streams.last_s = s.at_s
            fed += 1
            streams.tflops.add(s.tflops if s.tflops_measured else None, s.tflops_limit, s.at_s)
            streams.vram.add(s.vram, s.vram_limit, s.at_s)
            per_pod.setdefault((s.pod_uid, s.at_s), []).append(s)
        for (uid, at_s), on_gpus in per_pod.items():
            w, m = by_uid[uid]
            state = self._workload(w)
            state.interval_s = max(s.interval_s for s in on_gpus)
            state.pod_seen[uid] = at_s
            request = w.tflops_request * w.gpu_count
            for s in on_gpus:
                if s.tflops_measured:
                    state.tflops.add_sample(s.tflops, sample_weight(request), s.at_s)
                state.vram.add_sample(s.vram, s.at_s)
            if all(s.tflops_measured for s in on_gpus):
                state.replicas.add_sample(sum(s.tflops for s in on_gpus), at_s)
        for state in self._workloads.values():
            state.pod_seen = {uid: t for uid, t in state.pod_seen.items() if uid in by_uid}
        return fed

    def evaluate(self, workload: Workload, now_s: float) -> Evaluation:
        """The decisions of every layer due at ``now_s`` (the others repeat their last ones)."""
        state = self._workload(workload)
        config = workload.config
        interval = state.interval_s or 1.0
        limits = state.last.get("limits", ())
        if config.limits.enable and self._due(state, "limits", config.limits.evaluation_period_s, now_s):
            limits = tuple(self._limit(workload, m, g, now_s, interval) for m in workload.members for g in m.grants)
            state.last["limits"] = limits
        requests = state.last.get("requests", (None, None))
        if config.requests.enable and self._due(state, "requests", config.requests.evaluation_period_s, now_s):
            requests = tuple(self._request(workload, state, r, now_s, interval) for r in Resource)
            state.last["requests"] = requests
        ceiling = self.limit_ceiling(workload)
        target = int(config.replicas.target_tflops_of_limits * ceiling)
        replicas = state.last.get("replicas")
        if state.last_replicas is not None and workload.replicas != state.last_replicas:
            state.last_scaled_s = now_s  # whoever changed the scale (the HPA, a user), cool-downs count from it
        state.last_replicas = workload.replicas
        if config.replicas.enable and self._due(state, "replicas", config.replicas.evaluation_period_s, now_s):
            replicas = recommend_replicas(
                config.replicas,
                state.replicas.stats(now_s, interval_s=interval, streams=max(1, len(workload.members))),
                replicas=workload.replicas,
                max_limit=ceiling,
                last_scaled_s=state.last_scaled_s,
                now_s=now_s,
                min_replicas=workload.min_replicas,
                max_replicas=workload.max_replicas,
            )
            state.last["replicas"] = replicas
        return Evaluation(limits, requests[0], requests[1], replicas, target)

    @staticmethod
    def limit_ceiling(workload: Workload) -> int:
        """The most a replica's TFLOPS limit may reach, over all its GPUs: maxRatioToRequests × request
        within the GPU when the limits layer is on, else the limit."""
        per_gpu = workload.tflops_limit
        if workload.config.limits.enable:
            capacity = max((g.tflops_capacity for m in workload.members for g in m.grants), default=0)
            per_gpu = limit_ceiling(
                workload.config.limits, request=workload.tflops_request, capacity=capacity or per_gpu
            )
            per_gpu = max(per_gpu, workload.tflops_limit)
        return per_gpu * workload.gpu_count

    # --- checkpoints (VPA keeps its histograms in VerticalPodAutoscalerCheckpoint objects) ------------
    def checkpoint(self, key: WorkloadKey) -> dict[str, Any] | None:
        state = self._workloads.get(key)
        if state is None or (state.tflops.is_empty() and state.vram.is_empty()):
            return None
        return {
            "version": CHECKPOINT_VERSION,
            "namespace": key[0],
            "workload": key[1],
            "aggregationPeriodSeconds": state.aggregation_period_s,
            "tflops": state.tflops.to_checkpoint(),
            "vram": state.vram.to_checkpoint(),
        }

    def restore(self, text: str, workload: Workload) -> bool:
        """Take a workload's histograms from a checkpoint written by :meth:`checkpoint`; False (and nothing
        changes) when it is another workload's, for another aggregation period, or unreadable."""
        try:
            r = load(text, "autoscaler checkpoint", (CHECKPOINT_VERSION,))
            same = (
                r.text("namespace"),
                r.text("workload"),
                r.number("aggregationPeriodSeconds"),
            ) == (workload.namespace, workload.name, workload.config.requests.aggregation_period_s)
            tflops = DecayingHistogram.from_checkpoint(r.obj("tflops") or {}, path="tflops")
            vram = PeakHistogram.from_checkpoint(r.obj("vram") or {}, path="vram")
            r.done()
        except (DomainError, ValueError):
            return False
        if not same:
            return False
        state = self._workload(workload)
        state.tflops.merge(tflops)
        state.vram.merge(vram)
        return True

    # --- internals -------------------------------------------------------------------------------------
    def _workload(self, w: Workload) -> _WorkloadState:
        state = self._workloads.get(w.key)
        period = w.config.requests.aggregation_period_s
        if state is None or state.aggregation_period_s != period:
            state = _WorkloadState(
                tflops=tflops_history(period),
                vram=vram_history(period),
                aggregation_period_s=period,
                replicas=UsageWindow(w.config.replicas.evaluation_period_s),
            )
            self._workloads[w.key] = state
        elif state.replicas.length_s != w.config.replicas.evaluation_period_s:
            state.replicas = UsageWindow(w.config.replicas.evaluation_period_s)
        return state

    def _pod(self, w: Workload, uid: str, gpu: str) -> _PodStreams:
        period = w.config.limits.evaluation_period_s
        streams = self._pods.get((uid, gpu))
        if streams is None or streams.tflops.window.length_s != period:
            streams = _PodStreams(_Stream(UsageWindow(period)), _Stream(UsageWindow(period)))
            self._pods[(uid, gpu)] = streams
        return streams

    @staticmethod
    def _due(state: _WorkloadState, layer: str, period_s: float, now_s: float) -> bool:
        if now_s < state.due.get(layer, 0.0):
            return False
        state.due[layer] = now_s + period_s
        return True

    def _limit(self, w: Workload, m: Member, g: Grant, now_s: float, interval: float) -> LimitDecision:
        streams = self._pod(w, m.uid, g.gpu)
        config = w.config.limits
        return LimitDecision(
            m.uid,
            m.name,
            g.gpu,
            recommend_limit(
                config,
                Resource.TFLOPS,
                streams.tflops.window.stats(now_s, interval_s=interval),
                request=g.tflops_request,
                limit=g.tflops_limit,
                admitted_limit=m.admitted_tflops_limit,
                capacity=g.tflops_capacity,
                settled=streams.tflops.settled(g.tflops_limit, now_s),
            ),
            recommend_limit(
                config,
                Resource.VRAM,
                streams.vram.window.stats(now_s, interval_s=interval),
                request=g.vram_request,
                limit=g.vram_limit,
                admitted_limit=m.admitted_vram_limit,
                capacity=g.vram_capacity,
                others=g.vram_others,
                settled=streams.vram.settled(g.vram_limit, now_s),
            ),
        )

    @staticmethod
    def _request(w: Workload, state: _WorkloadState, resource: Resource, now_s: float, interval: float) -> Decision:
        tflops = resource is Resource.TFLOPS
        capacities = [g.tflops_capacity if tflops else g.vram_room for m in w.members for g in m.grants]
        limit = w.tflops_limit if tflops else w.vram_limit
        return recommend_request(
            w.config.requests,
            resource,
            state.tflops if tflops else state.vram,
            request=w.tflops_request if tflops else w.vram_request,
            limit=limit,
            capacity=max(capacities, default=limit),
            now_s=now_s,
            sample_interval_s=interval,
        )


def samples_of(documents: Iterable[tuple[NodeUsage, float]]) -> list[Sample]:
    """One :class:`Sample` per pod and GPU from device plugins' usage documents, each with its ``sampledAt``
    as Unix seconds (the shell reads the time), their containers on one GPU added together."""
    out: list[Sample] = []
    for doc, at_s in documents:
        for (uid, gpu), cs in per_pod_gpu(doc.containers).items():
            tflops, vram = sum(c.tflops_used for c in cs), sum(c.vram_used for c in cs)
            measured = all(c.tflops_measured for c in cs)
            limits = max(c.tflops_limit for c in cs), max(c.vram_limit for c in cs)  # one grant: equal
            out.append(Sample(uid, gpu, tflops, vram, measured, at_s, doc.interval_s, *limits))
    return out
