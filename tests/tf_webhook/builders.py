"""Builders for webhook tests: AdmissionReview bodies shaped as the API server sends them, a
dictionary-backed cluster, and a small RFC 6902 applier to check what a patch does to the pod."""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tf_webhook.cluster import ClusterUnavailable
from tf_webhook.workload import WorkloadUpsert, merge_spec

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SEED_REVIEW = HERE / "fixtures" / "seed-pod-create.json"
EXAMPLES = REPO / "deploy" / "examples"


def seed_review() -> dict[str, Any]:
    doc = json.loads(SEED_REVIEW.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def review_of(
    annotations: dict[str, str] | None = None,
    *,
    labels: dict[str, str] | None = None,
    containers: tuple[str, ...] = ("python",),
    spec: dict[str, Any] | None = None,
    operation: str = "CREATE",
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
) -> dict[str, Any]:
    """The seed review with this pod's annotations, labels and containers."""
    doc = seed_review()
    request = doc["request"]
    request["uid"], request["operation"] = uid, operation
    meta = request["object"]["metadata"]
    meta["annotations"] = dict(annotations or {})
    meta["labels"] = {"app": "x", "tensor-fusion.ai/enabled": "true"} if labels is None else labels
    template = request["object"]["spec"]["containers"][0]
    request["object"]["spec"]["containers"] = [{**copy.deepcopy(template), "name": n} for n in containers]
    request["object"]["spec"].update(spec or {})
    return doc


def body(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def example(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def default_pool(name: str = "default-pool", **defaults: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"default": True, "defaults": defaults}}


@dataclass
class FakeCluster:
    """AdmissionCluster over dictionaries: profiles/workloads keyed by (namespace, name). ``pools`` are what a
    read answers, ``live_pools`` (when set) what a fresh read does: the API server ahead of a cache."""

    profiles: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    workloads: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pools: list[dict[str, Any]] = field(default_factory=lambda: [default_pool()])
    live_pools: list[dict[str, Any]] | None = None
    down: bool = False
    writes: list[WorkloadUpsert] = field(default_factory=list)
    fresh_reads: int = 0

    def workload_profile(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check()
        return self.profiles.get((namespace, name))

    def workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check()
        return self.workloads.get((namespace, name))

    def gpu_pools(self, *, fresh: bool = False) -> list[dict[str, Any]]:
        self._check()
        self.fresh_reads += fresh
        return self.live_pools if fresh and self.live_pools is not None else self.pools

    def upsert_workload(self, upsert: WorkloadUpsert) -> None:
        self._check()
        self.writes.append(upsert)
        key = (upsert.namespace, upsert.name)
        old = self.workloads.get(key, {}).get("spec")
        self.workloads[key] = {"spec": merge_spec(old, upsert.spec)}

    def _check(self) -> None:
        if self.down:
            raise ClusterUnavailable("get workloadprofiles default/x: HTTP 503 Service Unavailable")


def decode_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert isinstance(ops, list)
    return ops


def apply_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/remove/replace, enough to check our patches land where we mean them to."""
    doc = copy.deepcopy(obj)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last: Any = (len(parent) if parts[-1] == "-" else int(parts[-1])) if isinstance(parent, list) else parts[-1]
        if op["op"] == "add" and isinstance(parent, list):
            parent.insert(last, op["value"])
        elif op["op"] in ("add", "replace"):
            assert op["op"] == "add" or last in parent
            parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[last]
        else:
            raise AssertionError(f"unexpected op {op}")
    return doc
