"""Leader election over a coordination.k8s.io/v1 Lease: which extender replica writes status.

With two extender replicas both would write every TensorFusionWorkload's and GPUPool's status
(``status.py``) from its own cache; only the replica holding the extender's own Lease does. Standard
lease semantics, as client-go's leader election: conditional creates, renewals and takeovers, a
takeover only after the record was seen unchanged for ``duration`` on the taker's own monotonic clock,
and a holder that stops ``renew_deadline`` after its last renewal, before anyone else may start.
The bind path does not consult the Lease: its conditional writes make a bind in a replica that lost
it safe (binder.py). See scheduler_extender/README.md, section "Two replicas".
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from scheduler_extender.gateway import KubeGateway
from tf_shell.kube.api import GatewayError, RawObject, precondition_failed
from tf_shell.periodic import Periodic
from vgpu.timefmt import rfc3339

log = logging.getLogger(__name__)


def default_identity() -> str:
    """A name no other replica has: the hostname and a random suffix."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """Seconds: how long a Lease is valid unrenewed, how often the holder renews, and how long after its
    last successful renewal the holder still counts itself leader."""

    duration: float = 15.0
    renew_every: float = 5.0
    renew_deadline: float = 10.0


def lease_body(
    name: str, identity: str, terms: LeaseTerms, now: float, *, acquired: float, transitions: int
) -> RawObject:
    """A Lease held by ``identity``, renewed ``now``."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {
            "holderIdentity": identity,
            "leaseDurationSeconds": int(terms.duration),
            "acquireTime": rfc3339(acquired, "microseconds"),
            "renewTime": rfc3339(now, "microseconds"),
            "leaseTransitions": transitions,
        },
    }


class LeaseElector:
    """Acquires and renews one Lease for ``identity``; :meth:`is_leader` says whether it holds it now."""

    def __init__(
        self,
        gateway: KubeGateway,
        namespace: str,
        name: str,
        identity: str,
        *,
        terms: LeaseTerms = LeaseTerms(),
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.gateway = gateway
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.terms = terms
        self.clock = clock
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._renewed_at: float | None = None  # monotonic time of our last successful acquire/renew
        self._acquired = 0.0  # wall-clock time we acquired the Lease (its acquireTime)
        self._observed: tuple[str, float] | None = None  # (resourceVersion seen, monotonic time first seen)
        self._worker = Periodic("leader-election", terms.renew_every, self.step, on_error, immediately=True)

    def is_leader(self) -> bool:
        with self._lock:
            renewed = self._renewed_at
        return renewed is not None and self.monotonic() - renewed < self.terms.renew_deadline

    def step(self) -> bool:
        """One attempt to acquire or renew; returns whether this replica holds the Lease afterwards."""
        try:
            held = self._try()
        except GatewayError as exc:
            if not precondition_failed(exc):  # 409: another replica wrote first, which is the protocol
                log.warning("leader election: lease %s/%s: %s", self.namespace, self.name, exc)
                raise
            held = False
        if not held:
            with self._lock:
                if self._renewed_at is not None:
                    log.info("leader election: %s no longer holds lease %s", self.identity, self.name)
                self._renewed_at = None
        return held

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        """Stop renewing and, when holding the Lease, release it (client-go's ReleaseOnCancel): the holder is
        cleared, so another replica takes over at its next try instead of after a whole lease duration."""
        self._worker.stop()
        if not self.is_leader():
            return
        with self._lock:
            self._renewed_at = None
        try:
            lease = self.gateway.get_lease(self.namespace, self.name)
            spec = (lease or {}).get("spec") or {}
            if lease is None or spec.get("holderIdentity") != self.identity:
                return
            body = self._body(self.clock(), acquired=self._acquired, transitions=int(spec.get("leaseTransitions") or 0))
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            body["metadata"]["resourceVersion"] = str((lease.get("metadata") or {}).get("resourceVersion") or "")
            self.gateway.replace_lease(self.namespace, self.name, body)
            log.info("leader election: %s released lease %s", self.identity, self.name)
        except GatewayError as exc:  # the others take over after the lease duration instead
            log.warning("leader election: could not release lease %s: %s", self.name, exc)

    def _try(self) -> bool:
        now, tick = self.clock(), self.monotonic()
        lease = self.gateway.get_lease(self.namespace, self.name)
        if lease is None:
            self.gateway.create_lease(self.namespace, self._body(now, acquired=now, transitions=0))
            return self._won(tick, now)
        spec = lease.get("spec") or {}
        meta = lease.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or "")
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            body = self._body(now, acquired=self._acquired or now, transitions=transitions)
        else:
            if self._observed is None or self._observed[0] != rv:
                self._observed = (rv, tick)  # a new record: the holder renewed, the clock starts again
            duration = float(spec.get("leaseDurationSeconds") or self.terms.duration)
            if holder and tick - self._observed[1] < duration:
                return False
            body = self._body(now, acquired=now, transitions=transitions + 1)
            log.info("leader election: %s takes over lease %s from %r", self.identity, self.name, holder)
        body["metadata"]["resourceVersion"] = rv
        self.gateway.replace_lease(self.namespace, self.name, body)
        return self._won(tick, now if holder != self.identity else self._acquired or now)

    def _won(self, tick: float, acquired: float) -> bool:
        with self._lock:
            if self._renewed_at is None:
                log.info("leader election: %s holds lease %s", self.identity, self.name)
            self._renewed_at = tick
            self._acquired = acquired
        self._observed = None
        return True

    def _body(self, now: float, *, acquired: float, transitions: int) -> RawObject:
        return lease_body(self.name, self.identity, self.terms, now, acquired=acquired, transitions=transitions)
