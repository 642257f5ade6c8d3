"""Every error the domain can report, with the exact message a user or an operator will read.

The request model's messages reach users through the webhook; the catalog's, the contracts' and the
quantity parser's reach operators through a binary that refuses to start or a pod event.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from vgpu import quantity
from vgpu.catalog import parse_overrides
from vgpu.contract import allocation, inventory, resolved
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
    ("gpu-count superscript", {**OK, f"{P}gpu-count": "²"}, ("python",), "tensor-fusion.ai/gpu-count '²': must be a whole number from 1 to 128"),
    ("gpu-count arabic-indic", {**OK, f"{P}gpu-count": "٣"}, ("python",), "tensor-fusion.ai/gpu-count '٣': must be a whole number from 1 to 128"),
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
    ("container counts not JSON", {**OK, f"{P}container-gpu-count": "{a: 1}"}, ("a", "b"),
     "tensor-fusion.ai/container-gpu-count '{a: 1}': not JSON; must be a JSON object of inject containers to GPU "
     'counts, such as {"pre-process": 1, "inference": 1}'),
    ("container counts not an object", {**OK, f"{P}container-gpu-count": '[["a", 1]]'}, ("a", "b"),
     "tensor-fusion.ai/container-gpu-count '[[\"a\", 1]]': must be a JSON object of inject containers to GPU counts"),
    ("container counts empty", {**OK, f"{P}container-gpu-count": "{}"}, ("a", "b"),
     "tensor-fusion.ai/container-gpu-count '{}': must be a JSON object of inject containers to GPU counts"),
    ("container counts, no such container", {**OK, f"{P}container-gpu-count": '{"a": 1, "x": 1}'}, ("a", "b"),
     "tensor-fusion.ai/container-gpu-count '{\"a\": 1, \"x\": 1}': no container named x; the pod has a, b"),
    ("container counts, a name twice", {**OK, f"{P}container-gpu-count": '{"a": 1, "a": 2}'}, ("a", "b"),
     "tensor-fusion.ai/container-gpu-count '{\"a\": 1, \"a\": 2}': names container a more than once"),
    ("container counts not whole", {**OK, f"{P}container-gpu-count": '{"a": 0, "b": 1.5, "c": "1", "d": true}'},
     ("a", "b", "c", "d"),
     "tensor-fusion.ai/container-gpu-count '{\"a\": 0, \"b\": 1.5, \"c\": \"1\", \"d\": true}': counts must "
     'be whole numbers from 1 to 128 (a: 0; b: 1.5; c: "1"; d: true)'),
    ("container counts over 128", {**OK, f"{P}container-gpu-count": '{"a": 100, "b": 29}'}, ("a", "b"),
     "tensor-fusion.ai/container-gpu-count '{\"a\": 100, \"b\": 29}': asks for 129 GPUs in all; a pod gets at "
     "most 128, on one node"),
    ("container counts miss an inject container",
     {**OK, f"{P}container-gpu-count": '{"a": 1}', f"{P}inject-container": "a,b"}, ("a", "b"),
     "tensor-fusion.ai/container-gpu-count '{\"a\": 1}': gives no count to b, which tensor-fusion.ai/inject-container "
     "names; every inject container needs its count"),
    ("container counts beyond the inject containers",
     {**OK, f"{P}container-gpu-count": '{"a": 1, "b": 1}', f"{P}inject-container": "a"}, ("a", "b"),
     "tensor-fusion.ai/container-gpu-count '{\"a\": 1, \"b\": 1}': gives a count to b, which "
     "tensor-fusion.ai/inject-container does not name; name it there too, or drop it here"),
    ("container counts against gpu-count", {**OK, f"{P}container-gpu-count": '{"a": 1, "b": 2}', f"{P}gpu-count": "2"},
     ("a", "b"),
     "tensor-fusion.ai/container-gpu-count '{\"a\": 1, \"b\": 2}': asks for 3 GPUs in all but "
     "tensor-fusion.ai/gpu-count is 2: the pod's GPUs are the sum of its containers'; remove "
     "tensor-fusion.ai/gpu-count, or make it 3"),
    ("container counts against gpu-indices", {**OK, f"{P}container-gpu-count": '{"a": 1, "b": 1}', f"{P}gpu-indices": "0"},
     ("a", "b"),
     "tensor-fusion.ai/gpu-indices '0': names 1 GPUs but the pod asks for 2 (the sum of "
     "tensor-fusion.ai/container-gpu-count); give as many indices as GPUs"),
    ("pool name", {**OK, f"{P}gpupool": "Pool_1"}, ("python",),
     "tensor-fusion.ai/gpupool 'Pool_1': must be a Kubernetes name (a DNS-1123 subdomain: lower-case a-z, 0-9, '-')"),
    ("workload name", {**OK, f"{P}workload": "my workload"}, ("python",), "tensor-fusion.ai/workload 'my workload': must be a Kubernetes name"),
    ("profile name", {**OK, f"{P}workload-profile": "UPPER"}, ("python",), "tensor-fusion.ai/workload-profile 'UPPER': must be a Kubernetes name"),
    ("gpu model blank", {**OK, f"{P}gpu-model": "  "}, ("python",), "tensor-fusion.ai/gpu-model '  ': must name a GPU model such as A100"),
    ("placement policy", {**OK, f"{P}placement-policy": "random"}, ("python",),
     "tensor-fusion.ai/placement-policy 'random': must be one of binpack, spread, fragmentation"),
    ("typo key", {**OK, f"{P}vram-requests": "1Gi"}, ("python",),
     "tensor-fusion.ai/vram-requests: unknown tensor-fusion.ai/ annotation; did you mean tensor-fusion.ai/vram-request?"),
    ("unknown key, nothing close", {**OK, f"{P}colour": "blue"}, ("python",),
     "tensor-fusion.ai/colour: unknown tensor-fusion.ai/ annotation; accepted keys: tensor-fusion.ai/auto-limits, "
     "tensor-fusion.ai/auto-replicas, tensor-fusion.ai/auto-requests, tensor-fusion.ai/autoscale, "
     "tensor-fusion.ai/autoscale-target, tensor-fusion.ai/compute-percent-limit, "
     "tensor-fusion.ai/compute-percent-request, tensor-fusion.ai/container-gpu-count, tensor-fusion.ai/dedicated-gpu, "
     "tensor-fusion.ai/eviction-protection, tensor-fusion.ai/generate-workload, "
     "tensor-fusion.ai/gpu-count, tensor-fusion.ai/gpu-indices, tensor-fusion.ai/gpu-model, tensor-fusion.ai/gpupool, tensor-fusion.ai/inject-container, "
     "tensor-fusion.ai/is-local-gpu, tensor-fusion.ai/isolation, tensor-fusion.ai/no-standalone-worker-mode, "
     "tensor-fusion.ai/placement-policy, "
     "tensor-fusion.ai/qos, tensor-fusion.ai/replicas, tensor-fusion.ai/tflops-limit, tensor-fusion.ai/tflops-request, "
     "tensor-fusion.ai/vendor, tensor-fusion.ai/vram-limit, tensor-fusion.ai/vram-request, tensor-fusion.ai/workload, "
     "tensor-fusion.ai/workload-profile"),
    ("protection too long", {**OK, f"{P}eviction-protection": "2h"}, ("python",),
     "tensor-fusion.ai/eviction-protection '2h': must be a duration from 1s to 60m, such as 30m or 90s (longer would "
     "let a pod hold off every QoS)"),
    ("protection not a duration", {**OK, f"{P}eviction-protection": "forever"}, ("python",),
     "tensor-fusion.ai/eviction-protection 'forever': must be a duration from 1s to 60m"),
    ("indices not numbers", {**OK, f"{P}gpu-indices": "0,x"}, ("python",),
     "tensor-fusion.ai/gpu-indices '0,x': must be distinct GPU indices from 0 to 127, separated by commas, such as 0,2"),
    ("indices repeated", {**OK, f"{P}gpu-indices": "1,1"}, ("python",),
     "tensor-fusion.ai/gpu-indices '1,1': must be distinct GPU indices"),
    ("indices against the count", {**OK, f"{P}gpu-indices": "0,1", f"{P}gpu-count": "3"}, ("python",),
     "tensor-fusion.ai/gpu-indices '0,1': names 2 GPUs but the pod asks for 3 (tensor-fusion.ai/gpu-count); give as "
     "many indices as GPUs"),
    ("another vendor", {**OK, f"{P}vendor": "amd"}, ("python",),
     "tensor-fusion.ai/vendor 'amd': only nvidia GPUs are served by tensor-fusion here (accepted: nvidia)"),
    ("isolation not a mode", {**OK, f"{P}isolation": "strict"}, ("python",),
     "tensor-fusion.ai/isolation 'strict': must be one of shared, soft, hard, partitioned"),
    ("partitioned without a MIG profile", {**OK, f"{P}isolation": "partitioned"}, ("python",),
     "tensor-fusion.ai/isolation 'partitioned': needs tensor-fusion.ai/gpu-model naming a MIG profile"),
    ("partitioned with a whole-GPU model", {**OK, f"{P}isolation": "partitioned", f"{P}gpu-model": "A100"}, ("python",),
     "tensor-fusion.ai/isolation 'partitioned': a hardware partition is a MIG unit: tensor-fusion.ai/gpu-model must "
     "name a MIG profile such as 1g.10gb or A100 3g.40gb (it is 'A100')"),
    ("a MIG profile with soft", {**OK, f"{P}isolation": "soft", f"{P}gpu-model": "1g.10gb"}, ("python",),
     "tensor-fusion.ai/isolation 'soft': tensor-fusion.ai/gpu-model '1g.10gb' is a MIG unit, a hardware partition: "
     "isolation must be partitioned, or unset"),
    ("exponent too large", {f"{P}vram-limit": "1e31"}, ("python",), "tensor-fusion.ai/vram-limit '1e31': exponent must be within ±30"),
    ("exponent too small", {f"{P}tflops-limit": "1e-31"}, ("python",),
     "tensor-fusion.ai/tflops-limit '1e-31': exponent must be within ±30"),
    ("huge value is shortened", {**OK, f"{P}qos": "x" * 5000}, ("python",), "'" + "x" * 120 + "…': must be one of"),
    ("dedicated-gpu text", {**OK, f"{P}dedicated-gpu": "yes"}, ("python",),
     "tensor-fusion.ai/dedicated-gpu 'yes': must be \"true\" or \"false\""),
    ("dedicated-gpu with a share", {f"{P}dedicated-gpu": "true", f"{P}tflops-request": "10"}, ("python",),
     "tensor-fusion.ai/tflops-request '10': not allowed with tensor-fusion.ai/dedicated-gpu: \"true\" (whole GPUs); "
     "remove one"),
    ("percent not a number", {**OK, f"{P}compute-percent-request": "half"}, ("python",),
     "tensor-fusion.ai/compute-percent-request 'half': must be a percentage of one GPU's compute above 0 and at most "
     "100, such as 50 or 12.5"),
    ("percent over 100", {**OK, f"{P}compute-percent-limit": "150"}, ("python",),
     "tensor-fusion.ai/compute-percent-limit '150': must be a percentage of one GPU's compute above 0 and at most 100"),
    ("percent zero", {**OK, f"{P}compute-percent-request": "0"}, ("python",),
     "tensor-fusion.ai/compute-percent-request '0': must be a percentage"),
    ("percent too fine", {**OK, f"{P}compute-percent-request": "12.3456"}, ("python",),
     "tensor-fusion.ai/compute-percent-request '12.3456': must be a percentage"),
    ("percent beside TFLOPS", {f"{P}compute-percent-request": "50", f"{P}tflops-request": "10"}, ("python",),
     "tensor-fusion.ai/compute-percent-request '50': not with tensor-fusion.ai/tflops-request: compute is asked in "
     "TFLOPS or in percent of a GPU, one of the two"),
    ("percent request, TFLOPS limit", {f"{P}compute-percent-request": "50", f"{P}tflops-limit": "100"}, ("python",),
     "tensor-fusion.ai/compute-percent-request '50%': from the pod's annotations, not with a TFLOPS limit from the "
     "pod's annotations: a request and a limit in different forms compare nothing; ask both in TFLOPS or both in "
     "percent of a GPU"),
    ("percent request over its limit", {f"{P}compute-percent-request": "60", f"{P}compute-percent-limit": "50"},
     ("python",),
     "tensor-fusion.ai/compute-percent-request '60%': must not exceed the compute-percent limit 50% (request from the "
     "pod's annotations, limit from the pod's annotations)"),
    ("percent with whole GPUs", {f"{P}dedicated-gpu": "true", f"{P}compute-percent-request": "50"}, ("python",),
     "tensor-fusion.ai/compute-percent-request '50': not allowed with tensor-fusion.ai/dedicated-gpu: \"true\" (whole "
     "GPUs); remove one"),
    ("percent of a MIG unit", {**OK, f"{P}compute-percent-request": "50", f"{P}gpu-model": "1g.10gb",
                               f"{P}isolation": "partitioned"}, ("python",),
     "tensor-fusion.ai/compute-percent-request '1g.10gb': tensor-fusion.ai/gpu-model names a MIG unit, granted whole: "
     "its size is its share; remove the percent"),
    ("percent under compute autoscaling", {**OK, f"{P}compute-percent-request": "50", f"{P}autoscale": "true"},
     ("python",),
     "tensor-fusion.ai/compute-percent-request: autoSetRequests moves compute in TFLOPS, not in percent: ask compute in "
     "TFLOPS (tflops-request), or aim the layer at vram only (targetResource: vram, autoscale-target: vram)"),
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
    ({"resources": {"requests": "lots"}}, "spec.resources.requests 'lots': must be an object with tflops (or computePercent) and vram"),
    ({"resources": {"requests": []}}, "spec.resources.requests '[]': must be an object with tflops (or computePercent) and vram"),
    ({"resources": {"limits": 4}}, "spec.resources.limits '4': must be an object with tflops (or computePercent) and vram"),
    ({"poolName": "Bad Pool"}, "spec.poolName 'Bad Pool': must be a Kubernetes name"),
    ({"gpuModel": ""}, "spec.gpuModel '': must be a non-empty string"),
    ({"nodeAffinity": "zone-a"}, "spec.nodeAffinity 'zone-a': must be a core/v1 NodeAffinity object"),
    ({"colour": "blue"}, "spec.colour: unknown field; accepted:"),
    ({"isolation": "Hard"}, "spec.isolation 'Hard': must be one of shared, soft, hard, partitioned"),
    ({"autoScalingConfig": {"autoSetLimits": {"enable": "yes"}}}, "spec.autoScalingConfig.autoSetLimits.enable 'yes': must be true or false"),
    ({"autoScalingConfig": {"autoSetLimits": {"targetResource": "gpu"}}},
     "spec.autoScalingConfig.autoSetLimits.targetResource 'gpu': must be one of all, tflops, vram"),
    ({"autoScalingConfig": {"autoSetLimits": {"maxRatioToRequests": "five"}}},
     "spec.autoScalingConfig.autoSetLimits.maxRatioToRequests 'five': must be a ratio of 1 or more, such as 5.0 or 500% "
     "(a limit is never below its request)"),
    ({"autoScalingConfig": {"autoSetLimits": {"maxRatioToRequests": "0.5"}}},
     "spec.autoScalingConfig.autoSetLimits.maxRatioToRequests '0.5': must be a ratio of 1 or more"),
    ({"autoScalingConfig": {"autoSetReplicas": {"scaleUpCoolDownTime": "soon"}}},
     "spec.autoScalingConfig.autoSetReplicas.scaleUpCoolDownTime 'soon': must be a duration from 0s to 365d, "
     "such as 0s, 30s, 5m or 1h"),
    ({"autoScalingConfig": {"autoSetLimits": {"evaluationPeriod": "0s"}}},
     "spec.autoScalingConfig.autoSetLimits.evaluationPeriod '0s': must be a duration above 0 and at most 365d, "
     "such as 15s, 5m, 1h or 1d"),
    ({"autoScalingConfig": {"autoSetRequests": {"aggregationPeriod": "53w"}}},
     "spec.autoScalingConfig.autoSetRequests.aggregationPeriod '53w': must be a duration above 0 and at most 365d"),
    ({"autoScalingConfig": {"autoSetRequests": {"aggregationPeriod": "1d\n"}}},
     "spec.autoScalingConfig.autoSetRequests.aggregationPeriod '1d\\n': must be a duration above 0"),  # no newline
    ({"autoScalingConfig": {"autoSetReplicas": {"evaluationPeriod": "5 m"}}},
     "spec.autoScalingConfig.autoSetReplicas.evaluationPeriod '5 m': must be a duration above 0"),
    ({"autoScalingConfig": {"autoSetRequests": {"percentileForAutoRequests": "99"}}},
     "spec.autoScalingConfig.autoSetRequests.percentileForAutoRequests '99': must be a ratio above 0 and at most 1, "
     "such as 0.8 or 80%"),
    ({"autoScalingConfig": {"autoSetRequests": {"percentileForAutoRequests": "0%"}}},
     "spec.autoScalingConfig.autoSetRequests.percentileForAutoRequests '0%': must be a ratio above 0 and at most 1"),
    ({"autoScalingConfig": {"autoSetReplicas": {"targetTFlopsOfLimits": "120%"}}},
     "spec.autoScalingConfig.autoSetReplicas.targetTFlopsOfLimits '120%': must be a ratio above 0 and at most 1"),
    ({"autoScalingConfig": {"autoSetLimits": {"ignoredDeltaRange": "1"}}},
     "spec.autoScalingConfig.autoSetLimits.ignoredDeltaRange '1': must be a ratio from 0 up to (not including) 1, "
     "such as 0.05 or 5%"),
    ({"autoScalingConfig": {"autoSetLimits": {"extraTFlopsBufferRatio": ".2"}}},
     "spec.autoScalingConfig.autoSetLimits.extraTFlopsBufferRatio '.2': must be a ratio of 0 or more, such as 0.15 or 15%"),
    ({"autoScalingConfig": {"autoSetRequests": {"extraBufferRatio": "-10%"}}},
     "spec.autoScalingConfig.autoSetRequests.extraBufferRatio '-10%': must be a ratio of 0 or more"),
    ({"autoScalingConfig": {"autoSetLimits": {"scaleUpStep": "0"}}},
     "spec.autoScalingConfig.autoSetLimits.scaleUpStep '0': must be a ratio above 0, such as 1.0 or 100% "
     "(the most one raise adds, as a share of the current limit)"),
    ({"autoScalingConfig": {"autoSetReplicas": {"scaleUpStep": "0.2"}}},
     "spec.autoScalingConfig.autoSetReplicas.scaleUpStep '0.2': must be a whole number of replicas from 1 to 1000000, "
     "such as 1 or 2, or a whole percentage of the current replicas from 1%, such as 50%"),
    ({"autoScalingConfig": {"autoSetReplicas": {"scaleDownStep": "0%"}}},
     "spec.autoScalingConfig.autoSetReplicas.scaleDownStep '0%': must be a whole number of replicas from 1"),
    ({"autoScalingConfig": {"autoSetReplicas": {"scaleDownStep": "1000001"}}},
     "spec.autoScalingConfig.autoSetReplicas.scaleDownStep '1000001': must be a whole number of replicas from 1"),
    ({"autoScalingConfig": {"autoSetLimits": {"prediction": {"predictionPeriod": "0s"}}}},
     "spec.autoScalingConfig.autoSetLimits.prediction.predictionPeriod '0s': must be a duration above 0"),
    ({"autoScalingConfig": {"autoSetLimits": {"prediction": "yes"}}},
     "spec.autoScalingConfig.autoSetLimits.prediction 'yes': must be an object"),
    ({"autoScalingConfig": {"autoSetLimits": "on"}}, "spec.autoScalingConfig.autoSetLimits 'on': must be an object"),
    ({"autoScalingConfig": []}, "spec.autoScalingConfig '[]': must be an object"),
    ({"autoScalingConfig": {"autoSetLimits": {"evaluationPeriod": "9" * 5000 + "s"}}},
     "spec.autoScalingConfig.autoSetLimits.evaluationPeriod '" + "9" * 120 + "…': must be a duration above 0"),
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


def test_every_auto_scaling_problem_is_reported_at_once() -> None:
    auto = {
        "autoSetLimits": {"scaleUpStep": "-1", "colour": "red"},
        "autoSetRequests": {"percentileForAutoRequests": "1.5", "aggregationPeriod": "0s"},
        "autoSetReplicas": {"scaleDownStep": "half"},
    }
    with pytest.raises(DomainError) as caught:
        parse_spec({"autoScalingConfig": auto}, where="spec")
    assert [e.key.removeprefix("spec.autoScalingConfig.") for e in caught.value.errors] == [
        "autoSetLimits.colour", "autoSetLimits.scaleUpStep", "autoSetReplicas.scaleDownStep",
        "autoSetRequests.percentileForAutoRequests", "autoSetRequests.aggregationPeriod",
    ]  # fmt: skip


RESOLVED: dict[str, Any] = {
    "version": "v1", "pool": "p", "containers": ["c"], "gpuCount": 1, "tflopsRequest": "1", "tflopsLimit": "1",
    "vramRequest": "1Gi", "vramLimit": "1Gi", "qos": "low", "isLocalGPU": False, "noStandaloneWorkerMode": False,
    "gpuModel": None, "workload": None, "generateWorkload": None, "workloadProfile": None, "replicas": None,
    "placementPolicy": None, "nodeAffinity": None, "autoScalingConfig": {},
}  # fmt: skip
INVENTORY: dict[str, Any] = {
    "version": "v1", "node": "n", "pool": "p", "slicesPerGpu": 4, "backend": "none", "heartbeat": "t",
    "gpus": [{"uuid": "GPU-1", "index": 0, "model": "T4", "tflops": "65", "vram": "15109Mi", "health": "Healthy",
              "numa": None, "mig": False}],
}  # fmt: skip
ALLOCATION: dict[str, Any] = {
    "version": "v1", "podUID": "u", "node": "n", "pool": "p", "qos": "low", "containers": ["c"], "boundAt": "t",
    "gpus": [{"uuid": "GPU-1", "index": 0, "tflopsRequest": "1", "tflopsLimit": "1", "vramRequest": "1Gi",
              "vramLimit": "1Gi", "gpuTflops": "65"}],
}  # fmt: skip
GONE = object()


def changed(doc: dict[str, Any], *path: str | int, to: object) -> str:
    """The JSON text of ``doc`` with the value at ``path`` replaced by ``to`` (removed when GONE)."""
    copy = json.loads(json.dumps(doc))
    parent = copy
    for step in path[:-1]:
        parent = parent[step]
    if to is GONE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = to
    return json.dumps(copy)


RR, INV, ALLOC = "tensor-fusion.ai/resolved-request", "tensor-fusion.ai/gpu-inventory", "tensor-fusion.ai/allocation"
CATALOG_ENTRY = {"key": "A10G", "tflops": "70"}

OTHER_CASES: list[tuple[str, Callable[[], object], str]] = [
    ("catalog entry not a mapping", lambda: parse_overrides(["A10G"]),
     "gpu catalog[0] 'A10G': must be a mapping with key and tflops"),
    ("catalog key missing", lambda: parse_overrides([{"tflops": "70"}]), "gpu catalog[0].key: must be a non-empty model name"),
    ("catalog key only separators", lambda: parse_overrides([{**CATALOG_ENTRY, "key": " - "}]),
     "gpu catalog[0].key ' - ': must be a non-empty model name"),
    ("catalog key not text", lambda: parse_overrides([{**CATALOG_ENTRY, "key": 10}]),
     "gpu catalog[0].key '10': must be a non-empty model name"),
    ("catalog tflops", lambda: parse_overrides([{**CATALOG_ENTRY, "tflops": "fast"}]),
     "gpu catalog[0].tflops 'fast': not a Kubernetes quantity such as 10, 2.5, 500m, 4Gi, 4096Mi, 4G or 1e3"),
    ("catalog tflops exponent", lambda: parse_overrides([{**CATALOG_ENTRY, "tflops": "1e31"}]),
     "gpu catalog[0].tflops '1e31': exponent must be within ±30"),
    ("catalog tflops negative", lambda: parse_overrides([{**CATALOG_ENTRY, "tflops": "-70"}]),
     "gpu catalog[0].tflops '-70': must not be negative"),
    ("catalog memory negative", lambda: parse_overrides([{**CATALOG_ENTRY, "memoryMiB": -1}]),
     "gpu catalog[0].memoryMiB '-1': must be a whole number ≥ 0"),
    ("catalog memory boolean", lambda: parse_overrides([{**CATALOG_ENTRY, "memoryMiB": True}]),
     "gpu catalog[0].memoryMiB 'True': must be a whole number ≥ 0"),
    ("catalog memory fractional", lambda: parse_overrides([{**CATALOG_ENTRY, "memoryMiB": 1.5}]),
     "gpu catalog[0].memoryMiB '1.5': must be a whole number ≥ 0"),
    ("catalog nvml names not a list", lambda: parse_overrides([{**CATALOG_ENTRY, "nvmlNames": "NVIDIA A10G"}]),
     "gpu catalog[0].nvmlNames 'NVIDIA A10G': must be a list of strings"),
    ("catalog aliases not strings", lambda: parse_overrides([{**CATALOG_ENTRY, "aliases": ["a10g", 10]}]),
     "gpu catalog[0].aliases \"['a10g', 10]\": must be a list of strings"),
    ("catalog names the file and every entry", lambda: parse_overrides([CATALOG_ENTRY, {}, 7], source="/etc/tf/catalog.yaml"),
     "/etc/tf/catalog.yaml[1].key: must be a non-empty model name; "
     "/etc/tf/catalog.yaml[2] '7': must be a mapping with key and tflops"),
    ("contract unknown version", lambda: resolved.decode(changed(RESOLVED, "version", to="v2")),
     f"{RR}.version 'v2': unsupported; this build reads v1"),
    ("contract version missing", lambda: inventory.decode(changed(INVENTORY, "version", to=GONE)), f"{INV}.version: missing"),
    ("contract version not text", lambda: allocation.decode(changed(ALLOCATION, "version", to=1)),
     f"{ALLOC}.version '1': must be a string"),
    ("contract field missing", lambda: resolved.decode(changed(RESOLVED, "qos", to=GONE)), f"{RR}.qos: missing"),
    ("contract nested field missing", lambda: inventory.decode(changed(INVENTORY, "gpus", 0, "uuid", to=GONE)),
     f"{INV}.gpus[0].uuid: missing"),
    ("contract unknown field", lambda: allocation.decode(changed(ALLOCATION, "gpus", 0, "colour", to="red")),
     f"{ALLOC}.gpus[0].colour: unknown field"),
    ("contract gpu count zero", lambda: resolved.decode(changed(RESOLVED, "gpuCount", to=0)),
     f"{RR}.gpuCount '0': must be a whole number from 1 to 128"),
    ("contract gpu count huge", lambda: resolved.decode(changed(RESOLVED, "gpuCount", to=129)),
     f"{RR}.gpuCount '129': must be a whole number from 1 to 128"),
    ("contract gpu count text", lambda: resolved.decode(changed(RESOLVED, "gpuCount", to="2")),
     f"{RR}.gpuCount '2': must be a whole number"),
    ("contract replicas negative", lambda: resolved.decode(changed(RESOLVED, "replicas", to=-1)),
     f"{RR}.replicas '-1': must be a whole number from 0 to 1000000"),
    ("contract slices zero", lambda: inventory.decode(changed(INVENTORY, "slicesPerGpu", to=0)),
     f"{INV}.slicesPerGpu '0': must be ≥ 1"),
    ("contract index negative", lambda: allocation.decode(changed(ALLOCATION, "gpus", 0, "index", to=-1)),
     f"{ALLOC}.gpus[0].index '-1': must be ≥ 0"),
    ("contract quantity negative", lambda: allocation.decode(changed(ALLOCATION, "gpus", 0, "vramLimit", to="-1Gi")),
     f"{ALLOC}.gpus[0].vramLimit '-1Gi': must not be negative"),
    ("contract quantity exponent", lambda: inventory.decode(changed(INVENTORY, "gpus", 0, "tflops", to="1e31")),
     f"{INV}.gpus[0].tflops '1e31': exponent must be within ±30"),
    ("contract choice", lambda: inventory.decode(changed(INVENTORY, "gpus", 0, "health", to="Sick")),
     f"{INV}.gpus[0].health 'Sick': must be one of Healthy, Unhealthy"),
    ("quantity exponent bound", lambda: quantity.parse("5E+31", key="tflops"), "tflops '5E+31': exponent must be within ±30"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "message"), [c[1:] for c in OTHER_CASES], ids=[c[0] for c in OTHER_CASES])
def test_each_catalog_contract_and_quantity_error_message(call: Callable[[], object], message: str) -> None:
    with pytest.raises(DomainError) as caught:
        call()
    assert str(caught.value) == message


def test_the_contract_documents_above_are_valid() -> None:
    resolved.decode(json.dumps(RESOLVED))
    inventory.decode(json.dumps(INVENTORY))
    allocation.decode(json.dumps(ALLOCATION))
    parse_overrides([CATALOG_ENTRY])
