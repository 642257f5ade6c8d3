"""The autoscaler's checkpoints as ConfigMaps: the object for a workload's histograms, and reading them back.

VPA keeps its recommender's histograms in VerticalPodAutoscalerCheckpoint objects so that a restart does not
throw days of history away; we keep ours in ConfigMaps in the extender's own namespace — one per workload,
``tf-autoscaler-<digest of namespace/name>``, annotated with the workload — which only the extender's
service account may write (a tenant cannot forge a history), and which need no CRD of their own. Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from scheduler_extender.autoscaler.hpa import MANAGED_BY
from vgpu.autoscale.evaluate import WorkloadKey
from vgpu.names import DOMAIN

LABEL: Final = f"{DOMAIN}/autoscaler-checkpoint"
SELECTOR: Final = f"{LABEL}=true"
DATA_KEY: Final = "checkpoint.json"
WORKLOAD_ANNOTATION: Final = f"{DOMAIN}/workload"


def name_of(key: WorkloadKey) -> str:
    """``tf-autoscaler-<digest>``: a ConfigMap name for any namespace/name pair."""
    return "tf-autoscaler-" + hashlib.sha256(f"{key[0]}/{key[1]}".encode()).hexdigest()[:20]


def config_map(namespace: str, key: WorkloadKey, checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The ConfigMap holding ``checkpoint`` (``Autoscaler.checkpoint``) of workload ``key``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name_of(key),
            "namespace": namespace,
            "labels": {LABEL: "true", "app.kubernetes.io/managed-by": MANAGED_BY},
            "annotations": {WORKLOAD_ANNOTATION: f"{key[0]}/{key[1]}"},
        },
        "data": {DATA_KEY: json.dumps(checkpoint, separators=(",", ":"), sort_keys=True)},
    }


def read(maps: Iterable[Mapping[str, Any]]) -> dict[WorkloadKey, str]:
    """Each listed checkpoint's text by workload; one without a workload or a text is skipped."""
    found: dict[WorkloadKey, str] = {}
    for cm in maps:
        where = str(((cm.get("metadata") or {}).get("annotations") or {}).get(WORKLOAD_ANNOTATION) or "")
        text = (cm.get("data") or {}).get(DATA_KEY)
        if "/" in where and isinstance(text, str):
            namespace, name = where.split("/", 1)
            found[(namespace, name)] = text
    return found
