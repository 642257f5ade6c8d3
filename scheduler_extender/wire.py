"""The kube-scheduler extender wire types (``k8s.io/kube-scheduler/extender/v1``), as pydantic models.

kube-scheduler encodes Go structs without json tags, so every key is the Go field name in PascalCase
and absent pointers arrive as ``null``. These models are the only place those spellings live; they
also give the app an OpenAPI schema that the fuzz tests drive. The embedded Pod and Node objects
stay raw Kubernetes JSON (camelCase dicts): we read a few fields and hand Nodes back unchanged.
See /work/shared/reference/scheduler-extender-protocol.md §2.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

RawObject = dict[str, Any]

MIN_PRIORITY = 0
MAX_PRIORITY = 10


class _Wire(BaseModel):
    # Unknown keys are ignored, as Go's decoder does; nothing is coerced silently into another type.
    model_config = ConfigDict(extra="ignore")


class NodeList(BaseModel):
    """A v1 NodeList as the scheduler sends it when not nodeCacheCapable; items are returned unchanged."""

    model_config = ConfigDict(extra="allow")

    metadata: RawObject | None = None
    items: list[RawObject] | None = None


class ExtenderArgs(_Wire):
    """filter and prioritize request."""

    Pod: RawObject | None = None
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(_Wire):
    """filter reply. Exactly one of Nodes/NodeNames is set, matching the request's form."""

    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(_Wire):
    """One entry of the prioritize reply, which is a top-level array of these."""

    Host: str
    Score: int = Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)


# A node name is a DNS subdomain: lowercase letters, digits, '-' and '.', none of which JSON escapes.
_PLAIN_NAMES = re.compile(r"[a-z0-9.-]*")


def host_priorities_json(scores: Mapping[str, int]) -> bytes:
    """The prioritize reply (a JSON array of HostPriority), in ``scores``' order. Node names need no escaping, so
    the array is written as text, a tie's in one join: for 5,000 nodes a list of dicts for orjson took longer
    than the rest of prioritize. Any other name takes that safe way."""
    if not _PLAIN_NAMES.fullmatch("".join(scores)):
        return orjson.dumps([{"Host": host, "Score": score} for host, score in scores.items()])
    if not scores:
        return b"[]"
    values = set(scores.values())
    if len(values) == 1:
        score = int(values.pop())
        between = f'","Score":{score}}},{{"Host":"'
        return f'[{{"Host":"{between.join(scores)}","Score":{score}}}]'.encode()
    return (
        "[" + ",".join(f'{{"Host":"{host}","Score":{int(score)}}}' for host, score in scores.items()) + "]"
    ).encode()


class ExtenderBindingArgs(_Wire):
    """bind request."""

    PodName: str = ""
    PodNamespace: str = ""
    PodUID: str = ""
    Node: str = ""


class ExtenderBindingResult(_Wire):
    """bind reply; an empty Error means the Binding was created."""

    Error: str = ""


class MetaPod(_Wire):
    UID: str


class MetaVictims(_Wire):
    Pods: list[MetaPod] = Field(default_factory=list)
    NumPDBViolations: int = 0


class Victims(_Wire):
    """Victims in the non-cache form: full Pod objects."""

    Pods: list[RawObject] = Field(default_factory=list)
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(_Wire):
    """preempt request: the preemptor and the scheduler's candidate victims per node (one of two forms)."""

    Pod: RawObject | None = None
    NodeNameToVictims: dict[str, Victims] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = None


class ExtenderPreemptionResult(_Wire):
    """preempt reply: always the Meta form. A node left out is vetoed; a node kept has ≥ 1 victim."""

    NodeNameToMetaVictims: dict[str, MetaVictims] = Field(default_factory=dict)


def candidate_victims(args: ExtenderPreemptionArgs) -> dict[str, tuple[str, ...]]:
    """The scheduler's candidate victim UIDs per node, whichever form it sent."""
    if args.NodeNameToMetaVictims is not None:
        return {node: tuple(p.UID for p in v.Pods) for node, v in args.NodeNameToMetaVictims.items()}
    if args.NodeNameToVictims is not None:
        return {node: tuple(_uid(p) for p in v.Pods) for node, v in args.NodeNameToVictims.items()}
    return {}


def pdb_violations(args: ExtenderPreemptionArgs) -> dict[str, int]:
    """NumPDBViolations per node as the scheduler computed them for its own victim set."""
    if args.NodeNameToMetaVictims is not None:
        return {node: v.NumPDBViolations for node, v in args.NodeNameToMetaVictims.items()}
    if args.NodeNameToVictims is not None:
        return {node: v.NumPDBViolations for node, v in args.NodeNameToVictims.items()}
    return {}


def node_name(node: RawObject) -> str:
    """The name of a raw Node object ('' when it has none)."""
    meta = node.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""


def _uid(pod: RawObject) -> str:
    meta = pod.get("metadata")
    return str(meta.get("uid") or "") if isinstance(meta, dict) else ""
