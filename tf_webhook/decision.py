"""The admission decision for one pod: allow untouched, deny with the reasons, or allow with a patch.

Pure apart from the reads it is handed: AdmissionReview request + cluster objects in, a verdict and
an optional workload write out. Precedence (annotation > workload > WorkloadProfile > pool
defaults > built-ins) lives in ``vgpu.request.resolve``; here we fetch what the annotations name,
turn every problem into one message the user can act on, and never let a tenant's copy of a
system annotation through, nor any of the device plugin's environment variables in its containers
(``plugin_env.py``). A pod sent by a migration entry is first translated from NVIDIA's GPU
resources (``migration.py``) and then decided like any other. The pools may come from a cache a moment
behind (``pool_cache.py``), so no pod is refused before the pools are read again from the API server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tf_webhook.auto_requests import stamp
from tf_webhook.cluster import AdmissionReads, ClusterUnavailable
from tf_webhook.migration import Ask, Migration, asks, translate
from tf_webhook.plugin_env import strip
from tf_webhook.pod_patch import SYSTEM_KEYS, Op, pod_patch
from tf_webhook.review import Denial, ReviewRequest, Verdict, allow, deny
from tf_webhook.unkept import unkept, unserved
from tf_webhook.workload import WorkloadUpsert, spec_of
from vgpu import compute_percent, fields
from vgpu.catalog import builtin
from vgpu.errors import DomainError, FieldError
from vgpu.names import (
    DEFAULT_POOL,
    KIND_GPU_POOL,
    KIND_WORKLOAD,
    KIND_WORKLOAD_PROFILE,
    LABEL_ENABLED,
    LABEL_MIGRATE_NVIDIA,
    Annotation,
    Qos,
)
from vgpu.profile import ProfileSpec, parse_spec
from vgpu.quantity import parse_milli
from vgpu.request import GpuRequest, PodView, charged, is_enabled, referenced_profile, referenced_workload, resolve

# The GPU catalog a percent pod's gpu-model is matched against, to find its size in the pool's status.
_CATALOG = builtin()


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict, and the TensorFusionWorkload write the shell must do before answering."""

    verdict: Verdict
    upsert: WorkloadUpsert | None = None


@dataclass(frozen=True, slots=True)
class _Pools:
    specs: Mapping[str, ProfileSpec]
    broken: Mapping[str, DomainError]
    defaults: tuple[str, ...]
    sizes: Mapping[str, Mapping[str, int]]  # pool -> its GPU products' TFLOPS (milli), from its status


def decide(
    review: ReviewRequest,
    cluster: AdmissionReads,
    tolerations: Sequence[Mapping[str, Any]] = (),
    migration: Migration | None = None,
) -> Decision:
    """Decide on a pod CREATE; anything else we were sent is allowed untouched. ``tolerations`` are
    the GPU nodes' taints' tolerations, added to every GPU pod that lacks them; ``migration`` is how
    the pod's namespace reads NVIDIA's GPU resources when the call came through a migration entry."""
    if (review.group, review.kind, review.operation) != ("", "Pod", "CREATE"):
        return Decision(allow())
    problem = _malformed(review.object)
    if problem:
        return Decision(deny(f"malformed pod: {problem}"))
    pod: Mapping[str, Any] = review.object
    translated_ops: tuple[Op, ...] = ()
    warnings: tuple[str, ...] = ()
    try:
        translation = None if migration is None else translate(pod, migration)
        if translation is not None:
            pod, translated_ops, warnings = translation.pod, translation.ops, translation.warnings
        view = PodView.from_pod(pod)
        if not is_enabled(view.labels):
            return Decision(allow())
        nvidia = asks(pod)
    except DomainError as exc:
        return Decision(_deny_errors(exc.errors))
    view = replace(view, namespace=review.namespace or view.namespace)
    if nvidia:
        return Decision(_deny_errors([_nvidia_beside_label(nvidia)]))
    node = pod["spec"].get("nodeName")
    if node:
        return Decision(_deny_errors([_preset_node(str(node))], warnings))
    forged = [key for key in SYSTEM_KEYS if key in view.annotations]
    warnings += tuple(f"removed {key}: only tensor-fusion components may set it" for key in forged)
    view = replace(view, annotations={k: v for k, v in view.annotations.items() if k not in SYSTEM_KEYS})
    try:
        req = _resolve(view, cluster)
        req, stamped = stamp(req, view.namespace, cluster.workload)
        warnings += stamped
    except DomainError as exc:
        return Decision(_deny_errors(exc.errors, warnings))
    except ClusterUnavailable as exc:
        return Decision(
            deny(
                f"{LABEL_ENABLED}: could not read the cluster, try again: {exc}",
                denial=Denial.SERVICE_UNAVAILABLE,
            )
        )
    mismatch = _class_against_qos(pod["spec"].get("priorityClassName"), req, view.annotations)
    if mismatch is not None:
        return Decision(_deny_errors([mismatch], warnings))
    ops, patch_warnings = pod_patch(pod, req, view.annotations, tolerations)
    env_ops, env_warnings = strip(pod["spec"])  # the device plugin's variables: its answer is the grant
    upsert = None
    if req.generate_workload:
        upsert = WorkloadUpsert(namespace=view.namespace, name=str(req.workload), spec=spec_of(req))
    verdict = allow(
        patch=[*translated_ops, *ops, *env_ops],
        warnings=warnings + tuple(patch_warnings) + tuple(env_warnings) + unkept(req) + unserved(view.annotations),
    )
    return Decision(verdict, upsert)


