"""Scheduling throughput: GPU pods against plain pods through the same kube-scheduler (issue 14).

WHY: decision latency (extender_latency.py) says nothing about how many pods per second reach a node.
The extender adds API calls to every GPU pod's bind (the claim on the node's claims Lease, the Binding
carrying the allocation) and a per-node hand-off gate, and kube-scheduler's own client limits can hide all of it. This
measures pods/s end to end, on the e2e tier's real kube-apiserver and kube-scheduler (v1.36.2) with the
real tf-webhook and tf-extender, so the ratio GPU/plain is the figure the issue's "Done when" names.

How: the e2e cluster (tests/e2e/cluster.py) without its kubelet node, kube-scheduler running the shipped
KubeSchedulerConfiguration with only its client QPS/burst replaced (``--qps/--burst``, or the shipped
ones with ``--shipped-qps``); kubelet-less 8×A100 nodes (tests/e2e/fake_nodes.py), added in parallel.
Per node count, four cases in one namespace, emptied between them:
- B: plain pods (no GPU) through the same scheduler profile (schedulerName tensor-fusion-scheduler);
- A: GPU pods of one shape (10 TFLOPS, 2 GiB), the placement policy ``--policy`` (binpack by default,
  as the issue measured: a burst then targets one node and meets its hand-off gate);
- C: GPU pods of all-different shapes (the VRAM request differs by 1 MiB per pod: every decision cold);
- W: the floor of a GPU pod's bind protocol. Plain pods that no scheduler serves, bound by this process
  with exactly the API calls the extender's bind makes for a GPU pod, through its own gateway and
  identity (scheduler_extender/kube/gateway.py): the claim (a compare-and-swap of the node's claims
  Lease), the Binding carrying the allocation and the ``allocated-node`` label (resourceVersion
  precondition), the GpuGranted Event; with ``--receipts`` the receipt follows as for A and C. No webhook,
  no filter or prioritize, no placement: what the API server, etcd and every watcher spend on those writes.
  W/B bounds what any extender could reach with that protocol; the CPU column ``bench`` is this process
  (the hand binder).
Pods are created as fast as a pool of threads can; the figure is pods / (first create → last bound), the
binding times taken from a watch. With ``--receipts`` a thread pool writes the device plugin's hand-off
receipt (tests/e2e/pods.py receipt_patch, with the plugin's identity) on each GPU pod as soon as the watch
shows it bound with its allocation, as the plugin did before it kept receipts on the node. With ``--admit``
it writes every bound pod's first status (``startTime``), plain or GPU, as a kubelet does once it admitted
the pod, which opens the node's gate (the shipped plugin writes no receipt on the pod: this is the model of
today's protocol). With neither, a node's gate frees only at the extender's ``handoff_ttl``. Also printed
per case: the CPU each process spent per pod, the extender's bind outcomes and what its filter passed.

    .venv/bin/python -m benchmarks.throughput                              # 200 and 1,000 nodes, 1000/2000
    .venv/bin/python -m benchmarks.throughput --nodes 200 --admit --runs 2
    .venv/bin/python -m benchmarks.throughput --shipped-qps
    .venv/bin/python -m benchmarks.throughput --nodes 200 --receipts --cases BW --w-without claim,event

Needs what the e2e tier needs (root, the cached Kubernetes binaries); run it under the tier's lock.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.watch.watch import iter_resp_lines

from benchmarks import api_calls
from benchmarks.hardware import describe
from scheduler_extender.claim_board import ClaimBoard
from scheduler_extender.events import REASON_GRANTED
from scheduler_extender.gateway import KubeGateway, PodEvent
from scheduler_extender.kube.gateway import KubernetesGateway
from scheduler_extender.objects import allocated_node_label
from tests.e2e import deploy
from tests.e2e.cluster import Cluster
from tests.e2e.fake_nodes import add_fake_node, gpus
from tests.e2e.kube import emptied
from tests.e2e.pods import IMAGE, gpu_pod, receipt_patch
from tf_shell.kube.client import api_client
from vgpu.contract import allocation
from vgpu.contract.claims import Claim
from vgpu.names import DEFAULT_POOL, LABEL_ALLOCATED_NODE, SCHEDULER_NAME, Annotation, Qos
from vgpu.timefmt import rfc3339

NAMESPACE = "bench-throughput"
GPUS_PER_NODE = 8
CREATORS = 8  # threads creating pods
HANDS = 4  # threads writing receipts
WARM_UP = 50  # pods per case before the measured runs at each node count
BOUND_TIMEOUT = 300.0  # seconds a case may take before it is reported unfinished
PROCESSES = ("kube-apiserver", "kube-scheduler", "tf-extender", "tf-webhook", "etcd")
BY_HAND = "bench-bound-by-hand"  # case W's schedulerName: no scheduler serves it, this process binds its pods
MILLI_TFLOPS, VRAM = 10_000, 2 << 30  # what case W grants each pod (A's shape) on one A100 (312 TFLOPS)
LEAVABLE = ("claim", "event")  # case W's calls that --w-without may leave out (the Binding stays)
KEPT_CLAIMS = 3  # claims case W leaves on a node's Lease beside its own: the binds in flight there
CALL_TIMEOUT = 10.0
TICKS = os.sysconf("SC_CLK_TCK")


def plain_pod(name: str, scheduler: str = SCHEDULER_NAME) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "main", "image": IMAGE}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def shaped_pod(policy: str, vram: Callable[[int], str]) -> Callable[[str, int], dict[str, Any]]:
    def build(name: str, i: int) -> dict[str, Any]:
        share = {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: vram(i), Annotation.PLACEMENT_POLICY: policy}
        return gpu_pod(name, share)

    return build


def cases(policy: str) -> dict[str, Callable[[str, int], dict[str, Any]]]:
    """Case letter -> pod builder (name, index)."""
    return {
        "B": lambda name, _: plain_pod(name),
        "A": shaped_pod(policy, lambda _: "2Gi"),
        "C": shaped_pod(policy, lambda i: f"{2048 + i}Mi"),
        "W": lambda name, _: plain_pod(name, BY_HAND),
    }


class HandBinder:
    """Case W: binds each pod it is given with the API calls the extender's bind makes for a GPU pod
    (arbiter.py: the claim on the node's claims Lease; binder.py: _post_binding, the Binding carrying the
    allocation; routes.py: the GpuGranted Event), in the same order, through the extender's gateway with
    the extender's identity, and nothing else: nodes round-robin, one GPU each in turn, A's share, no
    placement and no checks of its own (a node's claims keep the last few, as pruning would). ``without``:
    calls of :data:`LEAVABLE` left out, to price each one."""

    def __init__(
        self, gateway: KubeGateway, nodes: int, without: frozenset[str] = frozenset(), namespace: str = "default"
    ) -> None:
        self.gateway = gateway
        self.nodes = nodes
        self.without = without
        self.board = ClaimBoard(gateway, namespace, "bench-throughput", clock=time.time)
        self.hands = ThreadPoolExecutor(CREATORS, thread_name_prefix="bench-binds")
        self._lock = threading.Lock()
        self._given = 0
        self.failures: list[BaseException] = []

    def give(self, pod: dict[str, Any]) -> None:
        with self._lock:
            turn, self._given = self._given, self._given + 1
        self.hands.submit(self._bind_or_note, pod, turn)

    def stop(self) -> None:
        self.hands.shutdown(wait=True)

    def _bind_or_note(self, pod: dict[str, Any], turn: int) -> None:
        try:
            self._bind(pod, turn)
        except Exception as exc:  # reported with the case
            self.failures.append(exc)

    def _bind(self, pod: dict[str, Any], turn: int) -> None:
        meta = pod["metadata"]
        name, uid = meta["name"], meta["uid"]
        node = f"bench-{turn % self.nodes:05d}"
        gpu = gpus(node, GPUS_PER_NODE)[(turn // self.nodes) % GPUS_PER_NODE]
        grant = allocation.GpuGrant(uuid=gpu.uuid, index=gpu.index, tflops_request=MILLI_TFLOPS,
                                    tflops_limit=MILLI_TFLOPS, vram_request=VRAM, vram_limit=VRAM,
                                    gpu_tflops=gpu.model.tflops_milli)  # fmt: skip
        granted = allocation.PodAllocation(pod_uid=uid, node=node, pool=DEFAULT_POOL, qos=Qos.MEDIUM,
                                           containers=tuple(c["name"] for c in pod["spec"]["containers"]),
                                           gpus=(grant,), bound_at=rfc3339(time.time()))  # fmt: skip
        if "claim" not in self.without:
            with self.board.writing(node):
                known = self.board.current(node, timeout=CALL_TIMEOUT)
                mine = Claim(pod_uid=uid, pod=f"{NAMESPACE}/{name}", version=int(meta["resourceVersion"]),
                             gpus=(grant,), slots=1, at=time.time())  # fmt: skip
                claims = replace(known, claims=(*known.claims[-KEPT_CLAIMS:], mine))
                self.board.write(claims, timeout=CALL_TIMEOUT)
        self.gateway.bind(NAMESPACE, name, uid, node, annotations={allocation.KEY: allocation.encode(granted)},
                          labels={LABEL_ALLOCATED_NODE: allocated_node_label(node)},
                          resource_version=meta["resourceVersion"])  # fmt: skip
        if "event" in self.without:
            return
        event = PodEvent(
            namespace=NAMESPACE,
            pod_name=name,
            pod_uid=uid,
            reason=REASON_GRANTED,
            message=granted.describe(),
            type="Normal",
        )
        self.gateway.record_event(event)


def drained(response: Any) -> None:
    """Read an unparsed response to its end and give its connection back to the pool (the answer is not
    deserialised into the client's models: that would cost the benchmark's process more than the pod)."""
    response.drain_conn()
    response.release_conn()


@dataclass
class Recorder:
    """Watches the namespace from ``since``: when each pod was first seen bound (monotonic clock); with a
    ``plugin`` client, hands each GPU pod over (the device plugin's receipt) once it is bound; with a
    ``kubelet`` client, writes every bound pod's first status as the kubelet does once it admitted it (which
    opens a node's gate); with a ``binder``, gives it each pod of case W the first time it is seen unbound."""

    core: CoreV1Api
    plugin: CoreV1Api | None
    since: str
    kubelet: CoreV1Api | None = None
    binder: HandBinder | None = None
    given: set[str] = field(default_factory=set)
    bound: dict[str, float] = field(default_factory=dict)
    failures: list[BaseException] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)
        self.hands = ThreadPoolExecutor(HANDS, thread_name_prefix="bench-receipts")
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=15)
        self.hands.shutdown(wait=True)

    def _run(self) -> None:
        version = self.since
        try:
            while not self.done.is_set():
                for pod in self._events(version):
                    version = pod["metadata"]["resourceVersion"]
                    self._seen(pod, time.monotonic())
        except Exception as exc:  # reported with the case
            self.failures.append(exc)

    def _events(self, version: str) -> Iterator[dict[str, Any]]:
        response = self.core.list_namespaced_pod(NAMESPACE, watch=True, resource_version=version, timeout_seconds=2,
                                                 _preload_content=False, _request_timeout=15)  # fmt: skip
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                event = json.loads(line)
                if event["type"] in ("ADDED", "MODIFIED"):
                    yield event["object"]
        finally:
            response.release_conn()

    def _seen(self, pod: dict[str, Any], now: float) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        node = spec.get("nodeName")
        if not node and self.binder is not None and spec.get("schedulerName") == BY_HAND:
            if meta["name"] not in self.given:
                self.given.add(meta["name"])
                self.binder.give(pod)
            return
        if not node or meta["name"] in self.bound:
            return
        self.bound[meta["name"]] = now
        if self.kubelet is not None:
            self.hands.submit(self._admit, meta["name"])
        if self.plugin is not None and allocation.KEY in (meta.get("annotations") or {}):
            containers = [c["name"] for c in spec["containers"]]
            self.hands.submit(self._hand_over, meta["name"], receipt_patch(meta["uid"], node, containers))

    def _admit(self, name: str) -> None:
        assert self.kubelet is not None
        status = {"status": {"startTime": rfc3339(time.time()), "phase": "Pending"}}
        try:
            drained(self.kubelet.patch_namespaced_pod_status(name, NAMESPACE, status, _preload_content=False))
        except Exception as exc:
            self.failures.append(exc)

    def _hand_over(self, name: str, body: dict[str, Any]) -> None:
        assert self.plugin is not None
        try:
            drained(self.plugin.patch_namespaced_pod(name, NAMESPACE, body, _preload_content=False))
        except Exception as exc:
            self.failures.append(exc)


