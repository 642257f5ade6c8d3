"""Two extenders binding at once, as the old and the new kube-scheduler do during a rolling restart, a
drain or a leader change (issue 12): the same pods — every pod bound once, with one allocation, never
removed; different pods onto the same GPU — never promised twice.

A second ``tf-extender`` process runs beside the cluster's, with its own cache and ledger, against the
same API server. A burst of pending GPU pods — parked by a nodeSelector no node matches, so the real
kube-scheduler never binds them itself — is then bound through both extenders' verb ports at once,
each pod to its own kubelet-less node (its gate free), the same node on both sides. The API server is
the only arbiter: the conditional writes (the Binding's resourceVersion, the node's claims Lease) must let
exactly one bind win each pod and the loser back off without undoing it. The pods' allocation annotations are checked through every change the API server
recorded (a watch replayed from before the burst), not just at the end.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes.client import CoreV1Api

from vgpu.contract import allocation
from vgpu.names import Annotation

from . import deploy
from .cluster import Cluster
from .extenders import allocated_there, allocations_seen, call, knowing, removed_after_written, second_extender
from .fake_nodes import gpus
from .pods import parked_gpu_pod

POOL = "e2e-ha"
COUNT = 12
SHARE = {Annotation.TFLOPS_REQUEST: "30", Annotation.VRAM_REQUEST: "4Gi", Annotation.GPUPOOL: POOL}


def bind_all(jobs: list[tuple[int, str, str]], namespace: str, uids: dict[str, str]) -> list[str]:
    """Send every (extender port, pod, node) bind at once, as kube-scheduler's binding cycles do; the
    non-empty Errors they answered."""

    def bind(job: tuple[int, str, str]) -> str:
        port, name, node = job
        body = {"PodName": name, "PodNamespace": namespace, "PodUID": uids[name], "Node": node}
        reply: dict[str, str] = call(port, f"{deploy.EXTENDER_PREFIX}/bind", body)
        return reply["Error"]

    with ThreadPoolExecutor(len(jobs)) as pool:
        return [e for e in pool.map(bind, jobs) if e]


@pytest.mark.timeout(300)
def test_two_extenders_binding_the_same_pods_at_once_bind_each_once_with_one_allocation(
    cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    nodes = [f"e2e-ha-{i}" for i in range(COUNT)]
    for node in nodes:
        cluster.add_fake_node(node, gpus(node, 1), pool=POOL)
    try:
        names = [f"ha-{i:02d}" for i in range(COUNT)]
        uids = {}
        for name in names:
            uids[name] = core.create_namespaced_pod(fresh, parked_gpu_pod(name, SHARE)).metadata.uid
        since = core.list_namespaced_pod(fresh).metadata.resource_version
        with second_extender(cluster) as other:
            ports = (cluster.extender_verbs_port, other)
            knowing(ports, fresh, names[0], nodes, POOL)
            jobs = [(port, name, node) for name, node in zip(names, nodes, strict=True) for port in ports]
            errors = bind_all(jobs, fresh, uids)
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(fresh).items}
        bound = [n for n in names if pods[n].spec.node_name]
        without = [n for n in bound if allocation.KEY not in (pods[n].metadata.annotations or {})]
        mismatched = [n for n in bound if n not in without and not allocated_there(pods[n], uids[n])]
        seen = allocations_seen(core, fresh, since)
        several = {n: k for n in names if (k := len(set(seen.get(n, [])) - {""})) != 1}
        removed = [n for n in names if removed_after_written(seen.get(n, []))]
        backed_off = sum("another extender is binding" in e for e in errors)
        print(
            f"{COUNT} pods x 2 extenders: {len(bound)} bound, {len(without)} without an allocation, "
            f"{len(mismatched)} with an allocation for another node or pod, {len(several)} given several "
            f"allocations, {len(removed)} with an allocation removed; {len(errors)} Errors "
            f"({backed_off} backing off for the other extender)"
        )
        assert len(bound) == COUNT and [pods[n].spec.node_name for n in names] == nodes
        assert without == [] and mismatched == []
        assert several == {}, f"pods given several different allocations: {several}"
        assert removed == [], f"pods whose allocation was removed after it was written: {removed}"
        allowed = ("another extender is binding", "already bound", "pod watch", "other extenders")
        assert all(any(a in e for a in allowed) for e in errors), errors
    finally:
        for node in nodes:
            core.delete_node(node)


BIG = {Annotation.TFLOPS_REQUEST: "200", Annotation.VRAM_REQUEST: "50Gi", Annotation.GPUPOOL: POOL}
PAIRS = 10


@pytest.mark.timeout(300)
def test_two_extenders_placing_different_pods_on_one_gpu_at_once_never_promise_it_twice(
    cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    """Each node's one A100 has room for one 200-TFLOPS/50Gi pod; two such pods race for it, one through
    each extender, on ten nodes at once. Each extender places from its own cache, which may not yet show
    the other's allocation: only the compare-and-swap of the node's claims Lease before the Binding keeps
    the GPU from being promised twice (the later one decides again beside the earlier one's claim)."""
    nodes = [f"e2e-ha-pair-{i}" for i in range(PAIRS)]
    for node in nodes:
        cluster.add_fake_node(node, gpus(node, 1), pool=POOL)
    try:
        pairs = [(f"pair-{i:02d}-a", f"pair-{i:02d}-b") for i in range(PAIRS)]
        uids = {}
        for name in [n for pair in pairs for n in pair]:
            uids[name] = core.create_namespaced_pod(fresh, parked_gpu_pod(name, BIG)).metadata.uid
        with second_extender(cluster) as other:
            ports = (cluster.extender_verbs_port, other)
            knowing(ports, fresh, pairs[0][0], nodes, POOL)
            jobs = [(ports[k], pair[k], node) for pair, node in zip(pairs, nodes, strict=True) for k in (0, 1)]
            errors = bind_all(jobs, fresh, uids)
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(fresh).items}
        per_node = {node: [n for n in pair if pods[n].spec.node_name] for pair, node in zip(pairs, nodes, strict=True)}
        promised = {node: [n for n in pair if allocation.KEY in (pods[n].metadata.annotations or {})]
                    for pair, node in zip(pairs, nodes, strict=True)}  # fmt: skip
        twice = [node for node, held in promised.items() if len(held) > 1]
        backed_off = sum("no longer fits" in e or "other extenders" in e for e in errors)
        print(
            f"{PAIRS} nodes x 2 pods through 2 extenders: {sum(map(len, per_node.values()))} bound, "
            f"{len(twice)} GPUs promised twice, {sum(not held for held in per_node.values())} nodes left empty; "
            f"{len(errors)} Errors ({backed_off} backing off for the other extender's claim)"
        )
        assert twice == [], f"GPUs promised to two pods: {twice}"
        assert all(len(held) <= 1 for held in per_node.values())
        for node, held in per_node.items():  # a bound pod is bound with its allocation; the other holds none
            assert promised[node] == held, (node, held, promised[node])
            assert all(allocated_there(pods[n], uids[n]) for n in held)
        allowed = ("other extenders", "no longer fits", "still handing GPUs over", "cannot reserve", "pod watch")
        assert all(any(a in e for a in allowed) for e in errors), errors
    finally:
        for node in nodes:
            core.delete_node(node)
