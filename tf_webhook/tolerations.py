"""The GPU-node tolerations the webhook adds to every GPU pod, unless the pod already tolerates them.

GPU nodes are commonly tainted (``nvidia.com/gpu=present:NoSchedule``, the GPU Operator's and the
seed's practice) so that ordinary pods stay off them; a TensorFusion pod is by definition meant for
them, so its author should not have to know the taint. The operator lists the tolerations in the
chart (``webhook.gpuTolerations``); each is checked here once, at start, naming what is wrong. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

OPERATORS: Final = ("Exists", "Equal")
EFFECTS: Final = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
FIELDS: Final = ("key", "operator", "value", "effect", "tolerationSeconds")
# The NVIDIA device plugin's and GPU Operator's taint; the chart's default too.
NVIDIA_TAINT: Final = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)

Toleration = Mapping[str, Any]


def check(tolerations: Sequence[Any]) -> list[dict[str, Any]]:
    """The configured tolerations as plain dicts; raises ValueError naming the entry and field."""
    out = []
    for i, raw in enumerate(tolerations):
        where = f"gpu tolerations[{i}]"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: must be an object with {', '.join(FIELDS)}")
        unknown = sorted(set(raw) - set(FIELDS))
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r}; accepted: {', '.join(FIELDS)}")
        operator = raw.get("operator", "Equal")
        if operator not in OPERATORS:
            raise ValueError(f"{where}.operator {operator!r}: must be one of {', '.join(OPERATORS)}")
        if raw.get("effect", "") not in EFFECTS:
            accepted = ", ".join(EFFECTS[1:])
            raise ValueError(f"{where}.effect {raw.get('effect')!r}: must be empty (any) or one of {accepted}")
        if operator == "Equal" and not raw.get("key"):
            raise ValueError(f"{where}: operator Equal needs a key")
        if operator == "Exists" and raw.get("value"):
            raise ValueError(f"{where}: operator Exists takes no value")
        out.append(dict(raw))
    return out


def _covers(have: Toleration, want: Toleration) -> bool:
    """Whether ``have`` tolerates every taint ``want`` tolerates (same or wider key, value and effect)."""
    if have.get("effect") not in (None, "", want.get("effect")):
        return False
    if have.get("operator") == "Exists":
        return not have.get("key") or have.get("key") == want.get("key")
    return (
        want.get("operator", "Equal") == "Equal"
        and have.get("key") == want.get("key")
        and have.get("value", "") == want.get("value", "")
    )


def missing(existing: object, wanted: Sequence[Toleration]) -> list[Toleration]:
    """The ``wanted`` tolerations the pod's ``existing`` ones do not already cover."""
    have = [t for t in existing if isinstance(t, Mapping)] if isinstance(existing, list) else []
    return [w for w in wanted if not any(_covers(h, w) for h in have)]