def _resolve(view: PodView, cluster: AdmissionReads) -> GpuRequest:
    """Fetch what the pod names, then resolve; raises DomainError with every problem found."""
    errors: list[FieldError] = []
    profile = _layer(
        cluster.workload_profile,
        view.namespace,
        referenced_profile(view),
        Annotation.WORKLOAD_PROFILE,
        KIND_WORKLOAD_PROFILE,
        errors,
    )
    workload = _layer(
        cluster.workload, view.namespace, referenced_workload(view), Annotation.WORKLOAD, KIND_WORKLOAD, errors
    )
    if errors:
        raise DomainError(errors)
    try:
        return _in_pools(view, profile, workload, cluster.gpu_pools())
    except DomainError:
        # The pools may be a cache's, a moment behind: a pool created or fixed since must not be refused
        # on its word, so a refusal is decided again on the pools as the API server holds them now.
        return _in_pools(view, profile, workload, cluster.gpu_pools(fresh=True))


def _in_pools(
    view: PodView, profile: ProfileSpec | None, workload: ProfileSpec | None, raw: Sequence[Mapping[str, Any]]
) -> GpuRequest:
    """The request resolved among these pools; raises DomainError with the problems found."""
    pools = _pools(raw)
    chosen = (
        view.annotations.get(Annotation.GPUPOOL) or (workload and workload.pool_name) or (profile and profile.pool_name)
    )
    if not chosen and len(pools.defaults) > 1:
        raise DomainError.one(
            Annotation.GPUPOOL,
            None,
            f"several {KIND_GPU_POOL}s are marked default ({', '.join(pools.defaults)}); name one in this annotation",
        )
    default = pools.defaults[0] if pools.defaults else DEFAULT_POOL
    req = resolve(view, profile=profile, workload=workload, pools=pools.specs, default_pool=default)
    if req.pool in pools.broken:
        raise pools.broken[req.pool]
    if req.generate_workload and not req.workload:
        raise DomainError.one(
            Annotation.GENERATE_WORKLOAD, "true", f"needs {Annotation.WORKLOAD} naming the workload to create or update"
        )
    if req.compute_percent_request is not None:
        req = _charged(req, pools.sizes.get(req.pool, {}))
    absent = [c for c in req.containers if c not in view.containers]
    if absent or not req.containers:
        raise DomainError.one(
            Annotation.INJECT_CONTAINER,
            ", ".join(absent) or None,
            f"no such container in the pod; it has {', '.join(view.containers) or 'no containers'}",
        )
    return req


def _charged(req: GpuRequest, sizes: Mapping[str, int]) -> GpuRequest:
    """A compute-percent request with the TFLOPS it is charged: its share of the largest GPU it may land on."""
    base = compute_percent.charge_base(sizes, req.gpu_model, _CATALOG)
    if base is None:
        raise DomainError.one(
            Annotation.COMPUTE_PERCENT_REQUEST,
            None,
            f"the pod is charged its percent of the largest GPU it may land on, and nothing says which: "
            f"{KIND_GPU_POOL} {req.pool} lists no GPU yet (status.gpuTflops) and {Annotation.GPU_MODEL} names no "
            "model the GPU catalog knows; retry once the pool has GPU nodes, name the model, or ask in TFLOPS",
        )
    return charged(req, base)


def _layer(
    read: Callable[[str, str], Mapping[str, Any] | None],
    namespace: str,
    name: str | None,
    key: Annotation,
    kind: str,
    errors: list[FieldError],
) -> ProfileSpec | None:
    """Fetch and parse the object ``key`` names; a bad name is left for ``resolve`` to report."""
    if name is None or fields.dns_name(key, name, []) is None:
        return None
    raw = read(namespace, name)
    if raw is None:
        errors.append(FieldError(key, name, f"{kind} {namespace}/{name} not found; create it or fix the name"))
        return None
    try:
        return parse_spec(_spec(raw), where=f"{kind} {namespace}/{name} spec")
    except DomainError as exc:
        errors.extend(exc.errors)
        return None


