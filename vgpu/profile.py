"""The WorkloadProfile spec (``tensor-fusion.ai/v1``), parsed from its CRD JSON into plain values.

The same shape serves a GPU pool's ``spec.defaults`` and a TensorFusionWorkload's ``spec``, so the
request model can layer them (annotation > workload > profile > pool > built-in). Every field of
the seed CRD is kept, including the whole ``autoScalingConfig`` tree, because the auto-scaling work
reads it and because a profile's values must never be silently dropped (a TensorFusion bug).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from vgpu import compute_percent, fields
from vgpu.autoscale import config as autoscale_config
from vgpu.errors import DomainError, FieldError
from vgpu.names import IsolationMode, Qos
from vgpu.quantity import format_bytes, format_milli
from vgpu.scheduling.affinity import preferred_problems

AutoScaling = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Resources:
    """Per-GPU TFLOPS (milli), compute percent (thousandths, vgpu.compute_percent) and VRAM (bytes); None
    means "not set at this layer". TFLOPS and percent are two forms of one field: a layer sets one."""

    tflops_request: int | None = None
    tflops_limit: int | None = None
    vram_request: int | None = None
    vram_limit: int | None = None
    percent_request: int | None = None
    percent_limit: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileSpec:
    """One layer of GPU settings; None everywhere means "not set here, ask the next layer"."""

    resources: Resources = Resources()
    replicas: int | None = None
    pool_name: str | None = None
    qos: Qos | None = None
    is_local_gpu: bool | None = None
    # ``standaloneWorkerMode``; the annotation ``no-standalone-worker-mode: "true"`` sets it to true
    # (TensorFusion's naming, kept as is), and either is only allowed in local-GPU mode.
    standalone_worker_mode: bool | None = None
    gpu_model: str | None = None
    gpu_count: int | None = None
    node_affinity: Mapping[str, Any] | None = None
    auto_scaling: AutoScaling = field(default_factory=dict)
    # How the share is held on the GPU (docs/isolation.md); None: the GPU's own mode.
    isolation: IsolationMode | None = None


_TOP_KEYS: Final = frozenset(
    {
        "resources",
        "replicas",
        "poolName",
        "qos",
        "isLocalGPU",
        "gpuModel",
        "gpuCount",
        "nodeAffinity",
        "autoScalingConfig",
        "standaloneWorkerMode",
        "isolation",
    }
)


def parse_spec(spec: Mapping[str, Any], *, where: str) -> ProfileSpec:
    """Parse a CRD ``spec``; ``where`` prefixes every error key (``WorkloadProfile default/x spec``)."""
    errors: list[FieldError] = []
    if not isinstance(spec, Mapping):
        raise DomainError.one(where, fields.shown(spec), "must be an object")
    for key in spec:
        if key not in _TOP_KEYS:
            errors.append(
                FieldError(f"{where}.{key}", None, f"unknown field; accepted: {', '.join(sorted(_TOP_KEYS))}")
            )
    resources = _resources(spec.get("resources"), f"{where}.resources", errors)
    replicas = _int(spec, "replicas", where, 0, fields.MAX_REPLICAS, errors)
    gpu_count = _int(spec, "gpuCount", where, 1, fields.MAX_GPU_COUNT, errors)
    qos_raw = spec.get("qos")
    qos = None
    if qos_raw is not None:
        chosen = fields.choice(f"{where}.qos", str(qos_raw), tuple(Qos), errors)
        qos = Qos(chosen) if chosen else None
    isolation_raw = spec.get("isolation")
    isolation = None
    if isolation_raw is not None:
        mode = fields.choice(f"{where}.isolation", str(isolation_raw), tuple(IsolationMode), errors)
        isolation = IsolationMode(mode) if mode else None
    pool = _text(spec, "poolName", where, errors)
    if pool is not None:
        pool = fields.dns_name(f"{where}.poolName", pool, errors)
    local = _bool(spec, "isLocalGPU", where, errors)
    standalone = _bool(spec, "standaloneWorkerMode", where, errors)
    affinity = spec.get("nodeAffinity")
    if affinity is not None and not isinstance(affinity, Mapping):
        errors.append(
            FieldError(f"{where}.nodeAffinity", fields.shown(affinity), "must be a core/v1 NodeAffinity object")
        )
        affinity = None
    for path, value, accepted in preferred_problems(affinity or {}):
        errors.append(FieldError(f"{where}.nodeAffinity.{path}", fields.shown(value), accepted))
    auto = autoscale_config.validate(spec.get("autoScalingConfig"), f"{where}.autoScalingConfig", errors)
    model = _text(spec, "gpuModel", where, errors)
    if errors:
        raise DomainError(errors)
    return ProfileSpec(
        resources=resources,
        replicas=replicas,
        pool_name=pool,
        qos=qos,
        is_local_gpu=local,
        standalone_worker_mode=standalone,
        gpu_model=model,
        gpu_count=gpu_count,
        node_affinity=affinity,
        auto_scaling=auto,
        isolation=isolation,
    )


def to_crd(spec: ProfileSpec) -> dict[str, Any]:
    """The CRD JSON form of a spec (the inverse of :func:`parse_spec` for the fields that are set)."""
    out: dict[str, Any] = {}
    res = spec.resources
    requests = _side(tflops=_m(res.tflops_request), computePercent=_p(res.percent_request), vram=_b(res.vram_request))
    limits = _side(tflops=_m(res.tflops_limit), computePercent=_p(res.percent_limit), vram=_b(res.vram_limit))
    if requests or limits:
        out["resources"] = {"requests": requests, "limits": limits}
    for key, value in (
        ("replicas", spec.replicas),
        ("poolName", spec.pool_name),
        ("qos", spec.qos and spec.qos.value),
        ("isLocalGPU", spec.is_local_gpu),
        ("standaloneWorkerMode", spec.standalone_worker_mode),
        ("gpuModel", spec.gpu_model),
        ("gpuCount", spec.gpu_count),
        ("nodeAffinity", spec.node_affinity),
        ("isolation", spec.isolation and spec.isolation.value),
    ):
        if value is not None:
            out[key] = value
    if spec.auto_scaling:
        out["autoScalingConfig"] = {k: dict(v) for k, v in spec.auto_scaling.items()}
    return out


def _side(**values: str | None) -> dict[str, str]:
    return {k: v for k, v in values.items() if v}


def _p(value: int | None) -> str | None:
    return None if value is None else compute_percent.show(value).removesuffix("%")


def _m(value: int | None) -> str | None:
    return None if value is None else format_milli(value)


def _b(value: int | None) -> str | None:
    return None if value is None else format_bytes(value)


def _resources(raw: object, where: str, errors: list[FieldError]) -> Resources:
    if raw is None:
        return Resources()
    if not isinstance(raw, Mapping):
        errors.append(FieldError(where, fields.shown(raw), "must be an object with requests and limits"))
        return Resources()
    values: dict[str, int | None] = {}
    for side, suffix in (("requests", "request"), ("limits", "limit")):
        block = raw.get(side)
        if block is None:
            continue
        if not isinstance(block, Mapping):
            errors.append(
                FieldError(
                    f"{where}.{side}", fields.shown(block), "must be an object with tflops (or computePercent) and vram"
                )
            )
            continue
        for name, field_name, parse in (
            ("tflops", "tflops", fields.milli),
            ("percent", "computePercent", compute_percent.parse),
            ("vram", "vram", fields.byte_count),
        ):
            if block.get(field_name) is not None:
                values[f"{name}_{suffix}"] = parse(f"{where}.{side}.{field_name}", str(block[field_name]), errors)
        if block.get("tflops") is not None and block.get("computePercent") is not None:
            errors.append(
                FieldError(
                    f"{where}.{side}.computePercent",
                    fields.shown(block["computePercent"]),
                    f"not with {side}.tflops: compute is asked in TFLOPS or in percent of a GPU, one of the two",
                )
            )
    return Resources(
        tflops_request=values.get("tflops_request"),
        tflops_limit=values.get("tflops_limit"),
        vram_request=values.get("vram_request"),
        vram_limit=values.get("vram_limit"),
        percent_request=values.get("percent_request"),
        percent_limit=values.get("percent_limit"),
    )


def _int(spec: Mapping[str, Any], key: str, where: str, low: int, high: int, errors: list[FieldError]) -> int | None:
    raw = spec.get(key)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        errors.append(FieldError(f"{where}.{key}", fields.shown(raw), f"must be a whole number from {low} to {high}"))
        return None
    return raw


def _bool(spec: Mapping[str, Any], key: str, where: str, errors: list[FieldError]) -> bool | None:
    raw = spec.get(key)
    if isinstance(raw, bool):
        return raw
    if raw is not None:
        errors.append(FieldError(f"{where}.{key}", fields.shown(raw), "must be true or false"))
    return None


def _text(spec: Mapping[str, Any], key: str, where: str, errors: list[FieldError]) -> str | None:
    raw = spec.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        errors.append(FieldError(f"{where}.{key}", fields.shown(raw), "must be a non-empty string"))
        return None
    return raw
