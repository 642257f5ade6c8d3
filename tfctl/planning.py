"""``tfctl plan``: will these pods fit on this cluster, and how much GPU does each policy strand?

Capacity planning must give the answer the scheduler will give, so this command only reads files
and prints: the decisions come from :func:`vgpu.scheduling.replay.replay`, the engine the
placement benchmark uses. Each policy replays the same pod list, in order, on an empty cluster, and
the output gives per policy the pods placed, the GPU allocation and the fragmentation left.
Pods come as CSV or YAML (or openb trace columns), the cluster as YAML (or the openb node CSV);
the columns and keys: docs/design-notes.md, section ``tfctl/planning.py``.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import yaml

import vgpu.scheduling.fragmentation  # noqa: F401  (registers the policy)
from tf_shell.catalog_file import load as load_catalog
from vgpu.catalog import Catalog
from vgpu.names import LABEL_NODE_GPU_MODEL
from vgpu.quantity import MIB, parse_bytes, parse_milli
from vgpu.scheduling.affinity import REQUIRED
from vgpu.scheduling.compute_share import on_node
from vgpu.scheduling.fit import ModelMatcher, check_node, gpu_fits
from vgpu.scheduling.model import Demand, GpuState, NodeState
from vgpu.scheduling.policy import REGISTRY
from vgpu.scheduling.replay import Cluster, Replay, ReplayConfig

UNIT = 1000  # compute units / MiB of one GPU in share-based (openb) inputs
# The keys each kind of entry may have: a misspelt one is an error, never a silently wrong plan.
NODE_KEYS: Final = ("name", "count", "gpus", "gpu_model", "tflops", "vram", "cpu", "memory", "pool", "labels")
POD_KEYS: Final = ("name", "replicas", "tflops", "vram", "gpu_count", "gpu_model", "whole_gpu", "cpu", "memory")


class PlanError(ValueError):
    """An input file that cannot be planned with, and why."""


@dataclass(frozen=True, slots=True)
class PolicyPlan:
    policy: str
    placed: int
    total: int
    compute_pct: float
    vram_pct: float
    fragmented_pct: float
    dropped: tuple[str, ...]


def add_subcommand(subparsers: Any) -> None:
    """Register ``plan`` on tfctl's sub-parsers (``run`` is the handler, returning an exit code)."""
    p = subparsers.add_parser("plan", help="replay a pod list on a cluster description with each placement policy")
    p.add_argument("pods", type=Path, help="pod list: CSV or YAML")
    p.add_argument("cluster", type=Path, help="cluster: YAML, or the openb node CSV")
    p.add_argument(
        "--policy",
        action="append",
        choices=REGISTRY.names(),
        help="policy to compare (repeatable; default: all registered)",
    )
    p.add_argument("--shuffle", type=int, metavar="SEED", help="submit pods in a seeded random order")
    p.add_argument("--show-dropped", type=int, default=10, metavar="N", help="list up to N pods that did not fit")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """0: every pod fits under every policy; 3: some do not; 2: unusable input (said on stderr)."""
    try:
        catalog = load_catalog(args.gpu_catalog)
        nodes = load_cluster(args.cluster, catalog)
        demands = load_pods(args.pods, nodes)
    except (PlanError, KeyError, ValueError) as exc:  # CatalogFileError is a ValueError
        sys.stderr.write(f"tfctl plan: {exc}\n")
        return 2
    if args.shuffle is not None:
        random.Random(args.shuffle).shuffle(demands)
    policies: Sequence[str] = args.policy or REGISTRY.names()
    _say(f"{len(demands)} pods on {len(nodes)} nodes / {sum(len(n.gpus) for n in nodes)} GPUs")
    _say(f"{'policy':<14} {'placed':>13} {'compute %':>10} {'VRAM %':>8} {'fragmented %':>13}")
    plans = [plan(nodes, demands, name, catalog) for name in policies]
    for p in plans:
        _say(
            f"{p.policy:<14} {p.placed:>6}/{p.total:<6} {p.compute_pct:>10.1f} {p.vram_pct:>8.1f} "
            f"{p.fragmented_pct:>13.1f}"
        )
    for p in plans:
        if p.dropped and args.show_dropped > 0:
            shown = ", ".join(p.dropped[: args.show_dropped])
            more = f" … (+{len(p.dropped) - args.show_dropped})" if len(p.dropped) > args.show_dropped else ""
            _say(f"{p.policy}: did not fit: {shown}{more}")
    return 0 if all(p.placed == p.total for p in plans) else 3


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")


