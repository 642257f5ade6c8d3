"""A node's GPU claims: the grants extender replicas are writing on that node and have not yet seen land.

Every write that adds grants on a node (a bind's Binding, an autoscaler resize) first adds its claim here,
by a compare-and-swap of the node's claims Lease, so two replicas that place on one node from their own
caches are ordered by the API server (scheduler_extender/HANDOFF.md, "Arbitration"). A claim names the pod
and the resourceVersion its write is conditioned on: once the pod has moved past that version without the
claim's grants, the claim can never land. ``horizon`` is the highest pod resourceVersion whose effect a
replica relied on when it dropped a claim that had landed: a replica whose pod watch is behind it must
catch up before it places on the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from vgpu.contract.allocation import GpuGrant, grant_fields, read_grant
from vgpu.contract.strict import Reader, dump, load
from vgpu.names import CLAIMS_ANNOTATION

VERSION: Final = "v1"
KEY: Final = CLAIMS_ANNOTATION


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """One write in flight: ``grants`` for pod ``pod_uid`` (``pod``: namespace/name), conditioned on the pod's
    resourceVersion ``version``; ``at``: the writer's wall clock (seconds), ``slots``: device IDs per GPU."""

    pod_uid: str
    pod: str
    version: int
    gpus: tuple[GpuGrant, ...]
    slots: int
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeClaims:
    node: str
    horizon: int = 0
    claims: tuple[Claim, ...] = ()


def encode(claims: NodeClaims) -> str:
    return dump(
        {
            "version": VERSION,
            "node": claims.node,
            "horizon": claims.horizon,
            "claims": [
                {
                    "podUID": c.pod_uid,
                    "pod": c.pod,
                    "resourceVersion": c.version,
                    "slots": c.slots,
                    "at": c.at,
                    "gpus": [grant_fields(g) for g in c.gpus],
                }
                for c in claims.claims
            ],
        }
    )


def decode(text: str) -> NodeClaims:
    r = load(text, KEY, (VERSION,))
    claims = NodeClaims(node=r.text("node"), horizon=r.integer("horizon"), claims=r.items("claims", _claim))
    r.done()
    return claims


def _claim(r: Reader) -> Claim:
    claim = Claim(
        pod_uid=r.text("podUID"),
        pod=r.text("pod"),
        version=r.integer("resourceVersion"),
        slots=r.integer("slots"),
        at=r.number("at"),
        gpus=r.items("gpus", read_grant),
    )
    r.done()
    return claim
