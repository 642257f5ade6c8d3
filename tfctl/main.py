"""``tfctl``: the command line for people — check a request, browse the catalog, plan capacity, explain a pod,
show GPU use (``top``) and the autoscaler's decisions (``autoscale``).

Each subcommand reads files and prints; the decisions come from ``vgpu`` (and, for later
subcommands, from the same scheduling core the extender runs), so what the CLI says is what the
cluster will do.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any, Final

import yaml

from tf_shell.catalog_file import CatalogFileError
from tf_shell.catalog_file import load as load_catalog
from tfctl import autoscale_view, explain_client, nodes, planning, top
from vgpu import compute_percent
from vgpu.contract import resolved
from vgpu.errors import DomainError
from vgpu.names import DISTRIBUTION
from vgpu.profile import ProfileSpec, parse_spec
from vgpu.quantity import humanize_bytes, humanize_tflops
from vgpu.request import GpuRequest, PodView, is_enabled, resolve

# Manifests ``tfctl resolve`` reads a pod from: a Pod, or a workload whose spec.template is one.
POD_KINDS: Final = ("Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")


def parser() -> argparse.ArgumentParser:
    """tfctl's whole command line (each sub-command's ``run`` handler returns the exit code)."""
    parser = argparse.ArgumentParser(
        prog="tfctl",
        description="the command line for people: check a request, browse the catalog, plan capacity, explain a pod, "
        "show GPU use and the autoscaler's decisions",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version(DISTRIBUTION)}")
    parser.add_argument(
        "--gpu-catalog",
        type=Path,
        metavar="FILE",
        help="GPU models to add to or override in the built-in catalog (the extender's and device plugins' file)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "resolve", help="resolve a pod's (or a Deployment template's) GPU request, or show why it is rejected"
    )
    p.add_argument("manifest", type=Path, help="YAML with a Pod, or a workload with spec.template")
    p.add_argument("--profile", type=Path, help="YAML of the WorkloadProfile the pod references")
    p.add_argument("--pool", type=Path, action="append", default=[], help="YAML of a GPUPool (repeatable)")
    p.add_argument("--json", action="store_true", help="print the normalised request annotation instead")
    p.set_defaults(run=_resolve)

    c = sub.add_parser("catalog", help="list known GPU models, or test what a gpu-model value selects")
    c.add_argument("--match", metavar="GPU_MODEL", help="show only models this gpu-model annotation value selects")
    c.set_defaults(run=_catalog)

    planning.add_subcommand(sub)
    explain_client.add_subcommand(sub)
    top.add_subcommand(sub)
    nodes.add_subcommand(sub)
    autoscale_view.add_subcommand(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except DomainError as exc:
        print("rejected:", file=sys.stderr)
        for error in exc.errors:
            print(f"  - {error}", file=sys.stderr)
        return 1
    except (OSError, yaml.YAMLError, CatalogFileError) as exc:
        print(f"tfctl: {exc}", file=sys.stderr)
        return 2
    return code


def _load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise DomainError.one(str(path), None, "must hold one YAML object")
    return doc


def _pod(doc: dict[str, Any], path: Path) -> PodView:
    kind = doc.get("kind")
    if kind not in POD_KINDS:
        accepted = ", ".join(POD_KINDS)
        raise DomainError.one(f"{path}: kind", None if kind is None else str(kind), f"not a pod; accepted: {accepted}")
    template = (doc.get("spec") or {}).get("template")
    body = template if isinstance(template, dict) else doc
    outer = doc.get("metadata") or {}
    meta = {
        "name": outer.get("name", ""),
        **(body.get("metadata") or {}),
        "namespace": outer.get("namespace", "default"),
    }
    return PodView.from_pod({"metadata": meta, "spec": body.get("spec") or {}})


def _spec(doc: dict[str, Any], kind: str) -> ProfileSpec:
    spec = doc.get("spec") or {}
    body = spec.get("defaults", {}) if kind == "GPUPool" else spec
    return parse_spec(body, where=f"{kind} {(doc.get('metadata') or {}).get('name', '?')} spec")


def _resolve(args: argparse.Namespace) -> int:
    pod = _pod(_load(args.manifest), args.manifest)
    if not is_enabled(pod.labels):
        print('not a GPU pod: label tensor-fusion.ai/enabled is not "true"; the webhook leaves it untouched')
        return 0
    profile = _spec(_load(args.profile), "WorkloadProfile") if args.profile else None
    pools = {(d.get("metadata") or {}).get("name", ""): _spec(d, "GPUPool") for d in map(_load, args.pool)} or None
    request = resolve(pod, profile=profile, pools=pools)
    if args.json:
        print(resolved.encode(request))
        return 0
    print(f"pod {pod.namespace}/{pod.name}: {request.describe()}")
    r = request
    rows = [
        ("pool", r.pool), ("containers", ", ".join(r.containers)), ("gpu count", _gpu_count(r)),
        _compute_row(r),
        ("vram request/limit", f"{humanize_bytes(r.vram_request)} / {humanize_bytes(r.vram_limit)}"),
        ("qos", r.qos.value), ("gpu model", r.gpu_model or "any"), ("local gpu", str(r.is_local_gpu).lower()),
        ("workload", r.workload or "-"), ("auto-scaling", ", ".join(sorted(r.auto_scaling)) or "-"),
    ]  # fmt: skip
    for label, value in rows:
        print(f"  {label:<22} {value}")
    return 0


def _compute_row(r: GpuRequest) -> tuple[str, str]:
    if r.compute_percent_request is None or r.compute_percent_limit is None:
        return ("tflops request/limit", f"{humanize_tflops(r.tflops_request)} / {humanize_tflops(r.tflops_limit)}")
    shares = f"{compute_percent.show(r.compute_percent_request)} / {compute_percent.show(r.compute_percent_limit)}"
    return ("compute request/limit", f"{shares} of each granted GPU (admission charges the largest it may land on)")


def _gpu_count(r: GpuRequest) -> str:
    """The pod's GPUs, and each container's own where it asked for GPUs per container (container-gpu-count)."""
    if r.container_gpu_counts is None:
        return str(r.gpu_count)
    split = ", ".join(f"{c} {n}" for c, n in r.container_gpu_counts)
    return f"{r.gpu_count} ({split}: each container its own GPUs)"


def _catalog(args: argparse.Namespace) -> int:
    table = load_catalog(args.gpu_catalog)
    models = [m for m in table.models if args.match is None or any(table.matches(args.match, n) for n in m.nvml_names)]
    if not models:
        print(f"no known model matches {args.match!r} (an unknown model still matches GPUs reporting that name)")
        return 1
    print(f"{'MODEL':<18} {'TFLOPS':>8} {'MEMORY':>8}  NOTE")
    for m in models:
        print(f"{m.key:<18} {humanize_tflops(m.tflops_milli):>8} {humanize_bytes(m.memory_mib * 2**20):>8}  {m.note}")
    return 0
