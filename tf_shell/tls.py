"""Keeps the webhook's served certificate current: a rotated Secret needs no restart.

cert-manager renews the certificate before it expires, and the kubelet swaps the mounted Secret's
files in place; a webhook that read them once at start would serve the old certificate until
restarted, and the API server — with ``failurePolicy: Fail`` — would refuse every GPU pod once it
expired. So the certificate and key are watched: when either file's content changes, the pair is
loaded into a fresh SSLContext, and the server's context hands every new handshake over to the
newest one from its SNI callback (open connections keep theirs). The live context is never loaded
into: OpenSSL installs a certificate and then its key, and a handshake between the two would find
a certificate without a key. A half-written or mismatched pair is logged and counted, and the old
certificate stays until a good pair appears.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
CHECK_INTERVAL_S = 10.0  # the kubelet refreshes a mounted Secret within about a minute


def fingerprint(*paths: Path) -> str:
    """A digest of the files' contents ('' when one cannot be read)."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            digest.update(path.read_bytes())
        except OSError:
            return ""
        digest.update(b"\0")
    return digest.hexdigest()


class CertReloader:
    """Serves the newest good ``cert``/``key`` pair through ``context``; :meth:`check` is one pass.

    ``build`` makes a server context from the two paths with the server's own settings; it raises
    when the pair cannot be loaded.
    """

    def __init__(
        self,
        context: ssl.SSLContext,
        cert: Path,
        key: Path,
        build: Callable[[Path, Path], ssl.SSLContext],
        server: str = "webhook",
    ) -> None:
        """``server`` names it in the log (the webhook, tf-metrics)."""
        self.cert, self.key, self.build, self.server = cert, key, build, server
        self.current = context
        self.loaded = fingerprint(cert, key)
        self.reloads = 0
        self.failures = 0
        context.sni_callback = self._hand_over  # called for every ClientHello, with or without a name

    def _hand_over(self, connection: ssl.SSLObject, _name: str | None, served: ssl.SSLContext) -> None:
        current = self.current  # one read: a reload between two reads must not mix contexts
        if current is not served:
            connection.context = current

    def check(self) -> bool:
        """Load the pair if it changed since the last good load; True when a new pair is now served."""
        current = fingerprint(self.cert, self.key)
        if not current or current == self.loaded:
            return False
        try:
            fresh = self.build(self.cert, self.key)
        except (ssl.SSLError, OSError) as exc:
            self.failures += 1
            log.warning(
                "%s TLS: cannot load the changed %s / %s; serving the previous pair: %s",
                self.server,
                self.cert,
                self.key,
                exc,
            )
            return False
        self.current, self.loaded = fresh, current
        self.reloads += 1
        log.info("%s TLS: serving the renewed certificate from %s", self.server, self.cert)
        return True
