"""Polls every device plugin's ``GET /usage`` and keeps the newest samples; requests read them from memory.

Where the plugins are: the EndpointSlices of their metrics Service (the chart's headless
``<release>-device-plugin-metrics``), by the port's name: one address and node per plugin pod, as
Prometheus' ``endpointslice`` discovery finds them. That needs only ``list`` on EndpointSlices in
the release's namespace, and no port opened on the nodes (the plugins serve on their pod IPs).

Each pass asks every plugin at once (a bounded pool of threads, a timeout per plugin). A plugin
that does not answer, or answers something that is not a usage document, is skipped, logged and
counted by reason (``tf_metrics_plugin_fetches_total``); its node's last good samples stay until they
are stale (``samples.fresh``: two of its sampling intervals), so one slow answer does not blank an
autoscaler's input, and a dead plugin's pods lose their figures within two intervals. A node that
leaves the Service's endpoints is dropped at once. Serving never waits for a poll: a request reads
the last snapshot, swapped in whole at the end of each pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import urllib3
from prometheus_client import CollectorRegistry, Counter, Gauge
from urllib3.exceptions import HTTPError, NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from scheduler_extender.gateway import GatewayError
from scheduler_extender.metrics_api.samples import EMPTY, NodeSample, PodSample, Snapshot, node_samples, snapshot
from vgpu.contract import usage
from vgpu.metric_names import METRICS_API

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Target:
    """One plugin: the node it runs on (as its endpoint says) and its ``/usage`` URL."""

    node: str
    url: str


@dataclass(frozen=True, slots=True)
class Held:
    """A plugin's last good answer: the document, and its node's and pods' samples."""

    document: usage.NodeUsage
    node: NodeSample
    pods: list[PodSample]


class FetchError(Exception):
    """A plugin's answer could not be had or used; ``reason`` is the counter's label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def targets(slices: Sequence[Mapping[str, Any]], port_name: str) -> list[Target]:
    """The ``/usage`` URL of every endpoint not marked unready, at the port named ``port_name``."""
    found: dict[str, Target] = {}
    for piece in slices:
        ports = [p.get("port") for p in piece.get("ports") or () if p.get("name") == port_name]
        if not ports or not isinstance(ports[0], int):
            continue
        for endpoint in piece.get("endpoints") or ():
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            for address in (endpoint.get("addresses") or ())[:1]:
                host = f"[{address}]" if ":" in address else address
                url = f"http://{host}:{ports[0]}{usage.PATH}"
                found[url] = Target(str(endpoint.get("nodeName") or address), url)
    return sorted(found.values(), key=lambda t: (t.node, t.url))


class Collector:
    """One pass (:meth:`poll`) asks every target; :attr:`snapshot` is what the last passes found."""

    def __init__(
        self,
        find: Callable[[], list[Target]],
        fetch: Callable[[str], bytes],
        workers: int,
        registry: CollectorRegistry,
        prefix: str = METRICS_API,
    ) -> None:
        """``find`` lists the plugins (GatewayError when it cannot); ``fetch`` reads one URL's body (FetchError);
        ``prefix`` starts the names of its own metrics (the binary's: tf-metrics', or the extender's autoscaler)."""
        self._find, self._fetch = find, fetch
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="usage-fetch")
        self._held: dict[str, Held] = {}  # by target URL
        self.snapshot: Snapshot = EMPTY
        self.documents: tuple[usage.NodeUsage, ...] = ()  # the last good document of every plugin held
        self.polls = 0
        self.fetches = Counter(
            f"{prefix}_plugin_fetches", "GET /usage of a device plugin, by result.", ["result"], registry=registry
        )
        self.plugins = Gauge(
            f"{prefix}_plugins", "Device plugins found in the last pass, by whether they answered.", ["state"],
            registry=registry,
        )  # fmt: skip

    def poll(self) -> None:
        try:
            found = self._find()
        except GatewayError as exc:
            self.fetches.labels("discovery-failed").inc()
            log.warning("cannot list the device plugins (keeping the samples held until they are stale): %s", exc)
            return
        answers = list(self._pool.map(self._one, found))
        held = {t.url: self._held[t.url] for t in found if t.url in self._held}
        failed = 0
        for target, answer in zip(found, answers, strict=True):
            if isinstance(answer, FetchError):
                failed += 1
                self.fetches.labels(answer.reason).inc()
                log.warning("device plugin on %s (%s): %s", target.node, target.url, answer)
            else:
                self.fetches.labels("ok").inc()
                held[target.url] = answer
        self.plugins.labels("answered").set(len(found) - failed)
        self.plugins.labels("failed").set(failed)
        self._held = held
        self.snapshot = snapshot((h.node for h in held.values()), (pod for h in held.values() for pod in h.pods))
        self.documents = tuple(h.document for h in held.values())
        self.polls += 1

    def _one(self, target: Target) -> Held | FetchError:
        try:
            body = self._fetch(target.url)
            document = usage.decode(body.decode("utf-8"))
            return Held(document, *node_samples(document))
        except FetchError as exc:
            return exc
        except ValueError as exc:  # a DomainError (the contract), a bad time, a UnicodeDecodeError
            return FetchError("invalid", f"not a usage document: {exc}")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class HttpFetcher:
    """``fetch`` over one urllib3 pool (thread-safe), without retries: the next pass is the retry."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout = timeout_s
        self._pool = urllib3.PoolManager(
            num_pools=64, maxsize=4, retries=False, timeout=urllib3.Timeout(total=timeout_s)
        )

    def __call__(self, url: str) -> bytes:
        try:
            response = self._pool.request("GET", url, headers={"Accept": "application/json"})
        except NewConnectionError as exc:  # before the timeouts: urllib3 makes it one of them
            raise FetchError("unreachable", f"{exc.__class__.__name__}: {exc}") from None
        except Urllib3Timeout:
            raise FetchError("timeout", f"no answer within {self._timeout:g}s") from None
        except HTTPError as exc:
            raise FetchError("unreachable", f"{exc.__class__.__name__}: {exc}") from None
        if response.status != 200:
            raise FetchError("http-error", f"HTTP {response.status}: {response.data[:200]!r}")
        return bytes(response.data)

    def close(self) -> None:
        self._pool.clear()
