"""From NVIDIA's device plugin to ours: a pod that asks for ``nvidia.com/gpu`` becomes a tensor-fusion pod.

A namespace opts in with the label ``tensor-fusion.ai/migrate-nvidia-gpu``
(vgpu.names.LABEL_MIGRATE_NVIDIA), and each pod created there that asks for NVIDIA's GPU resources is
rewritten at admission as if its author had written it for us: those resources go, our label and
annotations come, and the pod then takes the ordinary path (``decision.py``). Only CREATE is seen, and
a pod with our label in any form is never translated. ``nvidia.com/gpu`` becomes whole GPUs or
time-sliced replicas (by the label's value, :class:`ReplicaShare`), ``nvidia.com/mig-<profile>`` whole
MIG instances; what cannot be translated faithfully is refused with the reason. The table and the
rules: deploy/README.md, section "Migrating from ``nvidia.com/gpu``".

Pure: raw pod JSON, the label's value and the configured share in; the translation or a DomainError out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from tf_webhook.pod_patch import Op, pointer
from vgpu import fields
from vgpu.errors import DomainError, FieldError
from vgpu.names import (
    LABEL_ENABLED,
    LABEL_MIGRATE_NVIDIA,
    NVIDIA_GPU,
    NVIDIA_GPU_SHARED,
    NVIDIA_MIG_PREFIX,
    Annotation,
    MigrationMode,
)
from vgpu.quantity import format_bytes, format_milli
from vgpu.request import SHARE_KEYS

A = Annotation
# Any of these on the pod: it sizes its own GPU share, and the translation adds none.
_OWN_SHARE: Final = frozenset((*SHARE_KEYS, A.WORKLOAD_PROFILE, A.DEDICATED_GPU))


@dataclass(frozen=True, slots=True)
class ReplicaShare:
    """What one time-sliced replica is given: TFLOPS (milli) and VRAM (bytes) per replica; None unset."""

    tflops: int | None = None
    vram: int | None = None


@dataclass(frozen=True, slots=True)
class Migration:
    """How the namespace's label says its pods' NVIDIA resources are read."""

    mode: MigrationMode
    share: ReplicaShare = ReplicaShare()


@dataclass(frozen=True, slots=True)
class Translation:
    """The pod as its author would have written it for us, the patch ops that make it so (our label,
    containers without NVIDIA's resources) and the warning saying what was translated."""

    pod: Mapping[str, Any]
    ops: tuple[Op, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Ask:
    """One container's request for one of NVIDIA's GPU resources."""

    field: str  # containers or initContainers
    container: str
    resource: str
    count: int

    @property
    def key(self) -> str:
        """``container "main" nvidia.com/gpu``: what an error names."""
        return _key(self.field, self.container, self.resource)

    def __str__(self) -> str:
        return f"{self.key}: {self.count}"


class _Kind(Enum):
    WHOLE = "whole GPU"
    REPLICA = "time-sliced replica"
    MIG = "whole MIG instance"


def asks(pod: Mapping[str, Any]) -> tuple[Ask, ...]:
    """Every non-zero NVIDIA GPU resource the pod's containers ask for (a shape-checked pod); raises
    DomainError naming each count that is not a whole number, or whose request and limit differ."""
    errors: list[FieldError] = []
    found: list[Ask] = []
    for field, _, container in _indexed(pod):
        sides = [_side(container, s) for s in ("limits", "requests")]
        name = str(container.get("name", ""))
        for resource in sorted({r for side in sides for r in side if _is_nvidia_gpu(r)}):
            raw = [str(side[resource]) for side in sides if resource in side]
            key = _key(field, name, resource)
            if len(set(raw)) > 1:
                errors.append(
                    FieldError(key, raw[0], f"limit and request ({raw[1]}) differ; Kubernetes needs them equal")
                )
                continue
            count = fields.integer(key, raw[0], 0, fields.MAX_GPU_COUNT, errors)
            if count:
                found.append(Ask(field, name, resource, count))
    if errors:
        raise DomainError(errors)
    return tuple(found)


def translate(pod: Mapping[str, Any], migration: Migration) -> Translation | None:
    """The pod's translation, None when there is nothing to translate (it asks for no NVIDIA GPU, or
    carries our label and so decides for itself); raises DomainError when it cannot be translated."""
    meta: Mapping[str, Any] = pod["metadata"]
    labels: Mapping[str, str] = meta.get("labels") or {}
    if LABEL_ENABLED in labels:
        return None
    found = asks(pod)
    if not found:
        return None
    own: Mapping[str, str] = meta.get("annotations") or {}
    sized = not _OWN_SHARE.isdisjoint(own)
    kind, profile = _one_kind(found, migration, sized)
    added = {k: v for k, v in _annotations(found, kind, profile, migration.share, sized).items() if k not in own}
    new_labels = {**labels, LABEL_ENABLED: "true"}
    ops: list[Op] = [{"op": "add", "path": pointer("metadata", "labels"), "value": new_labels}]
    spec = dict(pod["spec"])
    for field, index, container in _indexed(pod):
        if any(_is_nvidia_gpu(r) for s in ("limits", "requests") for r in _side(container, s)):
            kept = {
                s: _without_nvidia(b) if s in ("limits", "requests") else b for s, b in container["resources"].items()
            }
            ops.append({"op": "add", "path": pointer("spec", field, index, "resources"), "value": kept})
            spec[field] = [*spec[field][:index], {**container, "resources": kept}, *spec[field][index + 1 :]]
    translated = {**pod, "metadata": {**meta, "labels": new_labels, "annotations": {**own, **added}}, "spec": spec}
    shown = "".join(f', {k}: "{v}"' for k, v in added.items())
    warning = (
        f'namespace label {LABEL_MIGRATE_NVIDIA}: "{migration.mode}": translated {", ".join(map(str, found))} '
        f'to the label {LABEL_ENABLED}: "true"{shown} ({_meaning(found, kind, profile, sized)})'
    )
    return Translation(translated, tuple(ops), (warning,))


def _one_kind(found: tuple[Ask, ...], migration: Migration, sized: bool) -> tuple[_Kind, str]:
    """The one kind of GPU ``found`` asks for (with its MIG profile); raises DomainError with every
    reason no one set of annotations translates it faithfully. ``sized``: the pod sizes its own share."""
    errors: list[FieldError] = []
    kinds = {_kind(a, migration.mode) for a in found}
    everything = ", ".join(map(str, found))
    if len(kinds) > 1:
        problem = "a tensor-fusion pod holds GPUs of one kind (whole, time-sliced replicas or one MIG profile)"
        errors.append(FieldError(everything, None, f"{problem}; ask for one of them"))
    errors += [
        FieldError(
            a.key,
            str(a.count),
            "tensor-fusion gives GPUs to app containers only; move this work into a container, or label the "
            f'pod {LABEL_ENABLED}: "false" to leave it to NVIDIA\'s device plugin',
        )
        for a in found
        if a.field == "initContainers"
    ]
    kind, profile = _kind(found[0], migration.mode)
    if kind is _Kind.REPLICA and not sized and migration.share == ReplicaShare():
        errors.append(
            FieldError(
                everything,
                None,
                "a time-sliced replica's share is not configured: set the chart's webhook.migration.replicaShare "
                f"(tflops and/or vram per replica), or size the pod's share with {A.TFLOPS_REQUEST} / {A.VRAM_REQUEST}",
            )
        )
    if errors:
        raise DomainError(errors)
    return kind, profile


def _annotations(found: tuple[Ask, ...], kind: _Kind, profile: str, share: ReplicaShare, sized: bool) -> dict[str, str]:
    """The annotations that translate ``found``, all of one ``kind``."""
    total = sum(a.count for a in found)
    out = {A.GPU_COUNT.value: "1" if kind is _Kind.REPLICA else str(total)}
    if kind is _Kind.MIG:
        out[A.GPU_MODEL.value] = profile
    if kind is _Kind.REPLICA and not sized:
        sizes = ((A.TFLOPS_REQUEST, share.tflops, format_milli), (A.VRAM_REQUEST, share.vram, format_bytes))
        out |= {key.value: show(total * each) for key, each, show in sizes if each is not None}
    elif not sized:
        out[A.DEDICATED_GPU.value] = "true"
    per_container: dict[str, int] = {}
    for a in found:
        per_container[a.container] = per_container.get(a.container, 0) + a.count
    out[A.INJECT_CONTAINER.value] = ",".join(per_container)
    if kind is not _Kind.REPLICA and len(per_container) > 1:  # as NVIDIA's plugin: each container its own GPUs
        out[A.CONTAINER_GPU_COUNT.value] = json.dumps(per_container, separators=(",", ":"))
    return out


def _meaning(found: tuple[Ask, ...], kind: _Kind, profile: str, sized: bool) -> str:
    """What the translation means, in words, for the warning."""
    total = sum(a.count for a in found)
    if sized and kind is not _Kind.MIG:  # a MIG instance is granted whole whatever the pod asks of it
        what = "the GPU share the pod's own annotations size"
    else:
        what = f"{total} {kind.value}{'s' if total > 1 else ''}" + (f" of profile {profile}" if profile else "")
    if len({a.container for a in found}) < 2:
        return what
    if kind is _Kind.REPLICA:
        return what + ", which every one of these containers sees"
    return what + ", each container its own, as it asked"


def _kind(ask: Ask, mode: MigrationMode) -> tuple[_Kind, str]:
    """What ``ask`` is, with the MIG profile it names ('' for the other kinds)."""
    if ask.resource.startswith(NVIDIA_MIG_PREFIX):
        return _Kind.MIG, ask.resource.removeprefix(NVIDIA_MIG_PREFIX)
    if ask.resource == NVIDIA_GPU_SHARED or mode is MigrationMode.TIME_SLICED:
        return _Kind.REPLICA, ""
    return _Kind.WHOLE, ""


def _is_nvidia_gpu(resource: str) -> bool:
    """Whether ``resource`` is one of the GPU resources NVIDIA's device plugin advertises."""
    return resource in (NVIDIA_GPU, NVIDIA_GPU_SHARED) or resource.startswith(NVIDIA_MIG_PREFIX)


def _key(field: str, container: str, resource: str) -> str:
    return f'{"init container" if field == "initContainers" else "container"} "{container}" {resource}'


def _indexed(pod: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    spec: Mapping[str, Any] = pod["spec"]
    for field in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(field) or ()):
            yield field, index, container


def _side(container: Mapping[str, Any], side: str) -> Mapping[str, Any]:
    """The container's ``limits`` or ``requests`` ({} when absent or not an object)."""
    res = container.get("resources")
    block = res.get(side) if isinstance(res, Mapping) else None
    return block if isinstance(block, Mapping) else {}


def _without_nvidia(block: object) -> object:
    return {k: v for k, v in block.items() if not _is_nvidia_gpu(k)} if isinstance(block, Mapping) else block
