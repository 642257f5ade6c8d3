"""``tf-webhook``: serve the mutating admission webhook over TLS.

Flags override the ``TF_WEBHOOK_*`` environment (see ``settings.py``); the API server only calls
webhooks over HTTPS, so the certificate and key are required, and a renewed pair is served without a
restart (``tls.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import ssl
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

import uvicorn
from pydantic import ValidationError
from uvicorn.config import create_ssl_context

from scheduler_extender.periodic import Periodic
from scheduler_extender.webhook.app import MUTATE_PATH, create_app
from scheduler_extender.webhook.settings import WebhookSettings
from scheduler_extender.webhook.tls import CertReloader
from vgpu.logfmt import LogFormat, formatter
from vgpu.names import DISTRIBUTION


def parse_args(argv: Sequence[str] | None = None) -> WebhookSettings:
    parser = argparse.ArgumentParser(
        prog="tf-webhook", description=f"TensorFusion-style GPU admission webhook (POST {MUTATE_PATH})"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version(DISTRIBUTION)}")
    parser.add_argument("--host", help="listen address (TF_WEBHOOK_HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="HTTPS port (TF_WEBHOOK_PORT, default 9443)")
    parser.add_argument("--tls-cert-file", help="PEM certificate (TF_WEBHOOK_TLS_CERT_FILE)")
    parser.add_argument("--tls-key-file", help="PEM private key (TF_WEBHOOK_TLS_KEY_FILE)")
    parser.add_argument(
        "--tls-reload-s",
        type=float,
        help="seconds between checks of the certificate and key for a renewal, served without a restart "
        "(TF_WEBHOOK_TLS_RELOAD_S, default 10)",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file; default in-cluster (TF_WEBHOOK_KUBECONFIG)")
    parser.add_argument("--kube-timeout-s", type=float, help="per API call timeout (TF_WEBHOOK_KUBE_TIMEOUT_S)")
    parser.add_argument("--log-level", help="uvicorn/python log level (TF_WEBHOOK_LOG_LEVEL, default info)")
    parser.add_argument(
        "--log-format", choices=[f.value for f in LogFormat], help="text or json (TF_WEBHOOK_LOG_FORMAT, default text)"
    )
    parser.add_argument(
        "--gpu-tolerations",
        type=json.loads,
        help="JSON list of tolerations added to every GPU pod that lacks them (TF_WEBHOOK_GPU_TOLERATIONS, default "
        "the NVIDIA taint nvidia.com/gpu:NoSchedule; [] adds none)",
    )
    given = {key: value for key, value in vars(parser.parse_args(argv)).items() if value is not None}
    try:
        return WebhookSettings(**given)
    except ValidationError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_args(argv)
    logging.basicConfig(level=settings.log_level.upper())
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter(settings.log_format))
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        ssl_certfile=str(settings.tls_cert_file),
        ssl_keyfile=str(settings.tls_key_file),
        log_level=settings.log_level.lower(),
    )
    config.load()  # builds the SSLContext every handshake starts on; the reloader hands them to renewed ones
    assert config.ssl is not None

    def build(cert: Path, key: Path) -> ssl.SSLContext:
        return create_ssl_context(
            cert, key, None, config.ssl_version, config.ssl_cert_reqs, config.ssl_ca_certs, config.ssl_ciphers
        )

    reloader = CertReloader(config.ssl, settings.tls_cert_file, settings.tls_key_file, build)
    watcher = Periodic("webhook-tls-reload", settings.tls_reload_s, reloader.check)
    watcher.start()
    try:
        uvicorn.Server(config).run()
    finally:
        watcher.stop()


if __name__ == "__main__":
    main()
