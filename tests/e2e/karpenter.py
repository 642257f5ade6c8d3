"""The real Karpenter controller with its kwok cloud provider beside the e2e cluster, for test_karpenter.py only.

WHY: whether Karpenter provisions a node for a pending GPU-share pod is decided by its own scheduling
simulation over the instance types it knows (docs/karpenter.md); only the real controller shows it.
``scripts/build-karpenter.sh`` builds ``sigs.k8s.io/karpenter/kwok`` from its Go module into the cache beside
the Kubernetes binaries, with its CRDs from the same module. The kwok provider launches an "instance" by
creating a Node object (provider ID ``kwok://<name>``, Karpenter's unregistered taint, the instance type's
allocatable) and nothing else: no kubelet and no device plugin come with it. A scenario plays both on the new
node (fake_nodes.publish_gpu_node), as sigs.k8s.io/kwok would play the kubelet and our DaemonSet the plugin.

Here it runs as the admin (its RBAC is Karpenter's, not under test), with no leader election, reading the
instance types from a file (``INSTANCE_TYPES_FILE_PATH``: the provider's only way to get types other than its
embedded generic ones), NodeOverlays enabled (how a real cloud's instance types get our resources), and
short batching windows so a lone pending pod is provisioned within seconds.
Its metrics and health listeners bind every address (the kwok binary takes ports, not addresses).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient, ApiextensionsV1Api

from .kube import apply, eventually, load_docs
from .procs import REPO, Proc, build, free_port, http_ok, wait_until

BUILD_SCRIPT = REPO / "scripts" / "build-karpenter.sh"
GROUP, VERSION = "karpenter.sh", "v1"
KWOK_GROUP, KWOK_VERSION = "karpenter.kwok.sh", "v1alpha1"
ZONE = "test-zone-a"
LABEL_NODEPOOL = "karpenter.sh/nodepool"
UNREGISTERED_TAINT = "karpenter.sh/unregistered"


def instance_type(name: str, price: float, resources: Mapping[str, str]) -> dict[str, Any]:
    """One entry of the kwok provider's instance-types file: on-demand in ZONE at ``price``, linux/amd64."""
    requirements = [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
    ]
    return {
        "name": name,
        "offerings": [{"Price": price, "Available": True, "Requirements": requirements}],
        "architecture": "amd64",
        "operatingSystems": ["linux"],
        "resources": dict(resources),
    }


def _established(crd: Any) -> bool:
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or ())


@dataclass
class Karpenter:
    """``Karpenter(admin, root, admin_kubeconfig, types).start()`` runs it against the cluster; :meth:`stop`
    stops it (the scenario deletes its NodePool, NodeClaims and Nodes first)."""

    admin: ApiClient
    root: Path
    kubeconfig: Path
    instance_types: Sequence[dict[str, Any]]
    proc: Proc | None = None

    def start(self) -> Karpenter:
        built_dir = build(BUILD_SCRIPT)
        crds = load_docs(sorted((built_dir / "config" / "crd").glob("*.yaml")))
        apply(self.admin, crds)
        extensions = ApiextensionsV1Api(self.admin)
        for crd in crds:  # its caches need every kind served before it starts
            name = crd["metadata"]["name"]
            eventually(
                f"CRD {name} Established",
                lambda name=name: _established(extensions.read_custom_resource_definition(name)),
            )
        self.root.mkdir(parents=True, exist_ok=True)
        types_file = self.root / "instance-types.json"
        types_file.write_text(json.dumps(list(self.instance_types), indent=1))
        health_port = free_port()
        env = os.environ | {
            "KUBECONFIG": str(self.kubeconfig),
            "INSTANCE_TYPES_FILE_PATH": str(types_file),
            "DISABLE_LEADER_ELECTION": "true",
            "METRICS_PORT": str(free_port()),
            "HEALTH_PROBE_PORT": str(health_port),
            "LOG_LEVEL": "debug",
            "BATCH_IDLE_DURATION": "1s",
            "BATCH_MAX_DURATION": "2s",
            "FEATURE_GATES": "NodeOverlay=true",  # alpha in v1.14: extended resources added to a cloud's types
        }
        self.proc = Proc("karpenter", [str(built_dir / "bin" / "karpenter-kwok")], self.root / "karpenter.log", env)
        self.proc.start()
        wait_until("karpenter /readyz", lambda: http_ok(f"http://127.0.0.1:{health_port}/readyz"), 120, [self.proc])
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
