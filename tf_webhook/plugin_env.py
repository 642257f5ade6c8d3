"""The environment variables only the device plugin sets, removed from a GPU pod's containers at admission.

The kubelet puts a container's own ``env`` after the device plugin's Allocate answer, and the runtime keeps
the last of two same-named variables: a container setting ``NVIDIA_VISIBLE_DEVICES`` or a HAMi-core limit
would lift its own grant on a node whose runtime does not apply the plugin's CDI device. So every container
and init container of a GPU pod loses any entry named in :data:`~vgpu.names.PLUGIN_ENV_NAMES` or
starting with one of :data:`~vgpu.names.PLUGIN_ENV_PREFIXES`, each named in a warning (key, value, why).
Removed rather than denied: the value can never take effect where the plugin's CDI device is applied, so it
is a mistake to correct, the way the webhook corrects a tenant's copy of a system annotation; a Deployment
copied from a guide that sets ``NVIDIA_VISIBLE_DEVICES=all`` keeps working, with its grant. ``envFrom`` is
not readable here (a ConfigMap's keys are not in the pod): the CDI device closes it (docs/security.md,
section "Environment overrides").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tf_webhook.pod_patch import Op, pointer
from vgpu.errors import FieldError
from vgpu.names import PLUGIN_ENV_NAMES, PLUGIN_ENV_PREFIXES

SHOWN = 60  # characters of a removed value shown in its warning (the API server clips long warnings)


def set_by_plugin(name: str) -> bool:
    return name in PLUGIN_ENV_NAMES or name.startswith(PLUGIN_ENV_PREFIXES)


def _shown(entry: Mapping[str, Any]) -> str | None:
    if "value" in entry:
        value = str(entry["value"])
        return value if len(value) <= SHOWN else value[: SHOWN - 1] + "…"
    source = entry.get("valueFrom")
    return f"valueFrom {', '.join(source)}" if isinstance(source, Mapping) and source else None


def removed(field: str, container: str, entry: Mapping[str, Any]) -> FieldError:
    """The warning for one removed entry: the key, its value and what is accepted."""
    return FieldError(
        f"spec.{field}[{container}].env[{entry.get('name')}]",
        _shown(entry),
        "set by the device plugin; removed: a container's own value is not accepted, the plugin sets it from "
        "the pod's GPU grant (its tensor-fusion.ai/ annotations)",
    )


def strip(spec: Mapping[str, Any]) -> tuple[list[Op], list[str]]:
    """The ops replacing each container's ``env`` without the plugin's variables, and one warning per entry."""
    ops: list[Op] = []
    warnings: list[str] = []
    for field in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(field) or ()):
            env = container.get("env")
            if not isinstance(env, list):
                continue
            ours = [e for e in env if isinstance(e, Mapping) and set_by_plugin(str(e.get("name", "")))]
            if not ours:
                continue
            kept = [e for e in env if not (isinstance(e, Mapping) and set_by_plugin(str(e.get("name", ""))))]
            ops.append({"op": "add", "path": pointer("spec", field, index, "env"), "value": kept})
            name = str(container.get("name"))[:SHOWN]
            warnings += [str(removed(field, name, e)) for e in ours]
    return ops, warnings
