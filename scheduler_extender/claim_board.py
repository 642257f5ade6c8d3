"""Each GPU node's claims Lease: read, and written by compare-and-swap, by the writes that add grants there.

One small coordination.k8s.io Lease per node (``tf-gpu-claims.<node>`` in the extender's namespace, owned by
the Node, so deleted with it) holds the node's claims (vgpu/contract/claims.py) in an annotation. A replica
keeps the last version it read or wrote, so a write needs no read while no other replica writes the node; a
409 says one did, and the write is decided again on a fresh read. Writes of one node within a replica take
turns (``writing``), so they never fail on each other. The rules that make it airtight:
scheduler_extender/HANDOFF.md, "Arbitration".
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from scheduler_extender.gateway import KubeGateway
from tf_shell.kube.api import GatewayError, RawObject
from vgpu.contract import claims as claims_contract
from vgpu.contract.claims import NodeClaims
from vgpu.errors import DomainError
from vgpu.names import CLAIMS_ANNOTATION, CLAIMS_LEASE_PREFIX
from vgpu.timefmt import rfc3339

MAX_NAME = 253  # a Lease's name is a DNS subdomain


class ClaimsContended(Exception):
    """Another replica wrote the node's claims since this one read them: decide again on a fresh read."""


class ClaimsUnreadable(Exception):
    """The node's claims Lease carries claims this version cannot read; nothing is placed there until an
    operator repairs or deletes it (the message names it)."""


def lease_name(node: str) -> str:
    """The claims Lease of ``node``: the prefix and the node's name, or a digest of it when too long."""
    name = CLAIMS_LEASE_PREFIX + node
    if len(name) <= MAX_NAME:
        return name
    return CLAIMS_LEASE_PREFIX + hashlib.sha256(node.encode()).hexdigest()


class ClaimBoard:
    """The claims of every node this replica placed on, as last read or written. Thread-safe."""

    def __init__(self, gateway: KubeGateway, namespace: str, identity: str, *, clock: Callable[[], float]) -> None:
        self.gateway = gateway
        self.namespace = namespace
        self.identity = identity
        self.clock = clock
        self._lock = threading.Lock()
        self._known: dict[str, tuple[NodeClaims, str | None]] = {}  # node -> (claims, Lease resourceVersion)
        self._turns: dict[str, threading.Lock] = {}

    @contextmanager
    def writing(self, node: str) -> Iterator[None]:
        """Hold ``node``'s turn: between reading its claims and writing them, no other write of this replica."""
        with self._lock:
            turn = self._turns.setdefault(node, threading.Lock())
        with turn:
            yield

    def current(self, node: str, *, timeout: float) -> NodeClaims:
        """The node's claims as this replica last knew them, read when it knows none."""
        with self._lock:
            known = self._known.get(node)
        return known[0] if known is not None else self.read(node, timeout=timeout)

    def read(self, node: str, *, timeout: float) -> NodeClaims:
        """The node's claims as the API server has them now (none when it has no Lease)."""
        lease = self.gateway.get_lease(self.namespace, lease_name(node), timeout=timeout)
        claims = NodeClaims(node=node) if lease is None else self._decode(node, lease)
        self._remember(node, claims, None if lease is None else _version(lease))
        return claims

    def write(self, claims: NodeClaims, *, timeout: float, node_uid: str | None = None) -> None:
        """Replace the node's claims, on the condition that nobody wrote them since this replica read them
        (ClaimsContended otherwise). A call that got no answer may have landed: the next write reads first.
        ``node_uid``: the node's, which makes the Lease the node's dependent (deleted with it)."""
        node = claims.node
        with self._lock:
            known = self._known.pop(node, None)
        version = None if known is None else known[1]
        body = self._body(claims, version, node_uid)
        try:
            if version is None:
                stored = self.gateway.create_lease(self.namespace, body, timeout=timeout)
            else:
                stored = self.gateway.replace_lease(self.namespace, lease_name(node), body, timeout=timeout)
        except GatewayError as exc:
            if exc.status == 409 or (exc.status == 404 and version is not None):  # written, or deleted, since read
                raise ClaimsContended(f"another extender wrote the claims of node {node}") from None
            raise
        self._remember(node, claims, _version(stored))

    def forget(self, node: str) -> None:
        """Read the node's claims afresh before the next write (the last write's outcome is unknown)."""
        with self._lock:
            self._known.pop(node, None)

    def _remember(self, node: str, claims: NodeClaims, version: str | None) -> None:
        with self._lock:
            self._known[node] = (claims, version)

    def _decode(self, node: str, lease: RawObject) -> NodeClaims:
        meta: dict[str, Any] = lease.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(CLAIMS_ANNOTATION)
        if text is None:
            return NodeClaims(node=node)
        try:
            claims = claims_contract.decode(str(text))
        except DomainError as exc:
            raise ClaimsUnreadable(
                f"the GPU claims Lease {self.namespace}/{lease_name(node)} is unreadable ({exc}); nothing is placed "
                "on the node until it is repaired or deleted"
            ) from None
        if claims.node != node:
            raise ClaimsUnreadable(
                f"the GPU claims Lease {self.namespace}/{lease_name(node)} names node {claims.node!r}, not {node!r}"
            )
        return claims

    def _body(self, claims: NodeClaims, version: str | None, node_uid: str | None) -> RawObject:
        meta: dict[str, Any] = {
            "name": lease_name(claims.node),
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/component": "gpu-claims"},
            "annotations": {CLAIMS_ANNOTATION: claims_contract.encode(claims)},
        }
        if node_uid:  # the garbage collector deletes it with its node
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": claims.node, "uid": node_uid}]
        if version is not None:
            meta["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {"holderIdentity": self.identity, "renewTime": rfc3339(self.clock(), "microseconds")},
        }


def _version(lease: RawObject) -> str | None:
    rv = (lease.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv else None
