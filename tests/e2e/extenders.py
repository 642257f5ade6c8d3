"""More extenders beside the cluster's, and what the high-availability scenarios check of the pods they bound.

WHY: during a rolling restart, a drain or a leader change two extender replicas bind at once, each from
its own cache, against one API server (issue 12). The scenarios that play this out (test_two_extenders.py,
test_failover.py) start extra ``tf-extender`` processes exactly as the cluster starts its own, and judge
the outcome the same way: every allocation change the API server recorded, replayed from a watch.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes import watch
from kubernetes.client import CoreV1Api

from vgpu.contract import allocation

from .cluster import Cluster
from .kube import eventually
from .procs import Proc, free_port, http_ok, wait_until


@dataclass
class Extender:
    """An extra ``tf-extender``: the cluster's argv on ports of its own, its log beside the cluster's."""

    proc: Proc
    verbs_port: int
    public_port: int

    def start(self) -> Extender:
        """Start (or start again, on the same ports) and wait until ready (its first lists landed)."""
        assert not self.proc.alive(), f"{self.proc.name} is running already"
        self.proc.start()
        ready = partial(http_ok, f"http://127.0.0.1:{self.public_port}/readyz")
        wait_until(f"{self.proc.name} ready", ready, 60, [self.proc])
        return self


def extra_extender(cluster: Cluster, name: str) -> Extender:
    """Another extender named ``name``, started as the cluster's is; ready. Its log is shown when a test fails."""
    first = cluster.ours["tf-extender"]
    verbs, public = free_port(), free_port()
    argv = [a for a in first.argv if not a.startswith(("--verbs-port=", "--public-port="))]
    argv += [f"--verbs-port={verbs}", f"--public-port={public}"]
    proc = Proc(name, argv, first.log.with_name(f"{name}.log"))
    cluster.ours[name] = proc
    return Extender(proc, verbs, public).start()


@contextmanager
def second_extender(cluster: Cluster, name: str = "tf-extender-2") -> Iterator[int]:
    """An extra extender for the block; yields its verbs port."""
    extender = extra_extender(cluster, name)
    try:
        yield extender.verbs_port
    finally:
        extender.proc.stop()


def allocations_seen(core: CoreV1Api, namespace: str, since: str, bound: bool = False) -> dict[str, list[str]]:
    """Per pod, its allocation annotation ("" when absent) in every change since resourceVersion ``since``
    (with ``bound``: in every change that shows the pod bound to a node)."""
    seen: dict[str, list[str]] = {}
    stream = watch.Watch().stream(
        core.list_namespaced_pod, namespace, resource_version=since, timeout_seconds=3, _request_timeout=10
    )
    for event in stream:
        pod = event["object"]
        if event["type"] in ("ADDED", "MODIFIED") and (pod.spec.node_name or not bound):
            text = (pod.metadata.annotations or {}).get(allocation.KEY, "")
            seen.setdefault(pod.metadata.name, []).append(text)
    return seen


def call(port: int, path: str, body: dict[str, Any] | None = None) -> Any:
    """POST ``body`` (GET without one) to an extender's port; its JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read().decode())


def knowing(ports: tuple[int, ...], namespace: str, pod: str, nodes: list[str], pool: str) -> None:
    """Wait until every extender on ``ports`` knows every one of ``nodes`` (its explain of ``pod`` names them)."""
    for port in ports:
        eventually(
            f"extender :{port} knowing the {pool} nodes",
            lambda p=port: all(n in json.dumps(call(p, f"/explain/{namespace}/{pod}")) for n in nodes),
            timeout=30,
        )


def allocated_there(pod: Any, uid: str) -> bool:
    """Whether the pod's allocation is for this pod and the node it is bound to."""
    alloc = allocation.decode(pod.metadata.annotations[allocation.KEY])
    return alloc.node == pod.spec.node_name and alloc.pod_uid == uid


def removed_after_written(values: list[str]) -> bool:
    """Whether an allocation, once on the pod, was later absent from it."""
    written = [i for i, text in enumerate(values) if text]
    return bool(written) and "" in values[written[0] :]
