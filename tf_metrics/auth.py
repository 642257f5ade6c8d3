"""Who is asking, judged as an aggregated API server must: only the API server's front proxy is believed.

The API server authenticates the user and proxies the request to us over TLS with its front-proxy
client certificate, naming the user in ``X-Remote-*`` headers. Those headers are believed only on a
connection whose certificate chains to the requestheader client CA and whose common name is allowed,
as published in ``kube-system/extension-apiserver-authentication``; any other caller is
unauthenticated. The user is then authorised again with a SubjectAccessReview for the attributes the
API server authorised, so a caller who reaches our port past the API server cannot read more than it
could through it. See deploy/README.md, section "The custom metrics API".

Pure: the ConfigMap's data and a request's headers in, an identity or a reason out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

from tf_metrics.api import Query
from tf_shell.access import User, review_spec
from vgpu.names import CUSTOM_METRICS_GROUP

# Where the API server publishes its requestheader configuration.
CONFIG_NAMESPACE: Final = "kube-system"
CONFIG_NAME: Final = "extension-apiserver-authentication"
CLIENT_CA_KEY: Final = "requestheader-client-ca-file"


class Unauthenticated(ValueError):
    """The request does not come from the API server's front proxy; the message says what is missing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontProxy:
    """The API server's requestheader configuration: whose certificate to trust, and which headers name the user."""

    client_ca: str  # PEM
    allowed_names: frozenset[str]  # empty: any certificate the CA signed
    username_headers: tuple[str, ...]
    group_headers: tuple[str, ...]
    extra_prefixes: tuple[str, ...]
    uid_headers: tuple[str, ...] = ()


def front_proxy(data: Mapping[str, str]) -> FrontProxy:
    """The configuration in the ConfigMap's data; ValueError saying what is missing or malformed."""
    where = f"{CONFIG_NAMESPACE}/{CONFIG_NAME}"
    ca = data.get(CLIENT_CA_KEY, "").strip()
    if not ca:
        raise ValueError(
            f"the API server publishes no {CLIENT_CA_KEY} in the ConfigMap {where}: its aggregation layer is not "
            "configured (kube-apiserver --requestheader-client-ca-file, --proxy-client-cert-file and friends), so "
            "no APIService can be served"
        )

    def names(key: str) -> tuple[str, ...]:
        text = data.get(key) or "[]"
        try:
            listed = json.loads(text)
        except ValueError:
            raise ValueError(f"{where}: {key} {text!r} is not a JSON list") from None
        if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
            raise ValueError(f"{where}: {key} {text!r} is not a JSON list of strings")
        return tuple(listed)

    users = names("requestheader-username-headers")
    if not users:
        raise ValueError(f"{where}: requestheader-username-headers is empty: no header names the user")
    return FrontProxy(
        client_ca=ca,
        allowed_names=frozenset(names("requestheader-allowed-names")),
        username_headers=users,
        group_headers=names("requestheader-group-headers"),
        extra_prefixes=names("requestheader-extra-headers-prefix"),
        uid_headers=names("requestheader-uid-headers"),
    )


def authenticate(common_name: str | None, headers: Sequence[tuple[str, str]], proxy: FrontProxy) -> User:
    """The user the front proxy names, on a connection whose verified client certificate has
    ``common_name`` (None: no certificate, or one the CA did not sign)."""
    if common_name is None:
        raise Unauthenticated(
            "no client certificate signed by the API server's requestheader client CA: this server answers "
            "only the API server's aggregation layer (ask it: /apis/custom.metrics.k8s.io/...)"
        )
    if proxy.allowed_names and common_name not in proxy.allowed_names:
        allowed = ", ".join(sorted(proxy.allowed_names))
        raise Unauthenticated(f"client certificate CN {common_name!r} is not one of the allowed names ({allowed})")
    lowered = [(key.lower(), value) for key, value in headers]

    def values(names: tuple[str, ...]) -> list[str]:
        wanted = {n.lower() for n in names}
        return [value for key, value in lowered if key in wanted and value]

    users = values(proxy.username_headers)
    if not users:
        raise Unauthenticated(f"the front proxy named no user (headers {', '.join(proxy.username_headers)})")
    extra: dict[str, list[str]] = {}
    for key, value in lowered:
        for prefix in proxy.extra_prefixes:
            if key.startswith(prefix.lower()) and len(key) > len(prefix):
                extra.setdefault(unquote(key[len(prefix) :]).lower(), []).append(value)
    uids = values(proxy.uid_headers)
    return User(
        name=users[0],
        groups=tuple(values(proxy.group_headers)),
        extra=tuple((k, tuple(v)) for k, v in sorted(extra.items())),
        uid=uids[0] if uids else "",
    )


def access_review(user: User, query: Query) -> dict[str, Any]:
    """The SubjectAccessReview for ``user`` reading ``query``, with the attributes the API server's own
    request info gives the same path."""
    attributes = {
        "verb": "get",
        "group": CUSTOM_METRICS_GROUP,
        "version": query.version,
        "resource": query.resource,
        "subresource": query.metric,
        "name": query.name,
    }
    if query.namespace is not None:
        attributes["namespace"] = query.namespace
    spec = {"resourceAttributes": attributes, **review_spec(user)}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def forbidden_message(user: User, query: Query) -> str:
    """The API server's wording for the same denial."""
    where = f' in the namespace "{query.namespace}"' if query.namespace is not None else ""
    return (
        f'{query.resource}.{CUSTOM_METRICS_GROUP} "{query.name}" is forbidden: User "{user.name}" cannot get '
        f'resource "{query.resource}/{query.metric}" in API group "{CUSTOM_METRICS_GROUP}"{where}'
    )
