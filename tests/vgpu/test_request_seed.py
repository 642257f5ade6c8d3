"""The seed documents' examples parse to exactly the request a user expects."""

from __future__ import annotations

from vgpu.names import Qos
from vgpu.profile import Resources, to_crd
from vgpu.request import GpuRequest, resolve

from .builders import pod, pod_from_deployment, profile

GI = 1024**3


def test_seed_deployment_alone() -> None:
    assert resolve(pod_from_deployment("deployment-en.yaml")) == GpuRequest(
        pool="default-pool", containers=("python",), gpu_count=1,
        tflops_request=10_000, tflops_limit=20_000, vram_request=4 * GI, vram_limit=4 * GI,
        qos=Qos.MEDIUM, is_local_gpu=True, workload="pytorch-example", generate_workload=True,
        workload_profile="default-profile", replicas=1,
    )  # fmt: skip


def test_seed_deployment_with_seed_profile_annotations_win_profile_fills_gaps() -> None:
    got = resolve(pod_from_deployment("deployment-en.yaml"), profile=profile("workloadprofile-en.yaml"))
    assert (got.tflops_request, got.tflops_limit, got.vram_request) == (10_000, 20_000, 4 * GI)
    assert got.gpu_model == "A100"  # only the profile names a model: honoured, not dropped


def test_english_and_chinese_profiles_agree() -> None:
    expected_resources = Resources(tflops_request=5_000, tflops_limit=15_000, vram_request=3 * GI, vram_limit=3 * GI)
    for name in ("workloadprofile-en.yaml", "workloadprofile-zh.yaml"):
        spec = profile(name)
        assert spec.resources == expected_resources
        assert (spec.replicas, spec.is_local_gpu, spec.pool_name, spec.qos) == (1, True, "default-pool", Qos.MEDIUM)
        assert (spec.gpu_count, spec.gpu_model, spec.auto_scaling) == (1, "A100", {})


def test_profile_only_pod_takes_every_profile_value() -> None:
    got = resolve(pod({"tensor-fusion.ai/workload-profile": "example"}), profile=profile("workloadprofile-zh.yaml"))
    assert got == GpuRequest(
        pool="default-pool", containers=("python",), gpu_count=1,
        tflops_request=5_000, tflops_limit=15_000, vram_request=3 * GI, vram_limit=3 * GI,
        qos=Qos.MEDIUM, gpu_model="A100", is_local_gpu=True, workload_profile="example", replicas=1,
    )  # fmt: skip


def test_full_autoscaling_profile_is_kept_whole() -> None:
    spec = profile("workloadprofile-autoscaling.yaml")
    got = resolve(pod({"tensor-fusion.ai/auto-requests": "true"}), profile=spec)
    assert got.tflops_limit == 165_160 and got.tflops_request == 100
    assert got.gpu_count == 4 and got.qos is Qos.CRITICAL and got.pool == "training"
    assert got.node_affinity is not None
    limits = got.auto_scaling["autoSetLimits"]
    assert limits["prediction"] == {
        "enable": True,
        "model": "lstm",
        "historyDataPeriod": "7d",
        "predictionPeriod": "1h",
    }
    assert got.auto_scaling["autoSetReplicas"]["scaleDownCoolDownTime"] == "30m"
    assert got.auto_scaling["autoSetRequests"]["enable"] is True  # the annotation switched it on
    assert got.auto_scaling["autoSetRequests"]["percentileForAutoRequests"] == "0.99"  # the rest kept


def test_profile_crd_round_trip() -> None:
    from vgpu.profile import parse_spec

    spec = profile("workloadprofile-autoscaling.yaml")
    assert parse_spec(to_crd(spec), where="again") == spec
