"""Every error the request model can report, with the exact message a user will read."""

from __future__ import annotations

import re

import pytest

from vgpu.errors import DomainError
from vgpu.profile import parse_spec
from vgpu.request import is_enabled, resolve

from .builders import pod

OK = {"tensor-fusion.ai/vram-request": "1Gi"}
P = "tensor-fusion.ai/"

CASES: list[tuple[str, dict[str, str], tuple[str, ...], str]] = [
    ("bad quantity", {f"{P}tflops-request": "ten"}, ("python",),
     "tensor-fusion.ai/tflops-request 'ten': not a Kubernetes quantity such as 10, 2.5, 500m, 4Gi, 4096Mi, 4G or 1e3"),
    ("negative", {f"{P}vram-limit": "-1Gi"}, ("python",), "tensor-fusion.ai/vram-limit '-1Gi': must not be negative"),
    ("request over limit", {f"{P}tflops-request": "30", f"{P}tflops-limit": "20"}, ("python",),
     "tensor-fusion.ai/tflops-request '30': must not exceed the tflops limit 20"),
    ("vram request over limit", {f"{P}vram-request": "8Gi", f"{P}vram-limit": "4Gi"}, ("python",),
     "tensor-fusion.ai/vram-request '8Gi': must not exceed the vram limit 4Gi"),
    ("nothing requested", {f"{P}qos": "low"}, ("python",), "the pod asks for no GPU compute and no VRAM"),
    ("qos", {**OK, f"{P}qos": "urgent"}, ("python",), "tensor-fusion.ai/qos 'urgent': must be one of low, medium, high, critical"),
    ("gpu-count zero", {**OK, f"{P}gpu-count": "0"}, ("python",), "tensor-fusion.ai/gpu-count '0': must be a whole number from 1 to 128"),
    ("gpu-count text", {**OK, f"{P}gpu-count": "two"}, ("python",), "tensor-fusion.ai/gpu-count 'two': must be a whole number from 1 to 128"),
    ("gpu-count huge", {**OK, f"{P}gpu-count": "129"}, ("python",), "tensor-fusion.ai/gpu-count '129': must be a whole number from 1 to 128"),
    ("replicas", {**OK, f"{P}replicas": "-1"}, ("python",), "tensor-fusion.ai/replicas '-1': must be a whole number from 0 to 1000000"),
    ("boolean", {**OK, f"{P}is-local-gpu": "yes"}, ("python",), 'tensor-fusion.ai/is-local-gpu \'yes\': must be "true" or "false"'),
    ("auto flag", {**OK, f"{P}auto-limits": "1"}, ("python",), 'tensor-fusion.ai/auto-limits \'1\': must be "true" or "false"'),
    ("no-standalone without local", {**OK, f"{P}no-standalone-worker-mode": "true"}, ("python",),
     'tensor-fusion.ai/no-standalone-worker-mode \'true\': only allowed with tensor-fusion.ai/is-local-gpu: "true"'),
    ("generate false without workload", {**OK, f"{P}generate-workload": "false"}, ("python",),
     "tensor-fusion.ai/generate-workload 'false': needs tensor-fusion.ai/workload naming the existing workload to use"),
    ("inject missing container", {**OK, f"{P}inject-container": "python,cuda"}, ("python", "sidecar"),
     "tensor-fusion.ai/inject-container 'python,cuda': no container named cuda; the pod has python, sidecar"),
    ("inject empty", {**OK, f"{P}inject-container": " , "}, ("python",),
     "tensor-fusion.ai/inject-container ' , ': must name at least one container (comma-separated)"),
    ("inject required", dict(OK), ("a", "b"), "tensor-fusion.ai/inject-container: required when the pod has several containers; choose from a, b"),
    ("pool name", {**OK, f"{P}gpupool": "Pool_1"}, ("python",),
     "tensor-fusion.ai/gpupool 'Pool_1': must be a Kubernetes name (a DNS-1123 subdomain: lower-case a-z, 0-9, '-')"),
    ("workload name", {**OK, f"{P}workload": "my workload"}, ("python",), "tensor-fusion.ai/workload 'my workload': must be a Kubernetes name"),
    ("profile name", {**OK, f"{P}workload-profile": "UPPER"}, ("python",), "tensor-fusion.ai/workload-profile 'UPPER': must be a Kubernetes name"),
    ("gpu model blank", {**OK, f"{P}gpu-model": "  "}, ("python",), "tensor-fusion.ai/gpu-model '  ': must name a GPU model such as A100"),
    ("placement policy", {**OK, f"{P}placement-policy": "random"}, ("python",),
     "tensor-fusion.ai/placement-policy 'random': must be one of binpack, spread, fragmentation"),
    ("typo key", {**OK, f"{P}vram-requests": "1Gi"}, ("python",),
     "tensor-fusion.ai/vram-requests: unknown tensor-fusion.ai/ annotation; did you mean tensor-fusion.ai/vram-request?"),
    ("huge value is shortened", {**OK, f"{P}qos": "x" * 5000}, ("python",), "'" + "x" * 120 + "…': must be one of"),
]  # fmt: skip


