"""No pod runs on another pod's GPU grant, whatever a tenant does to reach a GPU node first.

Two layers, each tried on its own because each alone has failed before:

1. Admission: a tenant (``edit`` in its namespace) who labels a pod for tensor-fusion and presets
   ``spec.nodeName`` to the GPU node, so that it never meets the scheduler, is denied by the webhook;
   where the webhook does not look (its own namespace), the ValidatingAdmissionPolicy denies it.
2. The device plugin: pods that reach the node without the extender anyway — here an administrator's
   hand-posted Binding, the way any client with ``pods/binding`` could — are admitted by the kubelet
   *while a scheduled pod is in hand-off*, made certain by pausing the kubelet until both are bound,
   so that the kubelet admits the rogue pods first (earlier in its queue) and their Allocate is
   indistinguishable from the scheduled pod's. Over many such rounds, in one namespace and across
   namespaces, the fake container runtime's record of every CreateContainer must show no container
   created with a grant other than its own pod's, every scheduled pod Running on its own grant, and
   every rogue pod without a single container, its start refused with the device plugin's reason (or, on
   a loaded machine where the kubelet admits it before the plugin has seen the scheduled pod's grant, its
   Allocate refused outright: no grant handed out at all).
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes.client import ApiException, CoreV1Api

from vgpu.names import Annotation, Env

from .cluster import REAL_NODE, Cluster
from .deploy import system_namespace
from .kube import api_client, bind_by_hand, events_for, eventually, wait_bound, wait_running
from .pods import allocation_of, assert_grant_matches_allocation, created, gpu_pod

OWN = "e2e-isolation-a"
OTHER = "e2e-isolation-b"
NOWHERE_POOL = "e2e-no-nodes"  # a pool without nodes: the scheduler never binds these pods
SHARE = {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "1Gi"}
SM_PERCENT = 4  # SHARE's 10 TFLOPS of an A100's 312, rounded up
ROUNDS = 20
PRESET = "spec.nodeName '" + REAL_NODE + "': a tensor-fusion pod is placed by the tensor-fusion scheduler"
ALLOCATE_REFUSED = "Allocate refused"
NO_GRANT = re.compile(r"UnexpectedAdmissionError: Allocate failed .* no pod on node \S+ awaits an allocation")
REFUSED = re.compile(
    r"was admitted with devices .* but the Allocate that gave them answered with pod (\S+)'s GPU grant"
)


@pytest.fixture(scope="module")
def tenants(cluster: Cluster) -> dict[str, CoreV1Api]:
    """The tenant user with ``edit`` in both namespaces (the rights a team has in a shared cluster)."""
    for namespace in (OWN, OTHER):
        cluster.grant_tenant(cluster.namespace(namespace), "edit")
    cluster.ensure_pool(NOWHERE_POOL)
    tenant = CoreV1Api(api_client(cluster.tenant_kubeconfig))
    return {OWN: tenant, OTHER: tenant}


def preset(name: str) -> dict[str, Any]:
    pod = gpu_pod(name, SHARE)
    pod["spec"]["nodeName"] = REAL_NODE
    return pod


def test_a_tenant_gpu_pod_with_a_preset_node_is_denied_and_the_policy_backs_the_webhook(
    cluster: Cluster, tenants: dict[str, CoreV1Api]
) -> None:
    denied = 0
    for i, namespace in enumerate([OWN, OTHER] * 3):
        with pytest.raises(ApiException) as err:
            tenants[namespace].create_namespaced_pod(namespace, preset(f"preset-{i}"))
        assert err.value.status == 400 and PRESET in str(err.value.body), err.value.body
        denied += 1
    assert denied == 6
    assert [p for ns in (OWN, OTHER) for p in cluster.core.list_namespaced_pod(ns).items] == []
    # The webhook never sees its own namespace: there the admission policy refuses the same pod.
    with pytest.raises(ApiException) as err:
        cluster.core.create_namespaced_pod(system_namespace(), preset("preset-policy"))
    assert err.value.status == 403 and "ValidatingAdmissionPolicy 'tensor-fusion-pod-contract'" in str(err.value.body)
    assert PRESET in str(err.value.body), err.value.body


@contextmanager
def kubelet_paused(cluster: Cluster) -> Iterator[None]:
    """The kubelet stopped in its tracks (SIGSTOP) until the block ends; it catches up on resume."""
    assert cluster.node is not None and cluster.node.kubelet is not None
    pid = cluster.node.kubelet.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def refusals(core: CoreV1Api, namespace: str, name: str) -> list[str]:
    """The grant owners named by the device plugin's PreStartContainer refusals of this pod, and
    :data:`ALLOCATE_REFUSED` for each Allocate it refused outright (the kubelet admitted the rogue pod before
    the plugin's pod cache showed the scheduled pod's grant: a loaded machine; no grant was handed out)."""
    lines = events_for(core, namespace, name)
    return [m.group(1) for line in lines if (m := REFUSED.search(line))] + [
        ALLOCATE_REFUSED for line in lines if NO_GRANT.search(line)
    ]


def test_rogue_pods_admitted_during_a_hand_off_never_start_on_its_grant(
    cluster: Cluster, tenants: dict[str, CoreV1Api]
) -> None:
    assert cluster.node is not None
    core = cluster.core
    legit: list[Any] = []
    rogues: list[tuple[str, str]] = []
    for r in range(ROUNDS):
        round_rogues = [(OWN, f"rogue-{r}-own"), (OTHER, f"rogue-{r}-other")]
        for namespace, name in round_rogues:
            rogue = gpu_pod(name, {**SHARE, Annotation.GPUPOOL: NOWHERE_POOL})
            tenants[namespace].create_namespaced_pod(namespace, rogue)
        with kubelet_paused(cluster):
            for namespace, name in round_rogues:
                bind_by_hand(core, namespace, name, REAL_NODE)
            tenants[OWN].create_namespaced_pod(OWN, gpu_pod(f"legit-{r}", SHARE))
            bound = wait_bound(core, OWN, f"legit-{r}")
            assert bound.spec.node_name == REAL_NODE
        legit.append(wait_running(core, OWN, f"legit-{r}"))
        for namespace, name in round_rogues:
            owners = eventually(
                f"the start of {namespace}/{name} refused", lambda ns=namespace, n=name: refusals(core, ns, n), 30
            )
            assert set(owners) <= {f"{OWN}/legit-{r}", ALLOCATE_REFUSED}, owners
        rogues += round_rogues
        for namespace, name in [*round_rogues, (OWN, f"legit-{r}")]:  # free the node's slots for the next round
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    ours = [c for c in cluster.node.creates() if c["namespace"] in (OWN, OTHER)]
    on_rogues = [c for c in ours if (c["namespace"], c["pod"]) in set(rogues)]
    on_another_grant = [
        c
        for c in ours
        if (c["env"].get(Env.TF_POD_NAMESPACE), c["env"].get(Env.TF_POD_NAME)) != (c["namespace"], c["pod"])
    ]
    assert (len(on_rogues), len(on_another_grant)) == (0, 0), (on_rogues, on_another_grant)
    for pod in legit:
        assert_grant_matches_allocation(created(cluster.node, pod, "main"), allocation_of(pod), SM_PERCENT)
    assert (len(legit), len(rogues), len(ours)) == (ROUNDS, 2 * ROUNDS, ROUNDS)