def plan(nodes: Sequence[NodeState], demands: Sequence[Demand], policy: str, catalog: Catalog) -> PolicyPlan:
    """Replay ``demands`` in order on an empty copy of ``nodes`` with one policy, as the extender would."""
    engine = Replay(Cluster(nodes), REGISTRY.create(policy), catalog, ReplayConfig())
    outcomes = [engine.submit(d) for d in demands]
    state = engine.cluster.nodes
    cap_t = sum(g.tflops for n in state for g in n.gpus)
    cap_v = sum(g.vram for n in state for g in n.gpus)
    used_t = sum(g.tflops_used for n in state for g in n.gpus)
    used_v = sum(g.vram_used for n in state for g in n.gpus)
    return PolicyPlan(
        policy=policy,
        placed=sum(1 for o in outcomes if o.node is not None),
        total=len(outcomes),
        compute_pct=100.0 * used_t / cap_t if cap_t else 0.0,
        vram_pct=100.0 * used_v / cap_v if cap_v else 0.0,
        fragmented_pct=fragmented(state, demands, catalog),
        dropped=tuple(o.demand.pod_key for o in outcomes if o.node is None),
    )


def fragmented(nodes: Iterable[NodeState], demands: Sequence[Demand], catalog: Catalog) -> float:
    """Idle GPU capacity (mean of compute and VRAM shares) that no demand shape could use, as % of all idle."""
    shapes: dict[tuple[object, ...], Demand] = {}
    for d in demands:
        if d.gpu_count > 0:
            shape = (d.gpu_count, d.tflops, d.compute_percent, d.vram, d.whole_gpu, d.cpu, d.memory, d.gpu_model)
            shapes.setdefault(shape, d)
    idle_total = stranded = 0.0
    for node in nodes:
        usable: set[str] = set()
        for d in shapes.values():
            match = ModelMatcher(catalog, d.gpu_model)
            if check_node(d, node, match) is None:
                share = on_node(d, node, match)  # a compute percent in this node's TFLOPS
                usable.update(g.uuid for g in node.gpus if gpu_fits(share, g))
        for g in node.gpus:
            x = 0.0 if g.whole else 0.5 * ((g.tflops - g.tflops_used) / g.tflops + (g.vram - g.vram_used) / g.vram)
            idle_total += x
            if g.uuid not in usable:
                stranded += x
    return 100.0 * stranded / idle_total if idle_total else 0.0


# --- inputs ---------------------------------------------------------------------------------------
def load_cluster(path: Path, catalog: Catalog) -> list[NodeState]:
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            return [_openb_node(row) for row in csv.DictReader(f)]
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise PlanError(f"{path}: expected a YAML object with a 'nodes' list")
    nodes: list[NodeState] = []
    for i, entry in enumerate(doc["nodes"]):
        if not isinstance(entry, dict):
            raise PlanError(f"{path}: nodes[{i}] must be an object")
        _known_keys(entry, NODE_KEYS, f"{path}: nodes[{i}]")
        nodes.extend(_yaml_nodes(entry, i, catalog))
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise PlanError(f"{path}: node names must be unique")
    return nodes


def _yaml_nodes(entry: dict[str, Any], i: int, catalog: Catalog) -> list[NodeState]:
    model = str(entry.get("gpu_model", ""))
    known = catalog.lookup(model)
    tflops = parse_milli(str(entry["tflops"])) if "tflops" in entry else (known.tflops_milli if known else 0)
    vram = parse_bytes(str(entry["vram"])) if "vram" in entry else (known.memory_mib * MIB if known else 0)
    if not tflops or not vram:
        raise PlanError(
            f"nodes[{i}]: GPU model {model!r} is not in the catalog (see `tfctl catalog`): give tflops and vram"
        )
    count = int(entry.get("count", 1))
    base = str(entry.get("name", f"node{i}"))
    labels = {LABEL_NODE_GPU_MODEL: model, **{str(k): str(v) for k, v in (entry.get("labels") or {}).items()}}
    out = []
    for k in range(count):
        name = base if count == 1 else f"{base}-{k}"
        gpus = tuple(
            GpuState(uuid=f"{name}-gpu{j}", index=j, model=model, tflops=tflops, vram=vram)
            for j in range(int(entry.get("gpus", 1)))
        )
        cpu = parse_milli(str(entry["cpu"])) if "cpu" in entry else None
        memory = parse_bytes(str(entry["memory"])) if "memory" in entry else None
        pool = str(entry.get("pool", "default-pool"))
        out.append(NodeState(name=name, pool=pool, labels=labels, gpus=gpus, cpu_free=cpu, memory_free=memory))
    return out