@pytest.mark.parametrize(("annotations", "containers", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_error_message(annotations: dict[str, str], containers: tuple[str, ...], message: str) -> None:
    with pytest.raises(DomainError) as caught:
        resolve(pod(annotations, containers))
    assert message in str(caught.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(DomainError) as caught:
        resolve(pod({f"{P}qos": "x", f"{P}gpu-count": "0", f"{P}tflops-limit": "?"}))
    assert {e.key for e in caught.value.errors} == {f"{P}qos", f"{P}gpu-count", f"{P}tflops-limit"}


def test_enabled_label() -> None:
    assert is_enabled({"tensor-fusion.ai/enabled": "true"}) is True
    assert is_enabled({"tensor-fusion.ai/enabled": "false"}) is False
    assert is_enabled({}) is False
    with pytest.raises(
        DomainError, match=re.escape('label tensor-fusion.ai/enabled \'True\': must be "true" or "false"')
    ):
        is_enabled({"tensor-fusion.ai/enabled": "True"})


PROFILE_CASES: list[tuple[dict[str, object], str]] = [
    ({"qos": "urgent"}, "spec.qos 'urgent': must be one of low, medium, high, critical"),
    ({"gpuCount": 0}, "spec.gpuCount '0': must be a whole number from 1 to 128"),
    ({"gpuCount": True}, "spec.gpuCount 'True': must be a whole number from 1 to 128"),
    ({"replicas": "2"}, "spec.replicas '2': must be a whole number from 0 to 1000000"),
    ({"isLocalGPU": "true"}, "spec.isLocalGPU 'true': must be true or false"),
    ({"standaloneWorkerMode": 1}, "spec.standaloneWorkerMode '1': must be true or false"),
    ({"resources": {"requests": {"tflops": "lots"}}}, "spec.resources.requests.tflops 'lots': not a Kubernetes quantity"),
    ({"resources": []}, "spec.resources '[]': must be an object with requests and limits"),
    ({"poolName": "Bad Pool"}, "spec.poolName 'Bad Pool': must be a Kubernetes name"),
    ({"gpuModel": ""}, "spec.gpuModel '': must be a non-empty string"),
    ({"nodeAffinity": "zone-a"}, "spec.nodeAffinity 'zone-a': must be a core/v1 NodeAffinity object"),
    ({"colour": "blue"}, "spec.colour: unknown field; accepted:"),
    ({"autoScalingConfig": {"autoSetLimits": {"enable": "yes"}}}, "spec.autoScalingConfig.autoSetLimits.enable 'yes': must be true or false"),
    ({"autoScalingConfig": {"autoSetLimits": {"targetResource": "gpu"}}},
     "spec.autoScalingConfig.autoSetLimits.targetResource 'gpu': must be one of all, tflops, vram"),
    ({"autoScalingConfig": {"autoSetLimits": {"maxRatioToRequests": "five"}}},
     "spec.autoScalingConfig.autoSetLimits.maxRatioToRequests 'five': must be a non-negative decimal"),
    ({"autoScalingConfig": {"autoSetReplicas": {"scaleUpCoolDownTime": "soon"}}},
     "spec.autoScalingConfig.autoSetReplicas.scaleUpCoolDownTime 'soon': must be a duration such as 30s, 5m, 1h or 1d"),
    ({"autoScalingConfig": {"autoSetRequests": {"prediction": {"historyDataPeriod": 7}}}},
     "spec.autoScalingConfig.autoSetRequests.prediction.historyDataPeriod '7': must be a string"),
    ({"autoScalingConfig": {"autoScaleEverything": {}}}, "spec.autoScalingConfig.autoScaleEverything: unknown field"),
    ({"autoScalingConfig": {"autoSetRequests": {"speed": "1"}}}, "spec.autoScalingConfig.autoSetRequests.speed: unknown field"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "message"), PROFILE_CASES)
def test_each_profile_error_message(spec: dict[str, object], message: str) -> None:
    with pytest.raises(DomainError) as caught:
        parse_spec(spec, where="spec")
    assert message in str(caught.value)
