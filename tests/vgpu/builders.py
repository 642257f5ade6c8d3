"""Builders for request-model tests: pods from the seed YAML and from plain annotation maps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vgpu.profile import ProfileSpec, parse_spec
from vgpu.request import PodView

SEED = Path(__file__).resolve().parent.parent / "fixtures" / "seed"


def load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((SEED / name).read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def pod_from_deployment(name: str) -> PodView:
    template = load(name)["spec"]["template"]
    return PodView.from_pod({"metadata": {**template["metadata"], "namespace": "default"}, "spec": template["spec"]})


def profile(name: str) -> ProfileSpec:
    doc = load(name)
    return parse_spec(doc["spec"], where=f"WorkloadProfile {doc['metadata']['name']} spec")


def pod(annotations: dict[str, str], containers: tuple[str, ...] = ("python",)) -> PodView:
    return PodView(name="p", annotations=annotations, containers=containers)
