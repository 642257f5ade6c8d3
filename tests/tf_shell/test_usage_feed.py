"""The plugins are found through their Service's EndpointSlices; a pass asks each once; a plugin that does not
answer, or answers no usage document, is skipped and counted, its node's last samples kept until stale;
a plugin gone from the endpoints is dropped at once. The real fetcher against a real HTTP server."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from tests.vgpu.usage_builders import node_usage, used
from tf_metrics.samples import SamplePoller
from tf_shell.kube.api import GatewayError
from tf_shell.usage_feed import FetchError, HttpFetcher, Target, UsageFeed, targets
from vgpu.contract import usage
from vgpu.usage_samples import node_samples


def endpoint_slice(*endpoints: dict[str, object], port: int = 9400, name: str = "metrics") -> dict[str, object]:
    return {
        "addressType": "IPv4",
        "endpoints": list(endpoints),
        "ports": [{"name": name, "port": port, "protocol": "TCP"}],
    }


def test_targets_are_the_ready_endpoints_at_the_named_port() -> None:
    slices = [
        endpoint_slice(
            {"addresses": ["10.0.1.5"], "conditions": {"ready": True}, "nodeName": "gpu-1"},
            {"addresses": ["10.0.2.7"], "conditions": {"ready": False}, "nodeName": "gpu-2"},
            {"addresses": ["10.0.3.9"], "nodeName": "gpu-3"},
        ),
        {
            "addressType": "IPv6",
            "endpoints": [{"addresses": ["fd00::4"], "nodeName": "gpu-4"}],
            "ports": [{"name": "metrics", "port": 9400}],
        },
        endpoint_slice({"addresses": ["10.0.5.1"], "nodeName": "gpu-5"}, name="other"),
        endpoint_slice({"addresses": ["10.0.6.1"]}),  # no nodeName: named by its address
    ]
    assert targets(slices, "metrics") == [
        Target("10.0.6.1", "http://10.0.6.1:9400/usage"),
        Target("gpu-1", "http://10.0.1.5:9400/usage"),
        Target("gpu-3", "http://10.0.3.9:9400/usage"),
        Target("gpu-4", "http://[fd00::4]:9400/usage"),
    ]


class Plugins:
    """Fake plugins by URL: a usage document, or the FetchError they fail with."""

    def __init__(self) -> None:
        self.found = [Target("n1", "http://n1/usage"), Target("n2", "http://n2/usage")]
        self.answers: dict[str, bytes | FetchError] = {
            "http://n1/usage": usage.encode(node_usage("n1", used("a"))).encode(),
            "http://n2/usage": usage.encode(node_usage("n2", used("b"))).encode(),
        }
        self.listing_fails = False

    def find(self) -> list[Target]:
        if self.listing_fails:
            raise GatewayError("list endpointslices: HTTP 403 Forbidden", 403)
        return list(self.found)

    def fetch(self, url: str) -> bytes:
        answer = self.answers[url]
        if isinstance(answer, FetchError):
            raise answer
        return answer


@pytest.fixture
def plugins() -> Plugins:
    return Plugins()


def collector(plugins: Plugins) -> tuple[SamplePoller, CollectorRegistry]:
    """The feed as tf-metrics reads it: each plugin's document digested into samples, one snapshot per pass."""
    registry = CollectorRegistry()
    return SamplePoller(UsageFeed(plugins.find, plugins.fetch, 4, registry, node_samples)), registry


def fetches(registry: CollectorRegistry, result: str) -> float:
    return registry.get_sample_value("tf_metrics_plugin_fetches_total", {"result": result}) or 0.0


def test_a_pass_holds_every_answering_plugins_samples(plugins: Plugins) -> None:
    c, registry = collector(plugins)
    c.poll()
    assert set(c.snapshot.pods) == {("team-a", "a"), ("team-a", "b")} and set(c.snapshot.nodes) == {"n1", "n2"}
    assert c.polls == 1 and fetches(registry, "ok") == 2
    assert registry.get_sample_value("tf_metrics_plugins", {"state": "answered"}) == 2


def test_a_plugin_that_fails_is_counted_and_its_last_samples_kept_until_stale(plugins: Plugins) -> None:
    c, registry = collector(plugins)
    c.poll()
    plugins.answers["http://n2/usage"] = FetchError("timeout", "no answer within 2s")
    c.poll()
    assert ("team-a", "b") in c.snapshot.pods  # samples.fresh decides when they go
    assert fetches(registry, "timeout") == 1
    assert registry.get_sample_value("tf_metrics_plugins", {"state": "failed"}) == 1


def test_an_answer_that_is_no_usage_document_is_counted_as_invalid(plugins: Plugins) -> None:
    plugins.answers["http://n1/usage"] = b'{"version": "v9"}'
    plugins.answers["http://n2/usage"] = b"\xff\xfe"
    c, registry = collector(plugins)
    c.poll()
    assert fetches(registry, "invalid") == 2 and c.snapshot.pods == {}


def test_a_plugin_gone_from_the_endpoints_is_dropped_at_once(plugins: Plugins) -> None:
    c, _ = collector(plugins)
    c.poll()
    plugins.found = plugins.found[:1]
    c.poll()
    assert set(c.snapshot.nodes) == {"n1"}


def test_when_the_plugins_cannot_be_listed_the_held_samples_stay(plugins: Plugins) -> None:
    c, registry = collector(plugins)
    c.poll()
    plugins.listing_fails = True
    c.poll()
    assert set(c.snapshot.nodes) == {"n1", "n2"} and c.polls == 1
    assert fetches(registry, "discovery-failed") == 1


SEEN: list[str | None] = []  # each request's Authorization header


@pytest.fixture
def server() -> Iterator[Callable[[int, bytes], str]]:
    """A URL answering the status and body given to it."""
    answer: dict[str, tuple[int, bytes]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            SEEN.append(self.headers["Authorization"])
            status, body = answer["reply"]
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()

    def serve(status: int, body: bytes) -> str:
        answer["reply"] = (status, body)
        return f"http://127.0.0.1:{httpd.server_address[1]}/usage"

    yield serve
    httpd.shutdown()
    httpd.server_close()


def test_the_http_fetcher_reads_a_body_and_names_each_failure(server: Callable[[int, bytes], str]) -> None:
    fetch = HttpFetcher(2.0)
    try:
        assert fetch(server(200, b"{}")) == b"{}"
        with pytest.raises(FetchError) as failed:
            fetch(server(503, b"no sample yet"))
        assert failed.value.reason == "http-error" and "HTTP 503" in str(failed.value)
        with pytest.raises(FetchError) as failed:
            fetch("http://127.0.0.1:1/usage")
        assert failed.value.reason == "unreachable"
    finally:
        fetch.close()


def test_the_http_fetcher_shows_the_plugins_its_programs_identity(server: Callable[[int, bytes], str]) -> None:
    token = ["Bearer first"]
    fetch, anonymous = HttpFetcher(2.0, lambda: token[0]), HttpFetcher(2.0)
    try:
        SEEN.clear()
        fetch(server(200, b"{}"))
        token[0] = "Bearer rotated"  # a ServiceAccount token the client re-read
        fetch(server(200, b"{}"))
        anonymous(server(200, b"{}"))
        assert SEEN == ["Bearer first", "Bearer rotated", None]
    finally:
        fetch.close()
        anonymous.close()
