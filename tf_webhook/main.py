"""``tf-webhook``: serve the mutating admission webhook over TLS.

Flags override the ``TF_WEBHOOK_*`` environment (see ``settings.py``; ``--help`` lists both); the
API server only calls webhooks over HTTPS, so the certificate and key are required, and a renewed
pair is served without a restart (``tls.py``).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from pathlib import Path

import uvicorn
from uvicorn.config import create_ssl_context

from tf_shell import settings_cli
from tf_shell.logfmt import formatter
from tf_shell.periodic import Periodic
from tf_shell.serving import KEEP_ALIVE_S
from tf_shell.tls import CertReloader
from tf_webhook.app import MUTATE_PATH, create_app
from tf_webhook.settings import WebhookSettings


def settings_from(argv: Sequence[str] | None = None) -> WebhookSettings:
    """Settings from the ``TF_WEBHOOK_*`` environment, overridden by the flags given."""
    return settings_cli.settings_from(
        WebhookSettings, "tf-webhook", f"TensorFusion-style GPU admission webhook (POST {MUTATE_PATH}).", argv
    )


def main(argv: Sequence[str] | None = None) -> None:
    settings = settings_from(argv)
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
        timeout_keep_alive=KEEP_ALIVE_S,
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
