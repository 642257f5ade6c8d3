"""The verified client certificate's common name, handed from the TLS connection to the app.

An aggregated API server believes the user headers only from the API server's front proxy, which
it knows by its client certificate (``auth``). The TLS handshake verifies the certificate against
the requestheader client CA (``CERT_OPTIONAL``: health probes come without one), but uvicorn puts
nothing of it in the ASGI scope. This protocol is uvicorn's httptools one plus that: each request's
scope gets ``extensions["tls_peer"] = {"common_name": <CN, or None without a verified certificate>}``.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

EXTENSION: Final = "tls_peer"


def common_name(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """The subject CN of the peer's certificate, when the handshake verified one."""
    certificate: Any = ssl_object.getpeercert() if ssl_object is not None else None
    for rdn in (certificate or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def peer_common_name(scope: Mapping[str, Any]) -> str | None:
    """What :class:`PeerCertProtocol` put in ``scope`` (None outside it, as in tests without TLS)."""
    peer = (scope.get("extensions") or {}).get(EXTENSION) or {}
    name = peer.get("common_name")
    return name if isinstance(name, str) else None


class PeerCertProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the peer certificate's CN in every request's scope."""

    _peer: str | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._peer = common_name(transport.get_extra_info("ssl_object"))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {EXTENSION: {"common_name": self._peer}}