def _openb_node(row: dict[str, str]) -> NodeState:
    name, model = row["sn"], row.get("model", "")
    gpus = tuple(
        GpuState(uuid=f"{name}-gpu{j}", index=j, model=model, tflops=UNIT, vram=UNIT * MIB)
        for j in range(int(row["gpu"]))
    )
    return NodeState(
        name=name,
        pool="default-pool",
        labels={LABEL_NODE_GPU_MODEL: model},
        gpus=gpus,
        cpu_free=int(row["cpu_milli"]),
        memory_free=int(row["memory_mib"]) * MIB,
    )


def load_pods(path: Path, nodes: Sequence[NodeState]) -> list[Demand]:
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            rows: list[dict[str, Any]] = list(csv.DictReader(f))
    else:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        listed = doc.get("pods") if isinstance(doc, dict) else doc
        if not isinstance(listed, list) or not all(isinstance(r, dict) for r in listed):
            raise PlanError(f"{path}: expected a list of pods (or an object with a 'pods' list)")
        rows = listed
    demands: list[Demand] = []
    for i, row in enumerate(rows):
        name = str(row.get("name") or f"pod{i}")
        if "gpu_milli" not in row:  # an openb trace row carries more columns than it is planned by
            _known_keys(row, POD_KEYS, f"{path}: pod {name}")
        demand = _share_demand(row, name, nodes) if "gpu_milli" in row else _demand(row, name)
        replicas = int(row.get("replicas") or 1)
        for k in range(replicas):
            demands.append(demand if replicas == 1 else replace(demand, pod_key=f"plan/{name}-{k}"))
    return demands


def _known_keys(entry: dict[str, Any], accepted: Sequence[str], where: str) -> None:
    unknown = sorted(str(k) for k in entry if k not in accepted)
    if unknown:
        close = difflib.get_close_matches(unknown[0], accepted, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise PlanError(f"{where}: unknown key {unknown[0]!r}; {hint}accepted keys: {', '.join(accepted)}")


def _demand(row: dict[str, Any], name: str) -> Demand:
    tflops = parse_milli(str(row.get("tflops") or "0"), key=f"{name}.tflops")
    vram = parse_bytes(str(row.get("vram") or "0"), key=f"{name}.vram")
    whole = str(row.get("whole_gpu", "")).strip().lower() in {"1", "true", "yes"}
    model = str(row.get("gpu_model") or "") or None
    return Demand(
        pod_key=f"plan/{name}",
        gpu_count=int(row.get("gpu_count") or (1 if tflops or vram or whole else 0)),
        tflops=tflops,
        vram=vram,
        tflops_limit=tflops,
        vram_limit=vram,
        gpu_model=model,
        whole_gpu=whole,
        cpu=parse_milli(str(row.get("cpu") or "0"), key=f"{name}.cpu"),
        memory=parse_bytes(str(row.get("memory") or "0"), key=f"{name}.memory"),
    )


def _share_demand(row: dict[str, Any], name: str, nodes: Sequence[NodeState]) -> Demand:
    sizes = {(g.tflops, g.vram) for n in nodes for g in n.gpus}
    if len(sizes) != 1:
        raise PlanError(f"{name}: gpu_milli is a share of one GPU; the cluster must have a single GPU size")
    tflops, vram = next(iter(sizes))
    count = int(row.get("num_gpu") or 0)
    milli = min(max(int(row.get("gpu_milli") or 0), 0), 1000)
    whole = count > 0 and milli >= 1000
    models = [m for m in str(row.get("gpu_spec") or "").split("|") if m]
    affinity = None
    if models:
        term = {"matchExpressions": [{"key": LABEL_NODE_GPU_MODEL, "operator": "In", "values": models}]}
        affinity = {REQUIRED: {"nodeSelectorTerms": [term]}}
    return Demand(
        pod_key=f"plan/{name}",
        gpu_count=count if milli > 0 else 0,
        tflops=tflops * milli // 1000,
        vram=vram * milli // 1000,
        tflops_limit=tflops * milli // 1000,
        vram_limit=vram * milli // 1000,
        node_affinity=affinity,
        whole_gpu=whole,
        cpu=int(row.get("cpu_milli") or 0),
        memory=int(row.get("memory_mib") or 0) * MIB,
    )