class _LastParsed:
    """The pools parsed last, by the identity of the sequence they came from. The webhook's pool cache publishes
    one tuple until a pool changes, so the admissions in between reuse its parse; a live LIST is parsed anew.
    The pair is one attribute, read and written whole, so concurrent admissions never see half of it."""

    def __init__(self) -> None:
        self._last: tuple[Sequence[Mapping[str, Any]], _Pools] | None = None

    def __call__(self, raw: Sequence[Mapping[str, Any]]) -> _Pools:
        last = self._last
        if last is not None and last[0] is raw:
            return last[1]
        pools = _parse_pools(raw)
        self._last = (raw, pools)
        return pools


def _parse_pools(raw: Sequence[Mapping[str, Any]]) -> _Pools:
    specs: dict[str, ProfileSpec] = {}
    broken: dict[str, DomainError] = {}
    defaults: list[str] = []
    sizes: dict[str, dict[str, int]] = {}
    for pool in raw:
        meta = pool.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            continue
        spec = _spec(pool)
        try:
            specs[name] = parse_spec(spec.get("defaults") or {}, where=f"{KIND_GPU_POOL} {name} spec.defaults")
        except DomainError as exc:
            specs[name], broken[name] = ProfileSpec(), exc
        if spec.get("default") is True:
            defaults.append(name)
        sizes[name] = _sizes(pool.get("status"))
    return _Pools(specs, broken, tuple(sorted(defaults)), sizes)


def _sizes(status: object) -> dict[str, int]:
    """A pool status's ``gpuTflops`` (the extender's); an entry that does not parse is left out."""
    listed = status.get("gpuTflops") if isinstance(status, Mapping) else None
    out: dict[str, int] = {}
    for product, tflops in (listed or {}).items() if isinstance(listed, Mapping) else ():
        try:
            out[str(product)] = parse_milli(str(tflops))
        except DomainError:
            continue
    return out


def _malformed(pod: Mapping[str, Any]) -> str | None:
    """What makes ``pod`` unreadable, if anything (the API server never sends such pods; fuzzers do)."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return "metadata and spec must be objects"
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is not None and not (
            isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        ):
            return f"metadata.{key} must map strings to strings"
    for key in ("containers", "initContainers"):
        value = spec.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(c, Mapping) for c in value)):
            return f"spec.{key} must be a list of objects"
    return None


def _class_against_qos(chosen: object, req: GpuRequest, annotations: Mapping[str, str]) -> FieldError | None:
    """A PriorityClass that contradicts the pod's QoS: one of ours for another QoS, or any other class where
    the pod named a QoS. Preemption and quota read the class's priority, so the QoS would say nothing true."""
    if not chosen or chosen == req.qos.priority_class:
        return None
    named = Annotation.QOS in annotations or req.qos is not Qos.MEDIUM
    if chosen not in {q.priority_class for q in Qos} and not named:
        return None  # a class of the cluster's own, no QoS asked: the class's priority decides
    return FieldError(
        "spec.priorityClassName",
        fields.shown(chosen),
        f"contradicts {Annotation.QOS} {req.qos.value}, whose class is {req.qos.priority_class}: a tensor-fusion "
        "pod's priority is its QoS's (preemption and quota read the class); remove spec.priorityClassName (the "
        "webhook sets it) or make the two agree",
    )


def _preset_node(node: str) -> FieldError:
    """A GPU pod that names its node skips the scheduler, hence the extender's grant and hand-off gate,
    and the kubelet would admit it beside a pod in hand-off (its Allocate indistinguishable)."""
    return FieldError(
        "spec.nodeName",
        node,
        "a tensor-fusion pod is placed by the tensor-fusion scheduler, which grants its GPU share at bind; "
        "remove spec.nodeName and pin the pod with spec.nodeSelector, node affinity or "
        f"{Annotation.GPUPOOL} instead (static pods cannot use tensor-fusion GPUs)",
    )


def _nvidia_beside_label(found: Sequence[Ask]) -> FieldError:
    """A pod of ours that also asks NVIDIA's plugin for GPUs would need a node with both, and get two."""
    return FieldError(
        ", ".join(map(str, found)),
        None,
        f'a pod labelled {LABEL_ENABLED}: "true" takes its GPUs from tensor-fusion, as its tensor-fusion.ai/ '
        f"annotations size them; remove NVIDIA's resource, or, in a namespace labelled {LABEL_MIGRATE_NVIDIA}, "
        "remove the label and the resource is translated",
    )


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _deny_errors(errors: Sequence[FieldError], warnings: tuple[str, ...] = ()) -> Verdict:
    return deny("; ".join(str(e) for e in errors), warnings=warnings)


_pools = _LastParsed()
