"""``tfctl nodes``: each GPU node as its device plugin publishes it, and whether other pods can take its GPUs.

Read from the Nodes alone (the inventory annotation and the labels the plugin writes), through the API
server as the user of the kubeconfig: the pool, the GPUs (healthy of total), the enforcement backend, the
isolation modes its healthy GPUs serve (docs/isolation.md), how containers get their GPUs, and the NVIDIA
toolkit's envvar guard. A node whose guard is not ``on`` lets
any unprivileged pod name GPUs in ``NVIDIA_VISIBLE_DEVICES`` and take them outside every share
(docs/security.md, "Pods that are not ours"); ``nodes`` lists them after the table and exits 1, so a
script or a CI check can gate on it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from tf_shell.kube.api import GatewayError, RawObject
from tf_shell.kube.reads import MetricsCluster
from tfctl.top import NONE, inventories, table
from vgpu import isolation
from vgpu.contract import inventory
from vgpu.names import LABEL_NODE_DEVICE_DELIVERY, LABEL_NODE_ENVVAR_GUARD, EnvvarGuard

OPEN: Final = 1  # the exit code when some node lets other pods take GPUs


@dataclass(frozen=True, slots=True)
class GpuNode:
    name: str
    pool: str
    healthy: int
    gpus: int
    backend: str
    isolation: str  # the modes its healthy GPUs serve
    delivery: str
    guard: str


def add_subcommand(subparsers: Any) -> None:
    """Register ``nodes`` on tfctl's sub-parsers."""
    p = subparsers.add_parser(
        "nodes", help="GPU nodes: pool, GPUs, enforcement, device delivery, and whether other pods can take GPUs"
    )
    p.add_argument("--kubeconfig", help="kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config)")
    p.set_defaults(run=run)


def gpu_nodes(nodes: Iterable[RawObject]) -> list[GpuNode]:
    """The nodes with a readable inventory, by name; the GPUs counted are the schedulable ones (MIG units, not
    the GPUs in MIG mode that hold them)."""
    found = []
    for node, published in inventories(nodes):
        labels = (node.get("metadata") or {}).get("labels") or {}
        gpus = [g for g in published.gpus if not g.mig]
        found.append(
            GpuNode(
                name=published.node,
                pool=published.pool,
                healthy=sum(g.health is inventory.Health.HEALTHY for g in gpus),
                gpus=len(gpus),
                backend=published.backend.value,
                isolation=",".join(
                    sorted(
                        {
                            m.value
                            for g in gpus
                            if g.health is inventory.Health.HEALTHY
                            for m in isolation.served(published.backend, mig_unit=g.parent is not None)
                        }
                    )
                )
                or NONE,
                delivery=str(labels.get(LABEL_NODE_DEVICE_DELIVERY, NONE)),
                guard=str(labels.get(LABEL_NODE_ENVVAR_GUARD, NONE)),
            )
        )
    return sorted(found, key=lambda n: n.name)


def render(nodes: list[GpuNode]) -> str:
    if not nodes:
        return "no node publishes a GPU inventory (is the device plugin running on the GPU nodes?)"
    rows = [("NODE", "POOL", "GPUS", "BACKEND", "ISOLATION", "DELIVERY", "ENVVAR-GUARD")]
    rows += [(n.name, n.pool, f"{n.healthy}/{n.gpus}", n.backend, n.isolation, n.delivery, n.guard) for n in nodes]
    text = table(rows)
    open_nodes = [n.name for n in nodes if n.guard != EnvvarGuard.ON]
    if open_nodes:
        text += (
            f"\n\n{len(open_nodes)} node(s) let any pod take GPUs by naming them in NVIDIA_VISIBLE_DEVICES: "
            f"{', '.join(open_nodes)} (set the NVIDIA container toolkit's "
            "accept-nvidia-visible-devices-envvar-when-unprivileged = false: docs/security.md)"
        )
    return text


def run(args: argparse.Namespace) -> int:
    try:
        nodes = gpu_nodes(MetricsCluster.connect(args.kubeconfig).nodes())
    except GatewayError as exc:
        print(f"tfctl nodes: {exc}", file=sys.stderr)
        return 2
    print(render(nodes))
    return OPEN if any(n.guard != EnvvarGuard.ON for n in nodes) else 0