@dataclass(frozen=True)
class Result:
    case: str
    pods: int
    bound: int
    seconds: float
    cpu_ms_per_pod: dict[str, float]
    binds: dict[str, float]
    calls: dict[str, float]  # what kube-apiserver served per pod (api_calls.py)

    @property
    def rate(self) -> float | None:
        return self.pods / self.seconds if self.bound == self.pods else None


class Bench:
    def __init__(
        self, cluster: Cluster, receipts: bool, w_without: frozenset[str] = frozenset(), admit: bool = False
    ) -> None:
        assert cluster.cp is not None
        self.cluster = cluster
        self.admin = api_client(str(cluster.cp.kubeconfig("admin")), pool_size=CREATORS + 2)
        self.plugin = api_client(str(cluster.kubeconfigs["device-plugin"]), pool_size=HANDS + 2)
        self.core = CoreV1Api(self.admin)
        self.receipts = receipts
        self.admit = admit
        self.w_without = w_without
        self.nodes = 0
        cluster.namespace(NAMESPACE)

    def grow(self, nodes: int) -> None:
        """Add kubelet-less 8×A100 nodes up to ``nodes``; wait until the extender has every inventory."""
        names = [f"bench-{i:05d}" for i in range(self.nodes, nodes)]
        add = lambda name: add_fake_node(self.admin, self.plugin, name, gpus(name, GPUS_PER_NODE), DEFAULT_POOL)  # noqa: E731
        with ThreadPoolExecutor(CREATORS) as pool:
            list(pool.map(add, names))
        self.nodes = nodes
        deadline = time.monotonic() + 120
        while self._extender_nodes() < nodes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the extender saw {self._extender_nodes()} of {nodes} nodes after 120 s")
            time.sleep(0.5)
        print(f"{nodes} nodes ready", flush=True)

    def _metrics(self) -> list[str]:
        url = f"http://127.0.0.1:{self.cluster.extender_public_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return str(answer.read().decode()).splitlines()

    def _extender_nodes(self) -> int:
        capacity = ("tf_extender_node_tflops{", 'kind="capacity"')
        return sum(1 for line in self._metrics() if line.startswith(capacity[0]) and capacity[1] in line)

    def _counts(self) -> dict[str, float]:
        """The extender's bind outcomes and what its filter passed, by label (``bound``, ``passed one``, ...)."""
        counters = {'tf_extender_binds_total{result="': "", 'tf_extender_filter_passes_total{passed="': "passed "}
        found = {}
        for line in self._metrics():
            for prefix, shown in counters.items():
                if line.startswith(prefix):
                    label, value = line[len(prefix) :].split('"} ')
                    found[shown + label] = float(value)
        return found

    def _cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process of the cluster named in PROCESSES, and of this one (``bench``:
        creating pods, watching, writing receipts, case W's binds)."""
        own = os.times()
        seconds = {"bench": own.user + own.system}
        for proc in self.cluster.all_procs():
            if proc.name in PROCESSES and proc.alive():
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                seconds[proc.name] = (int(fields[11]) + int(fields[12])) / TICKS
        return seconds

    def _admin_get(self, url: str, timeout: float) -> bytes:
        """GET ``url`` of a control-plane process with the admin's token (the e2e control plane delegates
        kube-scheduler's authentication to the API server), trusting its self-signed certificate on loopback."""
        cp = self.cluster.cp
        assert cp is not None
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {cp.identities['admin'].token}"})
        with urllib.request.urlopen(request, timeout=timeout, context=ssl._create_unverified_context()) as answer:
            return bytes(answer.read())

    def _api_counts(self) -> dict[str, float]:
        """kube-apiserver's request, watch-event and webhook-call counters so far (api_calls.py)."""
        assert self.cluster.cp is not None
        return api_calls.counts(self._admin_get(f"{self.cluster.cp.server}/metrics", CALL_TIMEOUT).decode())

    def profile(self, seconds: int, prefix: str) -> list[threading.Thread]:
        """Fetch the CPU profiles of kube-apiserver and kube-scheduler over the next ``seconds`` into
        ``<process>-<prefix>.pprof`` in the working directory (their pprof endpoints, ``_admin_get``), each in a
        thread."""
        cp = self.cluster.cp
        assert cp is not None and cp.scheduler is not None
        threads = []
        for name, base in (("kube-apiserver", cp.server), ("kube-scheduler", f"https://127.0.0.1:{cp.scheduler.port}")):
            out = Path(f"{name}-{prefix}.pprof").resolve()

            def fetch(url: str = f"{base}/debug/pprof/profile?seconds={seconds}", out: Path = out) -> None:
                out.write_bytes(self._admin_get(url, seconds + 30))
                print(f"CPU profile: {out} (go tool pprof -top {out})", flush=True)

            threads.append(threading.Thread(target=fetch, name=f"bench-pprof-{name}", daemon=True))
            threads[-1].start()
        return threads

    def run(
        self, case: str, build: Callable[[str, int], dict[str, Any]], pods: int, profile: tuple[int, str] | None = None
    ) -> Result:
        names = [f"{case.lower()}-{i:05d}" for i in range(pods)]
        since = self.core.list_namespaced_pod(NAMESPACE).metadata.resource_version
        binder = None
        if case == "W":
            extender = api_client(str(self.cluster.kubeconfigs["extender"]), pool_size=CREATORS + 2)
            binder = HandBinder(KubernetesGateway(extender), self.nodes, self.w_without, deploy.system_namespace())
        plugin = CoreV1Api(self.plugin) if self.receipts else None
        kubelet = CoreV1Api(self.admin) if self.admit else None
        recorder = Recorder(self.core, plugin, since, binder=binder, kubelet=kubelet)
        cpu, binds, calls = self._cpu(), self._counts(), self._api_counts()

        def create(i: int) -> None:
            drained(self.core.create_namespaced_pod(NAMESPACE, build(names[i], i), _preload_content=False))

        profiling = [] if profile is None else self.profile(*profile)
        started = time.monotonic()
        with ThreadPoolExecutor(CREATORS) as pool:
            list(pool.map(create, range(pods)))
        failures = lambda: recorder.failures + (binder.failures if binder is not None else [])  # noqa: E731
        while len(recorder.bound) < pods and time.monotonic() - started < BOUND_TIMEOUT and not failures():
            time.sleep(0.1)
        recorder.stop()
        if binder is not None:
            binder.stop()
        for thread in profiling:
            thread.join()
        if failures():
            raise RuntimeError(f"case {case}: {failures()[0]!r}")
        seconds = max(recorder.bound.values(), default=started) - started
        after, binds_after, calls_after = self._cpu(), self._counts(), self._api_counts()
        per_pod = {name: round((after[name] - cpu.get(name, 0)) * 1000 / pods, 1) for name in after}
        outcome = {k: v - binds.get(k, 0) for k, v in binds_after.items() if v - binds.get(k, 0)}
        emptied(self.core, NAMESPACE)
        time.sleep(2)  # the extender's and the scheduler's caches see the deletions
        calls_per_pod = api_calls.per_pod(calls, calls_after, pods)
        return Result(case, pods, len(recorder.bound), seconds, per_pod, outcome, calls_per_pod)


def ratio(part: float | None, whole: float | None) -> str:
    return f"{part / whole:.2f}" if part and whole else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", default="200,1000", help="node counts, ascending (default 200,1000)")
    parser.add_argument("--pods", type=int, default=500, help="pods per case (default 500)")
    parser.add_argument("--qps", type=float, default=1000, help="kube-scheduler's client QPS (default 1000)")
    parser.add_argument("--burst", type=int, default=2000, help="kube-scheduler's client burst (default 2000)")
    parser.add_argument("--shipped-qps", action="store_true", help="kube-scheduler's client QPS/burst as shipped")
    parser.add_argument("--receipts", action="store_true", help="write the device plugin's receipt on bound pods")
    parser.add_argument("--admit", action="store_true", help="write every bound pod's first status, as its kubelet")
    parser.add_argument("--profile", type=int, default=0, metavar="SECONDS",
                        help="profile kube-apiserver's and kube-scheduler's CPU for SECONDS of each run's cases, "
                             "into the working directory")  # fmt: skip
    parser.add_argument("--policy", default="binpack", help="placement policy of the GPU pods (default binpack)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each case per node count (default 1)")
    parser.add_argument("--cases", default="BWAC", help="which cases, in order (default BWAC)")
    parser.add_argument("--w-without", default="", help=f"case W's calls to leave out, of {', '.join(LEAVABLE)}")
    args = parser.parse_args()
    w_without = frozenset(c for c in args.w_without.split(",") if c)
    if not w_without <= set(LEAVABLE):
        parser.error(f"--w-without {args.w_without!r}: each must be one of {', '.join(LEAVABLE)}")
    counts = sorted(int(n) for n in args.nodes.split(","))
    client = None if args.shipped_qps else (args.qps, args.burst)
    qps = "shipped" if client is None else f"{args.qps:g}/{args.burst}"
    print(f"hardware: {describe()}")
    print(f"kube-scheduler client QPS/burst {qps}; {args.pods} pods per case; receipts {args.receipts}; "
          f"kubelet status {args.admit}; policy {args.policy}; "
          f"W without {', '.join(sorted(w_without)) or 'nothing'}")  # fmt: skip
    builders = cases(args.policy)
    rows = []
    with Cluster(gpus=(), kubelet=False, scheduler_client=client) as cluster:
        bench = Bench(cluster, args.receipts, w_without, args.admit)
        for nodes in counts:
            bench.grow(nodes)
            for case in args.cases:  # warm-up, not reported: first calls, connections, the memo's first keys
                bench.run(case, builders[case], WARM_UP)
            for run in range(1, args.runs + 1):
                results = {}
                for case in args.cases:
                    wanted = (args.profile, f"{case}-{nodes}-{run}") if args.profile else None
                    results[case] = bench.run(case, builders[case], args.pods, wanted)
                for r in results.values():
                    rate = f"{r.rate:.0f} pods/s" if r.rate else f"unfinished: {r.bound}/{r.pods} bound"
                    print(f"{nodes} nodes run {run} {r.case}: {rate} ({r.seconds:.1f} s); CPU ms/pod "
                          f"{r.cpu_ms_per_pod}; extender {r.binds}", flush=True)  # fmt: skip
                    print(f"{nodes} nodes run {run} {r.case}: API per pod {r.calls}", flush=True)
                    if r.case != "B" and "B" in results:
                        extra = api_calls.beyond(r.calls, results["B"].calls)
                        print(f"{nodes} nodes run {run} {r.case}: API per pod beyond B {extra}", flush=True)
                rates = {case: r.rate for case, r in results.items()}
                rows.append((nodes, run, rates))
    against_b = [c for c in args.cases if c != "B"]
    print(f"\n| nodes | QPS/burst | receipts | run | {' | '.join(f'{c} pods/s' for c in args.cases)} | "
          f"{' | '.join(f'{c}/B' for c in against_b)} |")  # fmt: skip
    print(f"|---|---|---|---|{'---|' * (len(args.cases) + len(against_b))}")
    for nodes, run, rates in rows:
        cells = " | ".join(f"{rates[c]:.0f}" if rates[c] else "-" for c in args.cases)
        ratios = " | ".join(ratio(rates.get(c), rates.get("B")) for c in against_b)
        print(f"| {nodes:,} | {qps} | {'yes' if args.receipts else 'no'} | {run} | {cells} | {ratios} |")


if __name__ == "__main__":
    main()
