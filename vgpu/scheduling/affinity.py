"""Pure evaluation of a core/v1 NodeAffinity's required terms against a node's name and labels.

A WorkloadProfile carries a ``nodeAffinity`` whose required terms the webhook does not copy into the
pod spec, so kube-scheduler's in-tree NodeAffinity plugin never sees them: the extender must apply them
itself. Its preferred terms the webhook does add to the pod's own (:func:`preferred_terms`), where
kube-scheduler scores them as any pod's: they rank the nodes the GPU policy scores alike. Semantics of the
required terms follow ``k8s.io/component-helpers/scheduling/corev1/nodeaffinity``: terms are
ORed, the requirements inside a term ANDed, an empty term matches nothing, and anything malformed
(unknown operator, a non-integer for ``Gt``/``Lt``) matches nothing rather than everything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED: Final = "preferredDuringSchedulingIgnoredDuringExecution"
NODE_NAME_FIELD: Final = "metadata.name"
_INTEGER: Final = re.compile(r"[+-]?[0-9]+", re.ASCII)


def node_affinity_matches(affinity: Mapping[str, Any] | None, node_name: str, labels: Mapping[str, str]) -> bool:
    """Whether the node satisfies the affinity's required node selector (no affinity: always)."""
    if not affinity:
        return True
    required = affinity.get(REQUIRED)
    if required is None:
        return True
    if not isinstance(required, Mapping):
        return False
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, Sequence) or isinstance(terms, str):
        return False
    return any(_term_matches(term, node_name, labels) for term in terms)


def preferred_terms(affinity: Mapping[str, Any] | None) -> tuple[Mapping[str, Any], ...]:
    """The affinity's preferred scheduling terms (``{weight, preference}`` each), as written."""
    terms = (affinity or {}).get(PREFERRED)
    if not isinstance(terms, Sequence) or isinstance(terms, str):
        return ()
    return tuple(t for t in terms if isinstance(t, Mapping))


def preferred_problems(affinity: Mapping[str, Any]) -> list[tuple[str, object, str]]:
    """What is wrong with the affinity's preferred terms, as (path below it, value, what is accepted): each a
    ``{weight: 1-100, preference: a node selector term}``, as kube-scheduler accepts them."""
    terms = affinity.get(PREFERRED)
    if terms is None:
        return []
    if not isinstance(terms, Sequence) or isinstance(terms, str):
        return [(PREFERRED, terms, "must be a list of {weight, preference} terms")]
    problems: list[tuple[str, object, str]] = []
    for i, term in enumerate(terms):
        where = f"{PREFERRED}[{i}]"
        if not isinstance(term, Mapping):
            problems.append((where, term, "must be a {weight, preference} object"))
            continue
        weight = term.get("weight")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            problems.append((f"{where}.weight", weight, "must be a whole number from 1 to 100"))
        if not isinstance(term.get("preference"), Mapping):
            problems.append((f"{where}.preference", term.get("preference"), "must be a node selector term"))
    return problems


def _term_matches(term: object, node_name: str, labels: Mapping[str, str]) -> bool:
    if not isinstance(term, Mapping):
        return False
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not isinstance(expressions, Sequence) or not isinstance(fields, Sequence):
        return False
    if not expressions and not fields:
        return False
    return all(_label_requirement(e, labels) for e in expressions) and all(
        _field_requirement(f, node_name) for f in fields
    )


def _parts(requirement: object) -> tuple[str, str, tuple[str, ...]] | None:
    if not isinstance(requirement, Mapping):
        return None
    key, operator, values = requirement.get("key"), requirement.get("operator"), requirement.get("values") or ()
    if not isinstance(key, str) or not isinstance(operator, str) or isinstance(values, str):
        return None
    if not isinstance(values, Sequence) or not all(isinstance(v, str) for v in values):
        return None
    return key, operator, tuple(values)


def _label_requirement(requirement: object, labels: Mapping[str, str]) -> bool:
    parts = _parts(requirement)
    if parts is None:
        return False
    key, operator, values = parts
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present and not values
    if operator == "DoesNotExist":
        return not present and not values
    if operator in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        have, bound = _integer(labels[key]), _integer(values[0])
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _field_requirement(requirement: object, node_name: str) -> bool:
    parts = _parts(requirement)
    if parts is None:
        return False
    key, operator, values = parts
    # The API server only accepts metadata.name with In/NotIn and exactly one value.
    if key != NODE_NAME_FIELD or len(values) != 1:
        return False
    if operator == "In":
        return node_name in values
    if operator == "NotIn":
        return node_name not in values
    return False


def _integer(text: str) -> int | None:
    # Go's strconv.ParseInt(s, 10, 64): optional sign, ASCII digits, nothing else (no spaces, no "_").
    return int(text) if _INTEGER.fullmatch(text) else None
