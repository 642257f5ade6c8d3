"""What kube-scheduler's own score plugins weigh for a pod, so that filter knows when it may choose alone.

When filter passes one node, kube-scheduler skips its score plugins and the prioritize call and binds that node
(``schedulePod``: "only one node after predicate"). That saves a GPU pod's costliest half of scheduling, and
changes nothing when the in-tree scores would only have broken ties between nodes this extender rates alike:
then filter passes those tied nodes, and kube-scheduler breaks the tie as before. They do more than break ties
for a pod that states soft preferences of its own (preferred node affinity, preferred pod affinity or
anti-affinity, ``ScheduleAnyway`` spread constraints) and on nodes with ``PreferNoSchedule`` taints it does not
tolerate; for those, filter passes every fitting node and prioritize scores them (verbs.py). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

PREFER_NO_SCHEDULE: Final = "PreferNoSchedule"
Taint = Mapping[str, Any]
Toleration = Mapping[str, Any]


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _entries(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def states_soft_preferences(pod: Mapping[str, Any]) -> bool:
    """Whether the pod asks kube-scheduler to weigh nodes for it: preferred node affinity, preferred pod
    affinity or anti-affinity, or a topology spread constraint with ``whenUnsatisfiable: ScheduleAnyway``."""
    spec = _mapping(pod.get("spec"))
    affinity = _mapping(spec.get("affinity"))
    preferred = "preferredDuringSchedulingIgnoredDuringExecution"
    if any(_entries(_mapping(affinity.get(kind)).get(preferred)) for kind in ("nodeAffinity", "podAffinity")):
        return True
    if _entries(_mapping(affinity.get("podAntiAffinity")).get(preferred)):
        return True
    return any(c.get("whenUnsatisfiable") == "ScheduleAnyway" for c in _entries(spec.get("topologySpreadConstraints")))


def tolerations(pod: Mapping[str, Any]) -> tuple[Toleration, ...]:
    return tuple(_entries(_mapping(pod.get("spec")).get("tolerations")))


def prefer_no_schedule(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """The node's taints of effect ``PreferNoSchedule`` (kube-scheduler's TaintToleration scores them)."""
    return tuple(t for t in _entries(_mapping(node.get("spec")).get("taints")) if t.get("effect") == PREFER_NO_SCHEDULE)


def tolerated(taint: Taint, by: Sequence[Toleration]) -> bool:
    """Kubernetes' rule (``Toleration.ToleratesTaint``): same effect or none, same key or none with Exists,
    and with Equal the same value. An operator this does not know tolerates nothing here, which only makes
    filter leave the choice to kube-scheduler."""
    for toleration in by:
        if toleration.get("effect") not in (None, "", taint.get("effect")):
            continue
        key = toleration.get("key") or ""
        if key and key != taint.get("key"):
            continue
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists" or (
            operator == "Equal" and key and toleration.get("value", "") == taint.get("value", "")
        ):
            return True
    return False
