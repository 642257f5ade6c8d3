"""The request model: a pod's label and annotations, plus the layers it refers to, to one GpuRequest.

Precedence, field by field: annotation > TensorFusionWorkload spec (``generate-workload: false``) >
WorkloadProfile > pool defaults > built-in defaults. A field set by a lower layer is honoured when a
higher layer leaves it unset (TensorFusion overwrote the profile's pool and isLocalGPU; we don't).
After layering, request defaults to limit and the other way round, and request ≤ limit.

Every problem is collected, not just the first, and each message names the key, quotes the value
and says what is accepted; the webhook shows them to the user verbatim.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vgpu import compute_percent, container_gpus, fields, mig
from vgpu.errors import DomainError, FieldError
from vgpu.names import (
    DEFAULT_POOL,
    LABEL_ENABLED,
    MAX_EVICTION_PROTECTION_S,
    PREFIX,
    TF_UNSERVED_KEYS,
    TF_UNSUPPORTED_KEYS,
    VENDOR_NVIDIA,
    Annotation,
    IsolationMode,
    PlacementPolicy,
    Qos,
    SystemAnnotation,
)
from vgpu.profile import AutoScaling, ProfileSpec, Resources
from vgpu.quantity import humanize_bytes, humanize_tflops

A = Annotation
_KNOWN_KEYS = frozenset(a.value for a in Annotation) | frozenset(a.value for a in SystemAnnotation)
_USER_KEYS = ", ".join(sorted(a.value for a in Annotation))  # what an unknown key is told
_USER_KEY_SUFFIXES = sorted(a.value.removeprefix(PREFIX) for a in Annotation)
_ANNOTATIONS = "the pod's annotations"
_AUTO_FLAGS = {A.AUTO_REQUESTS: "autoSetRequests", A.AUTO_LIMITS: "autoSetLimits", A.AUTO_REPLICAS: "autoSetReplicas"}
_SHORT_FORM = ("autoSetRequests", "autoSetLimits")  # what tensor-fusion.ai/autoscale switches on
_AUTOSCALE_TARGETS = {"compute": "tflops", "vram": "vram", "all": "all"}  # TensorFusion's words -> targetResource
# The annotations that size a share of a GPU, which a dedicated (whole) GPU has no use for.
SHARE_KEYS = (
    A.TFLOPS_REQUEST,
    A.TFLOPS_LIMIT,
    A.COMPUTE_PERCENT_REQUEST,
    A.COMPUTE_PERCENT_LIMIT,
    A.VRAM_REQUEST,
    A.VRAM_LIMIT,
)
# The two forms of compute, by side: (TFLOPS field, percent field, TFLOPS key, percent key).
_COMPUTE_SIDES = (
    ("tflops_request", "percent_request", A.TFLOPS_REQUEST, A.COMPUTE_PERCENT_REQUEST),
    ("tflops_limit", "percent_limit", A.TFLOPS_LIMIT, A.COMPUTE_PERCENT_LIMIT),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodView:
    """What the request model needs of a pod."""

    name: str = ""
    namespace: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    containers: tuple[str, ...] = ()

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodView:
        """From raw Pod JSON (as the API server or an AdmissionReview carries it); tolerant of gaps."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        containers = tuple(str(c.get("name", "")) for c in spec.get("containers") or () if isinstance(c, Mapping))
        return cls(
            name=str(meta.get("name") or meta.get("generateName") or ""),
            namespace=str(meta.get("namespace") or "default"),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
            containers=containers,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuRequest:
    """One normalised GPU request. TFLOPS in milli, VRAM in bytes; all values are per GPU."""

    pool: str
    containers: tuple[str, ...]
    gpu_count: int
    tflops_request: int
    tflops_limit: int
    vram_request: int
    vram_limit: int
    qos: Qos
    gpu_model: str | None = None
    # Whole GPUs no other pod shares (the core's whole-GPU demand): the four share fields are then 0,
    # and the grant at bind is each GPU's capacity, whatever its model.
    dedicated_gpu: bool = False
    is_local_gpu: bool = False
    # standaloneWorkerMode over every layer: the annotation no-standalone-worker-mode: "true" sets it,
    # as in TensorFusion despite the name, and so does a lower layer's standaloneWorkerMode: true.
    no_standalone_worker_mode: bool = False
    workload: str | None = None
    generate_workload: bool | None = None
    workload_profile: str | None = None
    replicas: int | None = None
    placement_policy: PlacementPolicy | None = None
    node_affinity: Mapping[str, Any] | None = None
    auto_scaling: AutoScaling = field(default_factory=dict)
    # Set when autoSetRequests replaced the requests at admission: from what, and the values replaced.
    auto_requests: str | None = None
    # How the share is held on the GPU (docs/isolation.md); None: whatever the granted GPU serves first.
    isolation: IsolationMode | None = None
    # Seconds from its grant during which no preemption takes the pod (eviction-protection); None: none.
    eviction_protection_s: int | None = None
    # GPUs per inject container (container-gpu-count), in ``containers`` order, summing to gpu_count: each
    # container gets GPUs of its own. None: every container gets all gpu_count GPUs.
    container_gpu_counts: container_gpus.Counts | None = None
    # The node's GPUs, by index, the pod must be granted (gpu-indices; gpu_count of them); None: any.
    gpu_indices: tuple[int, ...] | None = None
    # Compute asked as a percentage of each granted GPU (thousandths, vgpu.compute_percent), both set or
    # neither. When set, the TFLOPS fields are the admission charge (:func:`charged`): the share of the
    # largest GPU the pod may land on; the grant is the share of the GPU it lands on.
    compute_percent_request: int | None = None
    compute_percent_limit: int | None = None

    def describe(self) -> str:
        """One line for events and the CLI: ``2× 10 TFLOPS / 4Gi per GPU (limit 20 / 4Gi), A100``, or
        ``2× whole GPU, A100``."""
        count = f"{self.gpu_count}× " if self.gpu_count > 1 else ""
        model = f", {self.gpu_model}" if self.gpu_model else ""
        if self.container_gpu_counts is not None:
            model += ", GPUs per container: " + ", ".join(f"{c} {n}" for c, n in self.container_gpu_counts)
        if self.dedicated_gpu:
            return f"{count}whole GPU{model}"
        request, limit = humanize_tflops(self.tflops_request) + " TFLOPS", humanize_tflops(self.tflops_limit)
        if self.compute_percent_request is not None and self.compute_percent_limit is not None:
            request = f"{compute_percent.show(self.compute_percent_request)} of the GPU"
            limit = compute_percent.show(self.compute_percent_limit)
        return (
            f"{count}{request} / {humanize_bytes(self.vram_request)} per GPU "
            f"(limit {limit} / {humanize_bytes(self.vram_limit)}){model}"
        )


def charged(req: GpuRequest, base: int) -> GpuRequest:
    """A percent request with its TFLOPS set to its share of a GPU of ``base`` milli-TFLOPS (the largest it
    may land on: :func:`vgpu.compute_percent.charge_base`); any other request as it is."""
    if req.compute_percent_request is None or req.compute_percent_limit is None:
        return req
    return replace(
        req,
        tflops_request=compute_percent.tflops_on(req.compute_percent_request, base),
        tflops_limit=compute_percent.tflops_on(req.compute_percent_limit, base),
    )


def is_enabled(labels: Mapping[str, str]) -> bool:
    """Whether the pod opted in. A malformed label value is an error, not a silent opt-out."""
    raw = labels.get(LABEL_ENABLED)
    if raw is None:
        return False
    errors: list[FieldError] = []
    value = fields.boolean(f"label {LABEL_ENABLED}", raw, errors)
    if errors:
        raise DomainError(errors)
    return bool(value)


def resolve(
    pod: PodView,
    *,
    profile: ProfileSpec | None = None,
    workload: ProfileSpec | None = None,
    pools: Mapping[str, ProfileSpec] | None = None,
    default_pool: str = DEFAULT_POOL,
) -> GpuRequest:
    """Resolve the pod's GPU request, or raise DomainError listing every problem.

    ``pools`` maps pool name to its defaults; when given, an unknown pool is an error. The caller
    fetches the profile/workload the annotations name (``referenced_profile``/``referenced_workload``).
    """
    errors: list[FieldError] = []
    ann = pod.annotations
    _unknown_keys(ann, errors)
    top = _annotation_layer(ann, errors)
    pool_name = top.pool_name or (workload and workload.pool_name) or (profile and profile.pool_name) or default_pool
    pool = None
    if pools is not None:
        pool = pools.get(pool_name)
        if pool is None:
            errors.append(
                FieldError(A.GPUPOOL, pool_name, f"no such GPU pool; known: {', '.join(sorted(pools)) or 'none'}")
            )
    layers = [(_ANNOTATIONS, top)]
    named = (("the workload", workload), ("the WorkloadProfile", profile), (f"pool {pool_name} defaults", pool))
    layers += [(n, s) for n, s in named if s]

    def pick_from(attr: str) -> tuple[Any, str]:
        return next(((getattr(s, attr), n) for n, s in layers if getattr(s, attr) is not None), (None, ""))

    def pick(attr: str) -> Any:
        return pick_from(attr)[0]

    def pick_res(attr: str) -> tuple[int | None, str]:
        return next(
            ((getattr(s.resources, attr), n) for n, s in layers if getattr(s.resources, attr) is not None), (None, "")
        )

    dedicated = bool(_flag(ann, A.DEDICATED_GPU, errors))
    if dedicated:  # a lower layer's share is a default for shared pods; the pod's own is a contradiction
        errors += [
            FieldError(k, fields.shown(ann[k]), f'not allowed with {A.DEDICATED_GPU}: "true" (whole GPUs); remove one')
            for k in SHARE_KEYS
            if k in ann
        ]
        tflops = vram = (0, 0)
        percent = None
    else:
        tflops, percent = _compute(layers, errors)
        vram = _pair("vram", pick_res("vram_request"), pick_res("vram_limit"), humanize_bytes, errors)
    if tflops == (0, 0) and percent is None and vram == (0, 0) and not dedicated and not errors:
        errors.append(
            FieldError(
                A.TFLOPS_REQUEST,
                None,
                "the pod asks for no GPU compute and no VRAM; set tflops-request/vram-request (or a workload-profile), "
                f'or {A.DEDICATED_GPU}: "true" for whole GPUs',
            )
        )
    is_local = pick("is_local_gpu") or False
    standalone, standalone_from = pick_from("standalone_worker_mode")
    if standalone and not is_local:
        _standalone_needs_local(standalone_from, errors)
    generate = _flag(ann, A.GENERATE_WORKLOAD, errors)
    workload_name = _name(ann, A.WORKLOAD, errors)
    if generate is False and workload_name is None:
        errors.append(
            FieldError(A.GENERATE_WORKLOAD, "false", f"needs {A.WORKLOAD} naming the existing workload to use")
        )
    containers, split = _containers_and_split(ann, pod.containers, top.gpu_count, errors)
    policy = None
    if A.PLACEMENT_POLICY in ann:
        chosen = fields.choice(A.PLACEMENT_POLICY, ann[A.PLACEMENT_POLICY], tuple(PlacementPolicy), errors)
        policy = PlacementPolicy(chosen) if chosen else None
    auto = _auto(ann, pick_auto(layers), errors)
    protection = _protection(ann.get(A.EVICTION_PROTECTION), errors)
    indices = _indices(ann.get(A.GPU_INDICES), errors)
    count = sum(n for _, n in split or ()) or pick("gpu_count") or (len(indices) if indices else 1)
    if indices and len(indices) != count:
        source = f"the sum of {A.CONTAINER_GPU_COUNT}" if split else A.GPU_COUNT
        errors.append(
            FieldError(
                A.GPU_INDICES,
                ann[A.GPU_INDICES],
                f"names {len(indices)} GPUs but the pod asks for {count} ({source}); give as many indices as GPUs",
            )
        )
    isolation, isolation_from = pick_from("isolation")
    _isolation_fits_model(isolation, isolation_from, pick("gpu_model"), errors)
    if percent is not None:
        _percent_fits(pick("gpu_model"), auto, errors)
    if errors:
        raise DomainError(errors)
    return GpuRequest(
        pool=pool_name,
        containers=containers,
        gpu_count=count,
        tflops_request=tflops[0],
        tflops_limit=tflops[1],
        vram_request=vram[0],
        vram_limit=vram[1],
        qos=pick("qos") or Qos.MEDIUM,
        gpu_model=pick("gpu_model"),
        dedicated_gpu=dedicated,
        is_local_gpu=is_local,
        no_standalone_worker_mode=bool(standalone),
        workload=workload_name,
        generate_workload=generate,
        workload_profile=ann.get(A.WORKLOAD_PROFILE),
        replicas=pick("replicas"),
        placement_policy=policy,
        node_affinity=pick("node_affinity"),
        auto_scaling=auto,
        isolation=isolation,
        eviction_protection_s=protection,
        container_gpu_counts=split,
        gpu_indices=indices,
        compute_percent_request=None if percent is None else percent[0],
        compute_percent_limit=None if percent is None else percent[1],
    )


def referenced_profile(pod: PodView) -> str | None:
    """The WorkloadProfile name the pod refers to (same namespace), for the caller to fetch."""
    return pod.annotations.get(A.WORKLOAD_PROFILE) or None


def referenced_workload(pod: PodView) -> str | None:
    """The workload whose spec the pod must use (``generate-workload: "false"``), for the caller to fetch."""
    if pod.annotations.get(A.GENERATE_WORKLOAD) == "false":
        return pod.annotations.get(A.WORKLOAD) or None
    return None


def pick_auto(layers: Sequence[tuple[str, ProfileSpec]]) -> AutoScaling:
    """The highest layer's auto-scaling config, block by block."""
    merged: dict[str, Mapping[str, Any]] = {}
    for _, spec in reversed(layers):
        merged.update(spec.auto_scaling)
    return merged


def _annotation_layer(ann: Mapping[str, str], errors: list[FieldError]) -> ProfileSpec:
    def get(key: A) -> str | None:
        return ann.get(key)

    resources = Resources(
        tflops_request=_opt(get(A.TFLOPS_REQUEST), lambda v: fields.milli(A.TFLOPS_REQUEST, v, errors)),
        tflops_limit=_opt(get(A.TFLOPS_LIMIT), lambda v: fields.milli(A.TFLOPS_LIMIT, v, errors)),
        vram_request=_opt(get(A.VRAM_REQUEST), lambda v: fields.byte_count(A.VRAM_REQUEST, v, errors)),
        vram_limit=_opt(get(A.VRAM_LIMIT), lambda v: fields.byte_count(A.VRAM_LIMIT, v, errors)),
        percent_request=_opt(
            get(A.COMPUTE_PERCENT_REQUEST), lambda v: compute_percent.parse(A.COMPUTE_PERCENT_REQUEST, v, errors)
        ),
        percent_limit=_opt(
            get(A.COMPUTE_PERCENT_LIMIT), lambda v: compute_percent.parse(A.COMPUTE_PERCENT_LIMIT, v, errors)
        ),
    )
    for *_, tflops_key, percent_key in _COMPUTE_SIDES:
        if tflops_key in ann and percent_key in ann:
            errors.append(
                FieldError(
                    percent_key,
                    fields.shown(ann[percent_key]),
                    f"not with {tflops_key}: compute is asked in TFLOPS or in percent of a GPU, one of the two",
                )
            )
    qos = _opt(get(A.QOS), lambda v: fields.choice(A.QOS, v, tuple(Qos), errors))
    isolation = _opt(get(A.ISOLATION), lambda v: fields.choice(A.ISOLATION, v, tuple(IsolationMode), errors))
    model = get(A.GPU_MODEL)
    if model is not None and not model.strip():
        errors.append(
            FieldError(A.GPU_MODEL, model, "must name a GPU model such as A100, H100, L4 or NVIDIA A100-SXM4-80GB")
        )
        model = None
    _name(ann, A.WORKLOAD_PROFILE, errors)
    vendor = get(A.VENDOR)
    if vendor is not None and vendor.strip().casefold() != VENDOR_NVIDIA:
        errors.append(
            FieldError(
                A.VENDOR, vendor, f"only {VENDOR_NVIDIA} GPUs are served by tensor-fusion here (accepted: nvidia)"
            )
        )
    return ProfileSpec(
        resources=resources,
        replicas=_opt(get(A.REPLICAS), lambda v: fields.integer(A.REPLICAS, v, 0, fields.MAX_REPLICAS, errors)),
        pool_name=_name(ann, A.GPUPOOL, errors),
        qos=Qos(qos) if qos else None,
        is_local_gpu=_flag(ann, A.IS_LOCAL_GPU, errors),
        standalone_worker_mode=_flag(ann, A.NO_STANDALONE_WORKER_MODE, errors),
        gpu_model=model,
        gpu_count=_opt(get(A.GPU_COUNT), lambda v: fields.integer(A.GPU_COUNT, v, 1, fields.MAX_GPU_COUNT, errors)),
        isolation=IsolationMode(isolation) if isolation else None,
    )


def _compute(
    layers: Sequence[tuple[str, ProfileSpec]], errors: list[FieldError]
) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """The compute request and limit: (TFLOPS pair, None), or ((0, 0), percent pair).

    Each side comes from the highest layer that sets it in either form (TFLOPS or percent), so a pod's
    percent overrides its profile's TFLOPS and the other way round; the two sides must then agree on the
    form (a percent request under a TFLOPS limit compares nothing), and the missing side defaults to the other.
    """
    sides = [_compute_side(layers, tflops_field, percent_field) for tflops_field, percent_field, *_ in _COMPUTE_SIDES]
    request, limit = sides
    if request is not None and limit is not None and request.percent != limit.percent:
        percent, tflops = (request, limit) if request.percent else (limit, request)
        key = _COMPUTE_SIDES[0 if request.percent else 1][3]
        errors.append(
            FieldError(
                key,
                compute_percent.show(percent.value),
                f"from {percent.source}, not with a TFLOPS {'limit' if request.percent else 'request'} from "
                f"{tflops.source}: a request and a limit in different forms compare nothing; ask both in TFLOPS or "
                "both in percent of a GPU",
            )
        )
        return (0, 0), None
    ends = [(None, "") if side is None else (side.value, side.source) for side in sides]
    if any(side is not None and side.percent for side in sides):
        return (0, 0), _pair("compute-percent", ends[0], ends[1], compute_percent.show, errors)
    return _pair("tflops", ends[0], ends[1], humanize_tflops, errors), None


@dataclass(frozen=True, slots=True)
class _Side:
    percent: bool
    value: int
    source: str


def _compute_side(layers: Sequence[tuple[str, ProfileSpec]], tflops_field: str, percent_field: str) -> _Side | None:
    for name, spec in layers:
        percent, tflops = getattr(spec.resources, percent_field), getattr(spec.resources, tflops_field)
        if percent is not None:
            return _Side(True, percent, name)
        if tflops is not None:
            return _Side(False, tflops, name)
    return None


def _percent_fits(model: str | None, auto: AutoScaling, errors: list[FieldError]) -> None:
    """What a compute percent cannot go with: a MIG unit (granted whole) and autoscaling that moves compute
    (its recommendations are TFLOPS, of the GPU the pod runs on)."""
    key = A.COMPUTE_PERCENT_REQUEST
    if model is not None and mig.split_request(model) is not None:
        errors.append(
            FieldError(
                key, model, f"{A.GPU_MODEL} names a MIG unit, granted whole: its size is its share; remove the percent"
            )
        )
    for block in _SHORT_FORM:
        config = auto.get(block) or {}
        if config.get("enable") is True and config.get("targetResource", "all") in ("all", "tflops"):
            errors.append(
                FieldError(
                    key,
                    None,
                    f"{block} moves compute in TFLOPS, not in percent: ask compute in TFLOPS (tflops-request), "
                    "or aim the layer at vram only (targetResource: vram, autoscale-target: vram)",
                )
            )


def _indices(raw: str | None, errors: list[FieldError]) -> tuple[int, ...] | None:
    """Distinct GPU indices, comma-separated, in the order given."""
    if raw is None:
        return None
    parts = [p.strip() for p in raw.split(",")]
    found = [fields.integer(A.GPU_INDICES, p, 0, fields.MAX_GPU_COUNT - 1, []) for p in parts]
    if not parts or None in found or len(set(found)) != len(found):
        errors.append(
            FieldError(
                A.GPU_INDICES,
                raw,
                f"must be distinct GPU indices from 0 to {fields.MAX_GPU_COUNT - 1}, separated by commas, such as 0,2",
            )
        )
        return None
    return tuple(i for i in found if i is not None)


def _protection(raw: str | None, errors: list[FieldError]) -> int | None:
    """Whole seconds of eviction protection, 1 s to :data:`MAX_EVICTION_PROTECTION_S`."""
    if raw is None:
        return None
    longest = MAX_EVICTION_PROTECTION_S
    accepted = f"a duration from 1s to {longest // 60}m, such as 30m or 90s (longer would let a pod hold off every QoS)"
    value = fields.duration(A.EVICTION_PROTECTION, raw, errors, accepted, lambda v: 1 <= v <= longest)
    return None if value is None else math.ceil(value)


def _isolation_fits_model(mode: IsolationMode | None, source: str, model: str | None, errors: list[FieldError]) -> None:
    """A MIG profile is a partition and a partition is a MIG profile: the two fields must agree."""
    if mode is None:
        return
    key = A.ISOLATION if source == _ANNOTATIONS else "isolation"
    shown = mode.value if source == _ANNOTATIONS else f"{mode.value} (from {source})"
    is_mig = model is not None and mig.split_request(model) is not None
    if mode is IsolationMode.PARTITIONED and not is_mig:
        errors.append(
            FieldError(
                key,
                shown,
                f"a hardware partition is a MIG unit: {A.GPU_MODEL} must name a MIG profile such as 1g.10gb or "
                f"A100 3g.40gb (it is {model!r})"
                if model
                else f"needs {A.GPU_MODEL} naming a MIG profile such as 1g.10gb or A100 3g.40gb",
            )
        )
    elif mode is not IsolationMode.PARTITIONED and is_mig:
        errors.append(
            FieldError(
                key,
                shown,
                f"{A.GPU_MODEL} {model!r} is a MIG unit, a hardware partition: isolation must be partitioned, or unset",
            )
        )


def _standalone_needs_local(source: str, errors: list[FieldError]) -> None:
    needs = f'only allowed with {A.IS_LOCAL_GPU}: "true"'
    if source == _ANNOTATIONS:
        errors.append(FieldError(A.NO_STANDALONE_WORKER_MODE, "true", needs))
    else:
        errors.append(FieldError("standaloneWorkerMode", None, f"true in {source}; {needs} (or isLocalGPU: true)"))


def _opt(raw: str | None, parse: Any) -> Any:
    return None if raw is None else parse(raw)


def _flag(ann: Mapping[str, str], key: A, errors: list[FieldError]) -> bool | None:
    raw = ann.get(key)
    return None if raw is None else fields.boolean(key, raw, errors)


def _name(ann: Mapping[str, str], key: A, errors: list[FieldError]) -> str | None:
    raw = ann.get(key)
    return None if raw is None else fields.dns_name(key, raw, errors)


def _pair(
    what: str, request: tuple[int | None, str], limit: tuple[int | None, str], show: Any, errors: list[FieldError]
) -> tuple[int, int]:
    (req, req_from), (lim, lim_from) = request, limit
    req = lim if req is None else req
    lim = req if lim is None else lim
    if req is None or lim is None:
        return (0, 0)
    if req > lim:
        errors.append(
            FieldError(
                f"{PREFIX}{what}-request",
                show(req),
                f"must not exceed the {what} limit {show(lim)} "
                f"(request from {req_from or 'the limit'}, limit from {lim_from or 'the request'})",
            )
        )
    return (req, lim)


def _containers_and_split(
    ann: Mapping[str, str], names: tuple[str, ...], gpu_count: int | None, errors: list[FieldError]
) -> tuple[tuple[str, ...], container_gpus.Counts | None]:
    """The inject containers and, with container-gpu-count, each one's GPUs (vgpu/container_gpus.py): where
    inject-container is absent, the map names the inject containers. ``gpu_count``: the pod's own gpu-count."""
    raw = ann.get(A.CONTAINER_GPU_COUNT)
    if raw is None:
        return _containers(ann.get(A.INJECT_CONTAINER), names, errors), None
    counts = container_gpus.parse(raw, names, errors)
    if A.INJECT_CONTAINER in ann:
        containers = _containers(ann[A.INJECT_CONTAINER], names, errors)
    else:
        containers = container_gpus.named(counts or (), names)
    return containers, None if counts is None else container_gpus.matched(counts, raw, containers, gpu_count, errors)


def _containers(raw: str | None, names: tuple[str, ...], errors: list[FieldError]) -> tuple[str, ...]:
    if raw is None:
        if len(names) == 1:
            return names
        if names:
            errors.append(
                FieldError(
                    A.INJECT_CONTAINER,
                    None,
                    f"required when the pod has several containers; choose from {', '.join(names)}",
                )
            )
        return ()
    chosen = tuple(dict.fromkeys(p.strip() for p in raw.split(",") if p.strip()))
    if not chosen:
        errors.append(FieldError(A.INJECT_CONTAINER, raw, "must name at least one container (comma-separated)"))
    missing = [c for c in chosen if names and c not in names]
    if missing:
        errors.append(
            FieldError(
                A.INJECT_CONTAINER, raw, f"no container named {', '.join(missing)}; the pod has {', '.join(names)}"
            )
        )
    return chosen


def _auto(ann: Mapping[str, str], inherited: AutoScaling, errors: list[FieldError]) -> AutoScaling:
    merged = {k: dict(v) for k, v in inherited.items()}
    short = _flag(ann, A.AUTOSCALE, errors)
    target = ann.get(A.AUTOSCALE_TARGET)
    if target is not None and target not in _AUTOSCALE_TARGETS:
        accepted = ", ".join(_AUTOSCALE_TARGETS)
        errors.append(FieldError(A.AUTOSCALE_TARGET, fields.shown(target), f"must be one of {accepted}"))
    elif target is not None and short is not True:
        errors.append(
            FieldError(
                A.AUTOSCALE_TARGET, fields.shown(target), f'only with {A.AUTOSCALE}: "true", whose layers it aims'
            )
        )
    if short is not None:  # TensorFusion v2's short form: the requests and limits layers (the auto-* keys win)
        for block in _SHORT_FORM:
            merged.setdefault(block, {})["enable"] = short
            if target in _AUTOSCALE_TARGETS:
                merged[block]["targetResource"] = _AUTOSCALE_TARGETS[target]
    for key, block in _AUTO_FLAGS.items():
        flag = _flag(ann, key, errors)
        if flag is not None:
            merged.setdefault(block, {})["enable"] = flag
    return merged


def _unknown_keys(ann: Mapping[str, str], errors: list[FieldError]) -> None:
    for key in ann:
        if key in TF_UNSUPPORTED_KEYS:
            errors.append(
                FieldError(key, fields.shown(ann[key]), f"TensorFusion's {key} is {TF_UNSUPPORTED_KEYS[key]}")
            )
        elif key.startswith(PREFIX) and key not in _KNOWN_KEYS and key not in TF_UNSERVED_KEYS:
            # Compare what follows the prefix: every key shares it, so whole keys all look close.
            close = difflib.get_close_matches(key.removeprefix(PREFIX), _USER_KEY_SUFFIXES, n=1)
            hint = f"did you mean {PREFIX}{close[0]}?" if close else f"accepted keys: {_USER_KEYS}"
            errors.append(FieldError(key, None, f"unknown {PREFIX} annotation; {hint}"))
