"""bind while the API server is stalled (SIGSTOP): answered within the bound, nothing left behind, and a
posted Binding never reported as a failed bind.

kube-scheduler gives up on an extender call after its httpTimeout (10 s in deploy/scheduler-config.yaml)
and then schedules the pod again; the extender must answer every bind before that, whatever the API
server does, and must never tell the scheduler that a bind failed once its Binding exists. The API
server is a local process here, so a scenario stops it (SIGSTOP: connections are accepted, nothing
answers) and always resumes it (SIGCONT) before it ends.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from scheduler_extender.binder import UNKNOWN_OUTCOME
from scheduler_extender.settings import Settings
from vgpu.contract import allocation
from vgpu.names import Annotation

from . import deploy
from .cluster import REAL_NODE, Cluster
from .kube import eventually, wait_bound
from .pods import gpu_pod, parked_gpu_pod
from .procs import Proc
from .test_burst import check_invariants, settle

BOUND = Settings().bind_timeout  # the e2e extender runs with the shipped defaults
SLACK = 1.0  # HTTP to the extender, a thread, a loaded 2-core box
SHARE = {Annotation.TFLOPS_REQUEST: "30", Annotation.VRAM_REQUEST: "4Gi"}
ERROR_LINE = re.compile(r"^(\S+ \S+) INFO scheduler_extender\.routes: bind (\S+)/(\S+) -> \S+ failed: (.*)$")


def api_server(cluster: Cluster) -> Proc:
    assert cluster.cp is not None
    (proc,) = [p for p in cluster.cp.procs if p.name == "kube-apiserver"]
    return proc


@contextmanager
def stopped(proc: Proc) -> Iterator[None]:
    """The process frozen (SIGSTOP) for the block, and always running again (SIGCONT) after it."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def extender(cluster: Cluster, path: str, body: dict[str, Any] | None = None) -> Any:
    """Call the extender on its verbs listener as kube-scheduler does (JSON in, JSON out)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{cluster.extender_verbs_port}{path}", data=data)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    return json.loads(text) if body is not None else text


def gauge(cluster: Cluster, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", extender(cluster, "/metrics"), re.M)
    assert found is not None, name
    return float(found.group(1))


def steady(cluster: Cluster, names: tuple[str, ...]) -> dict[str, float] | None:
    """The gauges, if they read the same three times over two seconds."""
    first = {n: gauge(cluster, n) for n in names}
    for _ in range(2):
        time.sleep(1)
        if {n: gauge(cluster, n) for n in names} != first:
            return None
    return first


@pytest.mark.timeout(240)
def test_bind_with_the_api_server_stopped_answers_within_the_bound_and_leaves_nothing(
    cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    # A GPU pod no node can take (its nodeSelector matches none), so it is pending and the scheduler
    # never binds it itself: the bind below is the only one, as kube-scheduler would send it.
    uid = core.create_namespaced_pod(fresh, parked_gpu_pod("parked", SHARE)).metadata.uid
    # Earlier scenarios' last pods may still be handing over (their gate released by the receipt): sample
    # the gauges once they stay put, and afterwards require nothing above them.
    gauges = ("tf_extender_reservations", "tf_extender_handoff_gates_held")
    before = eventually("the extender's gauges steady", lambda: steady(cluster, gauges), timeout=60)
    extender_pid = cluster.ours["tf-extender"].pid
    body = {"PodName": "parked", "PodNamespace": fresh, "PodUID": uid, "Node": REAL_NODE}
    with stopped(api_server(cluster)):
        start = time.monotonic()
        reply = extender(cluster, f"{deploy.EXTENDER_PREFIX}/bind", body)
        took = time.monotonic() - start
    print(f"bind with the API server stopped: {took:.2f}s, Error: {reply['Error']}")
    assert took < BOUND + SLACK, f"bind answered after {took:.2f}s, its bound is {BOUND}s"
    assert "the API server did not answer within" in reply["Error"] and "(stalled?)" in reply["Error"]
    # The API server runs again: nothing of that bind is left, and scheduling goes on without a restart.
    pod = eventually("the API server answering again", lambda: core.read_namespaced_pod("parked", fresh), 60)
    assert not pod.spec.node_name and allocation.KEY not in (pod.metadata.annotations or {})
    for name, value in before.items():
        eventually(f"{name} back to {value}", lambda n=name, v=value: gauge(cluster, n) <= v, 30)
    core.create_namespaced_pod(fresh, gpu_pod("after", SHARE))
    after = wait_bound(core, fresh, "after", timeout=90)
    assert allocation.decode(after.metadata.annotations[allocation.KEY]).node == after.spec.node_name == REAL_NODE
    assert cluster.ours["tf-extender"].pid == extender_pid and cluster.ours["tf-extender"].alive()


def bind_errors(log: str, since: int) -> list[tuple[float, str, str, str]]:
    """(when, namespace, pod, error) for each bind the extender answered with an Error after byte ``since``."""
    found = []
    with open(log, "rb") as text:
        text.seek(since)
        for line in text.read().decode(errors="replace").splitlines():
            if m := ERROR_LINE.match(line):
                stamp, millis = m.group(1).split(",")
                when = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
                found.append((when, m.group(2), m.group(3), m.group(4)))
    return found


def scheduled_at(pod: Any) -> float | None:
    """When the pod's Binding was made: its PodScheduled=True transition (whole seconds)."""
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "True":
            return float(calendar.timegm(condition.last_transition_time.utctimetuple()))
    return None


