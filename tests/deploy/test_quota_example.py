"""The quota example names exactly the resources the webhook sets, with quantities the API server takes."""

from __future__ import annotations

from pathlib import Path

import yaml

from vgpu.names import NODE_RESOURCES, RESOURCE_VGPU
from vgpu.quantity import parse

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "quota" / "team-a.yaml"


def test_the_quota_example_limits_our_three_resources_by_request() -> None:
    (quota,) = list(yaml.safe_load_all(EXAMPLE.read_text()))
    assert quota["kind"] == "ResourceQuota"
    hard = quota["spec"]["hard"]
    assert set(hard) == {f"requests.{name}" for name in (*NODE_RESOURCES, RESOURCE_VGPU)}
    assert parse(hard["requests.tensor-fusion.ai/milli-tflops"]) == 200_000  # 200 TFLOPS in thousandths
    assert parse(hard["requests.tensor-fusion.ai/vram"]) == 400 * 1024**3
