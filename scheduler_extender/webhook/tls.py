"""Keeps the webhook's served certificate current: a rotated Secret needs no restart.

cert-manager renews the certificate before it expires, and the kubelet swaps the mounted Secret's
files in place; a webhook that read them once at start would serve the old certificate until
restarted, and the API server — with ``failurePolicy: Fail`` — would refuse every GPU pod once it
expired. So the certificate and key are watched: when either file's content changes, the pair is
loaded into the very SSLContext the server handshakes with, and every new connection gets the new
certificate (open ones keep theirs). A half-written or mismatched pair is logged and counted, and
the old certificate stays until a good pair appears.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
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
    """Reloads ``cert``/``key`` into ``context`` when their contents change; :meth:`check` is one pass."""

    def __init__(self, context: ssl.SSLContext, cert: Path, key: Path) -> None:
        self.context, self.cert, self.key = context, cert, key
        self.loaded = fingerprint(cert, key)
        self.reloads = 0
        self.failures = 0

    def check(self) -> bool:
        """Load the pair if it changed since the last good load; True when a new pair is now served."""
        current = fingerprint(self.cert, self.key)
        if not current or current == self.loaded:
            return False
        try:
            # A scratch context first: a failed load into the live one could leave it without a key.
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(str(self.cert), str(self.key))
            self.context.load_cert_chain(str(self.cert), str(self.key))
        except (ssl.SSLError, OSError) as exc:
            self.failures += 1
            log.warning(
                "webhook TLS: cannot load the changed %s / %s; serving the previous pair: %s", self.cert, self.key, exc
            )
            return False
        self.loaded = current
        self.reloads += 1
        log.info("webhook TLS: serving the renewed certificate from %s", self.cert)
        return True
