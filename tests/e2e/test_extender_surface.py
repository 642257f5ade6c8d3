"""The running extender's HTTP surface: hostile requests never get a 5xx and leave it working; its
verbs cannot be reached off loopback, and the port that can be reached serves no verb.

WHY end to end: what listens where, and what a body looks like by the time a route reads it, are
only what they are in the real process (uvicorn with httptools, the flags the harness passes the
way the chart does, the real API server behind /explain). The unit tests drive the apps in-process.

(a) Every verb, at the URL kube-scheduler calls, gets each well-formed body of this scenario
    poisoned in every one of its strings (keys included) with lone UTF-16 surrogates (as \\ud800
    escapes and as the raw bytes ED A0 80), invalid UTF-8 just inside every string, huge numbers,
    deep nesting and random bytes; both listeners get malformed request lines and headers, and the
    public one /explain with hostile names. No answer is a 5xx, nothing is bound or reserved, and a
    valid filter is answered afterwards.
(b) From a non-loopback address of this machine, the verbs port refuses the connection, while the
    public port answers /metrics there; a POST to /bind on it is a 404/405 and binds nothing.
"""

from __future__ import annotations

import random
import re
import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes.client import CoreV1Api

from tests.hostile_json import every_hostile_body
from vgpu.names import Annotation

from .cluster import REAL_NODE, Cluster
from .deploy import EXTENDER_PREFIX
from .kube import eventually
from .pods import gpu_pod
from .procs import non_loopback_ipv4

NAMESPACE = "e2e-surface"
NOWHERE_POOL = "e2e-surface-no-nodes"  # a pool without nodes: its pods stay Pending, never bound
SHARE = {Annotation.TFLOPS_REQUEST: "1", Annotation.VRAM_REQUEST: "1Gi"}
JSON = {"Content-Type": "application/json"}
BOUND_METRIC = re.compile(r'^tf_extender_binds_total\{result="bound[^"]*"\} (\S+)$', re.MULTILINE)


@pytest.fixture(scope="module")
def pending(cluster: Cluster) -> Iterator[Any]:
    """An unbound pod that anyone who knows its uid would like to pin to a node."""
    cluster.namespace(NAMESPACE)
    cluster.ensure_pool(NOWHERE_POOL)
    core = cluster.core
    created = core.create_namespaced_pod(
        NAMESPACE, gpu_pod("never-placed", {**SHARE, Annotation.GPUPOOL: NOWHERE_POOL})
    )
    yield created
    core.delete_namespaced_pod(created.metadata.name, NAMESPACE, grace_period_seconds=0)


@pytest.fixture(scope="module")
def probe(cluster: Cluster) -> dict[str, Any]:
    """A GPU pod as admitted (the webhook's resolved request on it), never created: the Pod of the
    verb bodies, exactly what kube-scheduler would send for it."""
    cluster.namespace(NAMESPACE)
    admitted = cluster.core.create_namespaced_pod(NAMESPACE, gpu_pod("surface-probe", SHARE), dry_run="All")
    pod: dict[str, Any] = cluster.admin.sanitize_for_serialization(admitted)
    return pod


def bind_args(pod: Any) -> dict[str, str]:
    return {"PodName": pod.metadata.name, "PodNamespace": NAMESPACE, "PodUID": pod.metadata.uid, "Node": REAL_NODE}


def bound_count(metrics: str) -> float:
    return sum(float(v) for v in BOUND_METRIC.findall(metrics))