@pytest.mark.timeout(420)
def test_a_burst_through_an_api_server_stall_reports_no_bound_pod_as_failed(
    cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    """12 GPU pods, held by a scheduling gate until all exist, are released at once; the API server stops
    for 12 s once the first two have bound, while the rest wait for the node's hand-off gate or are being
    bound, and the scheduler retries those that failed. Binds in flight then fail within their bound; afterwards
    every pod runs with its own allocation, and no bind the extender answered with an Error had its Binding
    made by then — but for those whose outcome the stall hid (the Error says so, and the pod keeps its grant)."""
    log = cluster.ours["tf-extender"].log
    since = log.stat().st_size
    count = 12
    names = [f"burst-{i:02d}" for i in range(count)]
    for name in names:
        pod = gpu_pod(name, SHARE)
        pod["spec"]["schedulingGates"] = [{"name": "e2e.tensor-fusion.ai/hold"}]
        core.create_namespaced_pod(fresh, pod)
    binds_before = bind_latencies(cluster)
    for name in names:
        core.patch_namespaced_pod(name, fresh, [{"op": "remove", "path": "/spec/schedulingGates"}])

    def bound() -> int:
        return sum(bool(p.spec.node_name) for p in core.list_namespaced_pod(fresh).items)

    at_stall = eventually("the first pods bound", lambda: n if (n := bound()) >= 2 else None, every=0.05)
    assert at_stall < count, "every pod was bound before the API server stopped: nothing was tested"
    with stopped(api_server(cluster)):
        time.sleep(12)
    pods = settle(core, fresh, count, timeout=300)
    check_invariants(cluster, core, pods)
    running = [p for p in pods if p.status.phase == "Running"]
    assert len(running) == count, f"{count - len(running)} pods did not run after the stall"
    without = [
        p.metadata.name for p in pods if p.spec.node_name and allocation.KEY not in (p.metadata.annotations or {})
    ]
    assert without == [], f"bound without their allocation: {without}"
    errors = [e for e in bind_errors(str(log), since) if e[1] == fresh]
    by_name = {p.metadata.name: p for p in pods}
    # A bind whose Binding POST and read-back both went unanswered cannot know whether the Binding landed;
    # it says so ("could not be read back"), keeps the allocation and answers an Error, and the pod runs
    # with its grant either way. Only an Error that claims the bind failed may not have a Binding behind it.
    # kube-scheduler retries such a pod, and the retry's own Error ("could not read pod" while the API server
    # is still stalled) may come after the earlier bind's Binding landed: that Binding is not the retry's.
    unknown = [e for e in errors if UNKNOWN_OUTCOME in e[3]]
    outcome_unknown_since = {name: min(when for when, _, n, _ in unknown if n == name) for _, _, name, _ in unknown}
    reported_failed_yet_bound = [
        (name, error)
        for when, _, name, error in errors
        if UNKNOWN_OUTCOME not in error
        and not (name in outcome_unknown_since and outcome_unknown_since[name] <= when)
        and (at := scheduled_at(by_name[name])) is not None
        and at <= when
    ]
    stalls = sum("did not answer" in e[3] for e in errors)
    binds, within_http_timeout = (a - b for a, b in zip(bind_latencies(cluster), binds_before, strict=True))
    print(
        f"burst of {count}, {at_stall} bound when the stall began: {binds} binds, {within_http_timeout} of them "
        f"answered within 10 s; {len(errors)} Errors ({stalls} naming the stall, {len(unknown)} with an outcome "
        f"that could not be read back); all pods running"
    )
    assert errors, "no bind failed during the stall: nothing was tested"
    assert reported_failed_yet_bound == []
    assert within_http_timeout == binds


def bind_latencies(cluster: Cluster) -> tuple[float, float]:
    """(binds answered, binds answered within kube-scheduler's 10 s httpTimeout) so far."""
    text = extender(cluster, "/metrics")
    total = re.search(r'^tf_extender_request_seconds_count\{verb="bind"\} (\S+)$', text, re.M)
    within = re.search(r'^tf_extender_request_seconds_bucket\{le="10\.0",verb="bind"\} (\S+)$', text, re.M)
    return (float(total.group(1)) if total else 0.0, float(within.group(1)) if within else 0.0)
