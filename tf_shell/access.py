"""Who may read an endpoint of ours that serves per-pod data off loopback, judged as the kubelet judges its own.

The device plugin's ``/usage`` and ``/metrics`` name every pod on its node, and the extender's explain names
a pod's request and why it waits; reached through the pod network, they must not answer a tenant about
another namespace. So a caller off loopback presents a bearer token (a ServiceAccount's, as Prometheus and
our own programs do), the API server says whose it is (TokenReview), and the read is authorised with a
SubjectAccessReview for attributes that name it — ``nodes/stats`` and ``nodes/metrics`` of the node, as the
kubelet asks for its own ``/stats`` and ``/metrics``, or ``get`` of the pod explained. A caller on loopback is
the pod itself or ``kubectl port-forward`` (which needs ``pods/portforward`` on our pod): believed as is.
Answers are kept ``ttl`` seconds per token and per attributes (2 minutes by default, as the kubelet keeps
its token reviews; a refusal 30 s at most, so that a grant is seen soon), so each caller of each plugin
costs the API server a review pair per ``ttl``, not per scrape: with three readers of every plugin (the
extender, tf-metrics, Prometheus), 1,000 nodes cost 25 review pairs a second, not 300. Refusals say what is
missing, with the status the API server would give: 401 unauthenticated, 403 forbidden, 503 when it cannot
be asked. See docs/security.md, "Who reads per-pod data".
"""

from __future__ import annotations

import hashlib
import ipaddress
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

from tf_shell.kube.api import GatewayError, RawObject

CACHE_LIMIT: Final = 10_000  # verdicts kept at most; all are dropped when it is reached
TTL_S: Final = 120.0  # a token's user and an allowed read, believed this long (the kubelet's token cache: 2 min)
DENIED_TTL_S: Final = 30.0  # a refusal at most this long (the kubelet's unauthorized cache: 30 s)
BEARER: Final = "bearer "
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True, kw_only=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    uid: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Access:
    """What a request reads, as a SubjectAccessReview's resource attributes."""

    verb: str
    resource: str
    subresource: str = ""
    name: str = ""
    namespace: str = ""
    group: str = ""

    def attributes(self) -> dict[str, str]:
        given = {
            "verb": self.verb,
            "group": self.group,
            "resource": self.resource,
            "subresource": self.subresource,
            "name": self.name,
            "namespace": self.namespace,
        }
        return {k: v for k, v in given.items() if v or k == "group"}

    def described(self) -> str:
        """As the API server words a denial: ``get resource "nodes/stats"``, the name and namespace after it."""
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        group = f' in API group "{self.group}"'
        where = f' in the namespace "{self.namespace}"' if self.namespace else ""
        return f'{self.verb} resource "{resource}"{group}{where} ({self.name or "any"})'


@dataclass(frozen=True, slots=True)
class Refusal:
    code: int  # 401, 403 or 503
    message: str


def verdict(review: Mapping[str, Any]) -> Verdict:
    """What the API server answered to a SubjectAccessReview."""
    answered = review.get("status") or {}
    reason = str(answered.get("reason") or answered.get("evaluationError") or "")
    return Verdict(answered.get("allowed") is True and answered.get("denied") is not True, reason)


def review_spec(user: User) -> dict[str, Any]:
    """The subject half of a SubjectAccessReview's spec."""
    spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups)}
    if user.extra:
        spec["extra"] = {key: list(values) for key, values in user.extra}
    if user.uid:
        spec["uid"] = user.uid
    return spec


def access_review(user: User, access: Access) -> dict[str, Any]:
    """The SubjectAccessReview for ``user`` doing ``access``."""
    spec = {"resourceAttributes": access.attributes(), **review_spec(user)}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None without one."""
    if authorization is None or not authorization.lower().startswith(BEARER):
        return None
    token = authorization[len(BEARER) :].strip()
    return token or None


def token_review(token: str) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def reviewed_user(review: Mapping[str, Any]) -> User | None:
    """The user a TokenReview's answer names; None when the token was not authenticated."""
    status = review.get("status") or {}
    found = status.get("user") or {}
    if status.get("authenticated") is not True or not found.get("username"):
        return None
    extra = found.get("extra") or {}
    return User(
        name=str(found["username"]),
        groups=tuple(str(g) for g in found.get("groups") or ()),
        extra=tuple((str(k), tuple(str(v) for v in values)) for k, values in sorted(extra.items())),
        uid=str(found.get("uid") or ""),
    )


def on_loopback(host: str | None) -> bool:
    """Whether a connection's peer address is a loopback one (the pod itself, or a port-forward into it)."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


class Reviews(Protocol):
    """The two reviews, asked of the API server (``tf_shell.kube.reviews.KubeReviews``); GatewayError when it
    cannot be asked."""

    def token_review(self, body: RawObject) -> RawObject: ...

    def review(self, body: RawObject) -> RawObject: ...


class Expiring(Generic[K, V]):
    """Answers kept until a time each, thread-safe; all are dropped once :data:`CACHE_LIMIT` are held (a
    long-lived server meets unboundedly many callers). The reviews' cache here and tf-metrics'."""

    def __init__(self) -> None:
        self._held: dict[K, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get(self, key: K, now: float) -> tuple[V] | None:
        """The answer kept for ``key`` (in a 1-tuple: it may be None itself), unless it expired by ``now``."""
        with self._lock:
            held = self._held.get(key)
        return (held[1],) if held is not None and held[0] > now else None

    def keep(self, key: K, value: V, until: float) -> None:
        with self._lock:
            if len(self._held) >= CACHE_LIMIT:
                self._held.clear()
            self._held[key] = (until, value)


class Gate:
    """Judges each request off loopback; thread-safe (the HTTP servers' threads share one)."""

    def __init__(self, reviews: Reviews, ttl: float = TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._reviews, self._ttl, self._clock = reviews, ttl, clock
        self._denied_ttl = min(ttl, DENIED_TTL_S)
        self._users: Expiring[bytes, User | None] = Expiring()
        self._verdicts: Expiring[tuple[User, Access], Verdict] = Expiring()

    def check(self, peer: str | None, authorization: str | None, access: Access) -> Refusal | None:
        """None when the caller at ``peer`` with that ``Authorization`` header may do ``access``."""
        if on_loopback(peer):
            return None
        token = bearer(authorization)
        if token is None:
            return Refusal(401, "Unauthorized: send a bearer token (a ServiceAccount's) in the Authorization header")
        try:
            user = self._user(token)
            if user is None:
                return Refusal(401, "Unauthorized: the API server did not authenticate the bearer token")
            judged = self._verdict(user, access)
        except GatewayError as exc:
            return Refusal(503, f"cannot ask the API server who may read this: {exc}")
        if judged.allowed:
            return None
        why = f": {judged.reason}" if judged.reason else ""
        return Refusal(403, f'Forbidden: User "{user.name}" cannot {access.described()}{why}')

    def _user(self, token: str) -> User | None:
        key = hashlib.sha256(token.encode()).digest()  # the token itself is not kept
        held = self._users.get(key, self._clock())
        if held is not None:
            return held[0]
        user = reviewed_user(self._reviews.token_review(token_review(token)))
        self._users.keep(key, user, self._clock() + (self._ttl if user is not None else self._denied_ttl))
        return user

    def _verdict(self, user: User, access: Access) -> Verdict:
        held = self._verdicts.get((user, access), self._clock())
        if held is not None:
            return held[0]
        judged = verdict(self._reviews.review(access_review(user, access)))
        ttl = self._ttl if judged.allowed else self._denied_ttl
        self._verdicts.keep((user, access), judged, self._clock() + ttl)
        return judged