def raw_request(port: int, request: bytes) -> int:
    """Send ``request`` as is; the status it gets (0: the connection closed without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        try:
            head = conn.recv(64)
        except ConnectionResetError:
            return 0
    return int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.") else 0


MALFORMED_REQUESTS = (
    b"POST %(prefix)s/filter\xff HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /explain/default/\xed\xa0\x80 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST %(prefix)s/bind HTTP/1.1\r\nHost: x\r\nX-Junk: \xff\xfe\r\nContent-Type: application/json\xff\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    b"POST %(prefix)s/bind HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n{}",
    b"POST %(prefix)s/filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"POST %(prefix)s/prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 2\r\n\r\n{}",
    b"\xff\xfe GARBAGE\r\n\r\n",
)
HOSTILE_NAMES = ("%ED%A0%80", "%FF%FE", "..", "%2E%2E", "%2F", "a%20b", "UPPER", "%00", "x" * 300, "-", "a.b.")


def test_hostile_requests_get_no_5xx_and_the_extender_still_filters(
    cluster: Cluster, core: CoreV1Api, pending: Any, probe: dict[str, Any]
) -> None:
    verbs = f"http://127.0.0.1:{cluster.extender_verbs_port}{EXTENDER_PREFIX}"
    public = f"http://127.0.0.1:{cluster.extender_public_port}"
    bodies = {
        "filter": {"Pod": probe, "NodeNames": [REAL_NODE], "Nodes": None},
        "prioritize": {"Pod": probe, "NodeNames": [REAL_NODE], "Nodes": None},
        "bind": bind_args(pending),
        "preempt": {
            "Pod": probe,
            "NodeNameToMetaVictims": {REAL_NODE: {"Pods": [{"UID": "v"}], "NumPDBViolations": 0}},
        },
    }
    noise = random.Random(11)
    statuses: Counter[int] = Counter()
    with httpx.Client(timeout=30) as http:
        bound_before = bound_count(http.get(f"{public}/metrics").text)
        for verb, doc in bodies.items():
            hostile = [body for _, body in every_hostile_body(doc)]
            hostile += [b"[" * depth + b"]" * depth for depth in (1_000, 100_000)]
            hostile += [noise.randbytes(noise.randrange(1, 300)) for _ in range(50)]
            for body in hostile:
                statuses[http.post(f"{verbs}/{verb}", content=body, headers=JSON).status_code] += 1
        for _, body in every_hostile_body(probe):
            statuses[http.post(f"{public}/explain", content=body, headers=JSON).status_code] += 1
        for namespace in (NAMESPACE, *HOSTILE_NAMES):
            for name in ("never-placed", *HOSTILE_NAMES):
                statuses[http.get(f"{public}/explain/{namespace}/{name}").status_code] += 1
        for port in (cluster.extender_verbs_port, cluster.extender_public_port):
            for request in MALFORMED_REQUESTS:
                statuses[raw_request(port, request.replace(b"%(prefix)s", EXTENDER_PREFIX.encode()))] += 1
        total, failed = sum(statuses.values()), sum(n for status, n in statuses.items() if status >= 500)
        print(f"\nextender surface fuzz: {total} requests, {failed} answered 5xx; by status {sorted(statuses.items())}")
        assert failed == 0, statuses
        assert cluster.ours["tf-extender"].alive()
        assert core.read_namespaced_pod(pending.metadata.name, NAMESPACE).spec.node_name is None
        assert bound_count(http.get(f"{public}/metrics").text) == bound_before

        answer = http.post(f"{verbs}/filter", json=bodies["filter"]).json()
        assert (answer["NodeNames"], answer["Error"]) == ([REAL_NODE], "")
        # That filter held room on the node for a pod that will never exist; a new attempt of the same
        # pod that fits nowhere drops it, as the scheduler's next try would.
        gone = http.post(f"{verbs}/filter", json={**bodies["filter"], "NodeNames": ["e2e-surface-no-such-node"]})
        assert gone.json()["NodeNames"] == []


def test_the_verbs_are_not_reachable_off_loopback_and_the_public_port_binds_nothing(
    cluster: Cluster, core: CoreV1Api, pending: Any
) -> None:
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to reach the extender from")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((address, cluster.extender_verbs_port), timeout=5).close()
    public = f"http://{address}:{cluster.extender_public_port}"
    with httpx.Client(timeout=30) as http:
        metrics = http.get(f"{public}/metrics")
        assert metrics.status_code == 200 and "tf_extender_binds_total" in metrics.text
        for path in ("/bind", f"{EXTENDER_PREFIX}/bind"):
            reply = http.post(f"{public}{path}", json=bind_args(pending))
            assert reply.status_code in (404, 405), (path, reply.status_code, reply.text)
        assert bound_count(http.get(f"{public}/metrics").text) == bound_count(metrics.text)
    # Unbound still, and not for want of time: the scheduler keeps retrying it and finds no node.
    assert core.read_namespaced_pod(pending.metadata.name, NAMESPACE).spec.node_name is None
    eventually(
        "the scheduler to report it cannot place the pod",
        lambda: [e for e in core.list_namespaced_event(NAMESPACE).items if e.involved_object.name == "never-placed"],
    )
    assert core.read_namespaced_pod(pending.metadata.name, NAMESPACE).spec.node_name is None
