"""The usage feed from the device plugins: polls every plugin's ``GET /usage`` and holds its newest document.

Two programs read it: tf-metrics (per-pod samples for the custom metrics API) and the extender's
autoscaler (the documents themselves); each passes the ``digest`` it needs, made once per document.
The plugins are found through the EndpointSlices of their metrics Service, and each pass asks them
all at once. A plugin that fails is skipped and counted, and its last good document stays until it
is stale (``vgpu.usage_samples.fresh``), so one slow answer does not blank an autoscaler's input.
Discovery, failures and staleness: docs/metrics.md, section "Where the usage figures come from".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import urllib3
from prometheus_client import CollectorRegistry, Counter, Gauge
from urllib3.exceptions import HTTPError, NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from tf_shell.kube.api import GatewayError
from vgpu.contract import usage
from vgpu.metric_names import METRICS_API

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Target:
    """One plugin: the node it runs on (as its endpoint says) and its ``/usage`` URL."""

    node: str
    url: str


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


class UsageFeed(Generic[T]):
    """One pass (:meth:`poll`) asks every target; :meth:`held` is the digest of each plugin's last good document."""

    def __init__(
        self,
        find: Callable[[], list[Target]],
        fetch: Callable[[str], bytes],
        workers: int,
        registry: CollectorRegistry,
        digest: Callable[[usage.NodeUsage], T],
        prefix: str = METRICS_API,
    ) -> None:
        """``find`` lists the plugins (GatewayError when it cannot); ``fetch`` reads one URL's body (FetchError);
        ``digest`` makes what is held of a document (ValueError: the document is invalid); ``prefix`` starts the
        names of its own metrics (the program's: tf-metrics', or the extender's autoscaler)."""
        self._find, self._fetch, self._digest = find, fetch, digest
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="usage-fetch")
        self._held: dict[str, T] = {}  # by target URL
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
        self.polls += 1

    def held(self) -> list[T]:
        """The digest of every plugin's last good document (those of the last pass that found the plugins)."""
        return list(self._held.values())

    def _one(self, target: Target) -> T | FetchError:
        try:
            body = self._fetch(target.url)
            return self._digest(usage.decode(body.decode("utf-8")))
        except FetchError as exc:
            return exc
        except ValueError as exc:  # a DomainError (the contract), a bad time, a UnicodeDecodeError
            return FetchError("invalid", f"not a usage document: {exc}")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class HttpFetcher:
    """``fetch`` over one urllib3 pool (thread-safe), without retries: the next pass is the retry. Each request
    carries ``authorization()``'s header where it gives one: the plugins authorise ``/usage`` readers off
    loopback (tf_shell.access), and our programs show them the identity they show the API server."""

    def __init__(self, timeout_s: float, authorization: Callable[[], str | None] = lambda: None) -> None:
        self._timeout, self._authorization = timeout_s, authorization
        self._pool = urllib3.PoolManager(
            num_pools=64, maxsize=4, retries=False, timeout=urllib3.Timeout(total=timeout_s)
        )

    def __call__(self, url: str) -> bytes:
        try:
            header = self._authorization()
            headers = {"Accept": "application/json"} | ({"Authorization": header} if header else {})
            response = self._pool.request("GET", url, headers=headers)
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
