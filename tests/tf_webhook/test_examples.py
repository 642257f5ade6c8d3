"""deploy/examples, as the demo applies them, admitted by the webhook decision."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tf_webhook import review
from tf_webhook.decision import decide
from vgpu.contract import resolved
from vgpu.names import RESOURCE_MILLI_TFLOPS, RESOURCE_VGPU, RESOURCE_VRAM, SystemAnnotation

from .builders import REPO, FakeCluster, apply_patch, decode_patch, example, seed_review

SEED_DEPLOYMENT = REPO / "tests" / "fixtures" / "seed" / "deployment-en.yaml"


def test_example_deployment_carries_the_seed_annotations() -> None:
    seed = yaml.safe_load(Path(SEED_DEPLOYMENT).read_text(encoding="utf-8"))["spec"]["template"]["metadata"]
    ours = example("deployment.yaml")
    assert ours["spec"]["replicas"] == 2
    assert ours["spec"]["template"]["metadata"]["annotations"] == seed["annotations"]
    assert ours["spec"]["template"]["metadata"]["labels"] == seed["labels"]


def test_example_pod_is_admitted_with_example_profile_and_pool() -> None:
    deployment, profile, pool = example("deployment.yaml"), example("workloadprofile.yaml"), example("gpupool.yaml")
    doc = seed_review()
    obj = doc["request"]["object"]
    obj["metadata"]["annotations"] = deployment["spec"]["template"]["metadata"]["annotations"]
    obj["spec"]["containers"][0]["name"] = deployment["spec"]["template"]["spec"]["containers"][0]["name"]
    cluster = FakeCluster(profiles={("default", "default-profile"): profile}, pools=[pool])
    req = review.parse(json.dumps(doc).encode())
    decision = decide(req, cluster)
    response = review.respond(req.uid, decision.verdict)["response"]
    pod = apply_patch(obj, decode_patch(response))
    got = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {
        RESOURCE_VGPU: "1",
        RESOURCE_MILLI_TFLOPS: str(got.tflops_request),
        RESOURCE_VRAM: str(got.vram_request),
    }
    assert got.tflops_request == 10_000 and got.node_affinity == profile["spec"]["nodeAffinity"]
    assert decision.upsert is not None
    assert decision.upsert.spec["autoScalingConfig"] == profile["spec"]["autoScalingConfig"]
