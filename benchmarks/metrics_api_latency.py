"""tf-metrics' latency at 1,000 GPU pods, over real HTTPS as the API server's aggregator asks it.

Runs tf-metrics' own pieces in this process: its collector makes one pass over fake device plugins
(``--pods`` pods, 8 per node, one container each, in 10 namespaces: each plugin's ``/usage`` document
encoded as a plugin sends it, decoded and aggregated as tf-metrics does), and its app is served by
uvicorn with its TLS context and peer-certificate protocol, as ``tf-metrics`` serves it. A fake API
server allows every SubjectAccessReview (the verdict is cached for the TTL in any case). One keep-alive
client with the front proxy's client certificate and user headers then times, each ``--rounds`` times,
while the collector makes a pass every ``--interval`` seconds (1; tf-metrics' default is 5):

* the seed's query over every namespace (``/apis/custom.metrics.k8s.io/v1beta1/namespaces/*/pods/*/
  gpu_utilization``: every pod, the worst case);
* one namespace's pods (what an HPA asks, less its label selector's pod list at the API server);
* one named pod;

and reports p50/p99 per query, the collector's CPU per pass over the plugins' documents, and the
hardware. The API server's own proxying (in a cluster: one more TLS hop) is not in the figures.

    .venv/bin/python -m benchmarks.metrics_api_latency [--pods 1000] [--rounds 500] [--interval 1]
"""

from __future__ import annotations

import argparse
import gc
import http.client
import os
import platform
import socket
import ssl
import statistics
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from prometheus_client import CollectorRegistry

from tests.e2e.pki import make_pki
from tests.tf_metrics.test_app import FakeCluster
from tests.tf_metrics.test_auth import PUBLISHED
from tests.vgpu.usage_builders import node_usage, used
from tf_metrics.app import create_app
from tf_metrics.auth import front_proxy
from tf_metrics.main import server_context, serving
from tf_metrics.samples import SamplePoller
from tf_shell.periodic import Periodic
from tf_shell.usage_feed import Target, UsageFeed
from vgpu.contract import usage
from vgpu.usage_samples import node_samples

PODS_PER_NODE, NAMESPACES = 8, 10
HEADERS = {"X-Remote-User": "system:serviceaccount:kube-system:horizontal-pod-autoscaler", "Accept": "application/json"}


def plugins(pods: int, at: float) -> dict[str, bytes]:
    """Each fake plugin's ``/usage`` body by URL: pod ``i`` in namespace ``ns-<i % 10>`` on node ``i // 8``."""
    docs: dict[str, list[usage.ContainerUsage]] = {}
    for i in range(pods):
        node = f"gpu-node-{i // PODS_PER_NODE:04d}"
        docs.setdefault(node, []).append(
            used(f"pod-{i:05d}", namespace=f"ns-{i % NAMESPACES}", gpu=f"GPU-{i % PODS_PER_NODE}", tflops=i % 40_000)
        )
    return {f"http://{node}/usage": usage.encode(node_usage(node, *c, at=at)).encode() for node, c in docs.items()}


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench(pods: int, rounds: int, interval_s: float) -> None:
    bodies = plugins(pods, time.time())
    found = [Target(url.split("/")[2], url) for url in bodies]
    timed = SamplePoller(UsageFeed(lambda: found, bodies.__getitem__, 32, CollectorRegistry(), node_samples))
    cpu, passes = time.process_time(), 20
    for _ in range(passes):
        timed.poll()
    pass_ms = (time.process_time() - cpu) / passes * 1000
    timed.close()

    with tempfile.TemporaryDirectory() as tmp:
        pki = make_pki(Path(tmp))
        proxy = front_proxy({**PUBLISHED, "requestheader-client-ca-file": pki.front_proxy_ca.read_text()})
        collector = SamplePoller(UsageFeed(lambda: found, bodies.__getitem__, 32, CollectorRegistry(), node_samples))
        app = create_app(proxy=proxy, samples=lambda: collector.snapshot, cluster=FakeCluster(), ready=lambda: True,
                         registry=CollectorRegistry())  # fmt: skip
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        cert, key = pki.serving_pair("apiserver")
        server = uvicorn.Server(serving(app, "127.0.0.1", port, server_context(cert, key, proxy.client_ca), "warning"))
        poller = Periodic("usage-poll", interval_s, collector.poll, immediately=True)
        gc.freeze()  # where tf-metrics' main does: after start, before the first pass
        poller.start()
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not (server.started and collector.polls):
            time.sleep(0.01)
        assert len(collector.snapshot.pods) == pods, "every pod sampled"
        context = ssl.create_default_context(cafile=str(pki.ca_crt))
        context.load_cert_chain(*pki.front_proxy_client)
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context)
        api = "/apis/custom.metrics.k8s.io/v1beta1/namespaces"
        queries = {
            f"every namespace ({pods} pods)": f"{api}/*/pods/*/gpu_utilization",
            f"one namespace ({pods // NAMESPACES} pods)": f"{api}/ns-3/pods/*/gpu_utilization",
            "one named pod": f"{api}/ns-3/pods/pod-00003/gpu_utilization",
        }
        print(f"tf-metrics, {pods} pods on {len(bodies)} nodes, {rounds} rounds per query, over HTTPS (keep-alive), "
              f"a collector pass every {interval_s:g} s meanwhile")  # fmt: skip
        for label, path in queries.items():
            times = []
            for _ in range(rounds + 20):
                start = time.perf_counter()
                conn.request("GET", path, headers=HEADERS)
                answer = conn.getresponse()
                body = answer.read()
                times.append(time.perf_counter() - start)
                assert answer.status == 200, body[:200]
            times = times[20:]  # warm-up
            p50, p99 = percentile(times, 0.5) * 1000, percentile(times, 0.99) * 1000
            print(f"  {label:<26} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  mean {statistics.mean(times) * 1000:7.2f} ms"
                  f"  ({len(body):,} bytes)")  # fmt: skip
        conn.close()
        server.should_exit = True
        thread.join(10)
        poller.stop()
        collector.close()
    print(f"collector pass over {len(bodies)} usage documents: {pass_ms:.2f} ms CPU (decode, aggregate, swap)")
    cpu_name = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "")
    print(f"hardware: {cpu_name or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=500)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between collector passes (tf-metrics: 5)")
    args = p.parse_args()
    bench(args.pods, args.rounds, args.interval)


if __name__ == "__main__":
    main()
