"""``tf-metrics``: serve the custom metrics API for GPU pods, as an aggregated API server (HTTPS).

Flags override the ``TF_METRICS_*`` environment (``settings.py``; ``--help`` lists both). At start it
reads the API server's front-proxy configuration (``auth``), and stops with one line when there is
none: without the aggregation layer nothing can reach it. It then polls the device plugins
(``collector``) from a thread and serves (``app``) with uvicorn: TLS with its serving certificate
(renewals served without a restart, as the webhook's), client certificates verified against the
requestheader client CA but not required, so the kubelet's probes need none. A rotated front-proxy
CA takes a restart (``kubectl rollout restart``): the API server rotates it only with its own.

    tf-metrics --kubeconfig ~/.kube/config --tls-cert-file tls.crt --tls-key-file tls.key
"""

from __future__ import annotations

import gc
import logging
import ssl
from collections.abc import Sequence
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from tf_metrics.app import create_app
from tf_metrics.auth import CONFIG_NAME, CONFIG_NAMESPACE, FrontProxy, front_proxy
from tf_metrics.peer import PeerCertProtocol
from tf_metrics.samples import SamplePoller
from tf_metrics.settings import MetricsSettings
from tf_shell import settings_cli
from tf_shell.kube.api import GatewayError
from tf_shell.kube.client import own_namespace
from tf_shell.kube.reads import MetricsCluster
from tf_shell.kube.reviews import authorization_header
from tf_shell.logfmt import formatter
from tf_shell.periodic import Periodic
from tf_shell.serving import KEEP_ALIVE_S
from tf_shell.tls import CertReloader
from tf_shell.usage_feed import HttpFetcher, UsageFeed, targets
from vgpu.usage_samples import node_samples

PROG = "tf-metrics"


def settings_from(argv: Sequence[str] | None = None) -> MetricsSettings:
    """Settings from the ``TF_METRICS_*`` environment, overridden by the flags given."""
    return settings_cli.settings_from(
        MetricsSettings,
        PROG,
        "The custom metrics API (custom.metrics.k8s.io) of GPU pods, from the device plugins' GET /usage, "
        "served to the API server's aggregation layer.",
        argv,
    )


def server_context(cert: Path, key: Path, client_ca: str) -> ssl.SSLContext:
    """Serves ``cert``; verifies a client certificate against ``client_ca`` when one is offered."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.load_verify_locations(cadata=client_ca)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


def serving(app: FastAPI, host: str, port: int, context: ssl.SSLContext, log_level: str) -> uvicorn.Config:
    """uvicorn's configuration for ``app``: TLS on ``context``, each request's scope given the client
    certificate's CN (PeerCertProtocol)."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=PeerCertProtocol,
        log_level=log_level,
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    config.load()
    config.ssl = context  # after load(): uvicorn's own context cannot take a CA from memory
    return config


def main(argv: Sequence[str] | None = None) -> None:
    settings = settings_from(argv)
    logging.basicConfig(level=settings.log_level.upper())
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter(settings.log_format))
    try:
        cluster = MetricsCluster.connect(settings.kubeconfig)
    except GatewayError as exc:
        raise SystemExit(f"{PROG}: {exc}") from None
    proxy = _front_proxy(cluster)
    try:
        context = server_context(settings.tls_cert_file, settings.tls_key_file, proxy.client_ca)
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(f"{PROG}: cannot serve --tls-cert-file {settings.tls_cert_file} / --tls-key-file "
                         f"{settings.tls_key_file} with the front proxy's CA: {exc}") from None  # fmt: skip

    namespace = settings.plugin_namespace or own_namespace()
    registry = CollectorRegistry()
    fetcher = HttpFetcher(settings.fetch_timeout, lambda: authorization_header(cluster.api))
    collector = SamplePoller(
        UsageFeed(
            lambda: targets(cluster.endpoint_slices(namespace, settings.plugin_service), settings.plugin_port_name),
            fetcher,
            settings.fetch_workers,
            registry,
            node_samples,
        )
    )
    app = create_app(
        proxy=proxy,
        samples=lambda: collector.snapshot,
        cluster=cluster,
        ready=lambda: collector.polls > 0,
        registry=registry,
        ttl=settings.authorization_ttl,
    )
    config = serving(app, settings.host, settings.port, context, settings.log_level.lower())
    reloader = CertReloader(
        context,
        settings.tls_cert_file,
        settings.tls_key_file,
        lambda cert, key: server_context(cert, key, proxy.client_ca),
        PROG,
    )
    background = [
        Periodic("usage-poll", settings.interval, collector.poll, immediately=True),
        Periodic("metrics-api-tls-reload", settings.tls_reload_s, reloader.check),
    ]
    # What start built (imported modules, the client, the app) leaves the collector's generations: a full
    # collection then walks the samples only, not some 80,000 objects of code. Those walks were the p99 of a
    # 1,000-pod answer: 40 ms without this, under 10 ms with it (benchmarks/metrics_api_latency.py).
    gc.freeze()
    for task in background:
        task.start()
    try:
        uvicorn.Server(config).run()
    finally:
        for task in background:
            task.stop()
        collector.close()
        fetcher.close()


def _front_proxy(cluster: MetricsCluster) -> FrontProxy:
    where = f"{CONFIG_NAMESPACE}/{CONFIG_NAME}"
    try:
        published = cluster.config_map(CONFIG_NAMESPACE, CONFIG_NAME)
    except GatewayError as exc:
        hint = {
            403: " (is the Role extension-apiserver-authentication-reader bound to it?)",
            404: " (the API server publishes it once its aggregation layer is configured)",
        }.get(exc.status or 0, "")
        raise SystemExit(f"{PROG}: cannot read the front-proxy configuration {where}: {exc}{hint}") from None
    try:
        return front_proxy(published.get("data") or {})
    except ValueError as exc:
        raise SystemExit(f"{PROG}: {exc}") from None


if __name__ == "__main__":
    main()
