"""What tfctl shows of a pod asking for GPUs per container (container-gpu-count): the counts, then the GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tfctl.explain_client import render
from tfctl.main import main
from vgpu.contract import allocation
from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.names import LABEL_ENABLED, Annotation, Qos


def test_resolve_shows_each_containers_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    annotations = {
        Annotation.CONTAINER_GPU_COUNT.value: '{"pre": 1, "inference": 2}',
        "tensor-fusion.ai/vram-request": "1Gi",
    }
    pod = {
        "kind": "Pod",
        "metadata": {"name": "split", "labels": {LABEL_ENABLED: "true"}, "annotations": annotations},
        "spec": {"containers": [{"name": "pre"}, {"name": "inference"}]},
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod), encoding="utf-8")
    assert main(["resolve", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("GPUs per container: pre 1, inference 2")
    assert "  gpu count              3 (pre 1, inference 2: each container its own GPUs)" in out


def test_explain_shows_the_gpus_each_container_was_granted() -> None:
    grants = tuple(
        GpuGrant(uuid=f"GPU-{i}", index=i, tflops_request=1, tflops_limit=1, vram_request=1, vram_limit=1, gpu_tflops=1)
        for i in range(3)
    )
    granted = PodAllocation(
        pod_uid="u", node="n", pool="default-pool", qos=Qos.MEDIUM, containers=("pre", "inference"), gpus=grants,
        bound_at="2026-01-01T00:00:00Z", container_gpus=(("pre", ("GPU-0",)), ("inference", ("GPU-1", "GPU-2"))),
    )  # fmt: skip
    # The extender's explain answer carries the allocation as its contract writes it (scheduler_extender/explain.py).
    lines = render({"pod": "default/split", "allocation": json.loads(allocation.encode(granted))}).splitlines()
    assert lines[1:] == ["  gpus of   pre: GPU-0", "  gpus of   inference: GPU-1, GPU-2"]
