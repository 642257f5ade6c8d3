"""Annotation > workload > WorkloadProfile > pool defaults > built-in, field by field."""

from __future__ import annotations

import pytest

from vgpu.contract import resolved
from vgpu.errors import DomainError
from vgpu.names import IsolationMode, Qos
from vgpu.profile import ProfileSpec, Resources, parse_spec, to_crd
from vgpu.request import charged, referenced_profile, referenced_workload, resolve

from .builders import pod

GI = 1024**3
PROFILE = ProfileSpec(
    resources=Resources(tflops_request=5_000, tflops_limit=15_000, vram_request=3 * GI),
    pool_name="profile-pool", qos=Qos.HIGH, is_local_gpu=True, gpu_model="A100", gpu_count=2,
)  # fmt: skip
POOLS = {
    "default-pool": ProfileSpec(resources=Resources(tflops_request=1_000, vram_request=GI), qos=Qos.LOW),
    "profile-pool": ProfileSpec(resources=Resources(vram_limit=8 * GI), gpu_model="T4"),
}


def test_builtin_defaults() -> None:
    got = resolve(pod({"tensor-fusion.ai/vram-request": "1Gi"}))
    assert (got.pool, got.qos, got.gpu_count, got.is_local_gpu, got.tflops_request) == (
        "default-pool",
        Qos.MEDIUM,
        1,
        False,
        0,
    )
    assert got.vram_limit == GI  # limit defaults to request


def test_request_defaults_to_limit() -> None:
    got = resolve(pod({"tensor-fusion.ai/tflops-limit": "20"}))
    assert (got.tflops_request, got.tflops_limit) == (20_000, 20_000)


def test_profile_values_are_honoured_not_overwritten() -> None:
    got = resolve(pod({"tensor-fusion.ai/tflops-limit": "30"}), profile=PROFILE, pools=POOLS)
    assert got.pool == "profile-pool"  # TensorFusion overwrote the profile's pool with the default one
    assert got.is_local_gpu is True  # ... and its isLocalGPU
    assert (got.tflops_request, got.tflops_limit) == (5_000, 30_000)
    assert (got.vram_request, got.vram_limit) == (3 * GI, 8 * GI)  # the pool fills what the profile left
    assert (got.qos, got.gpu_model, got.gpu_count) == (Qos.HIGH, "A100", 2)


def test_annotation_false_beats_profile_true() -> None:
    got = resolve(pod({"tensor-fusion.ai/is-local-gpu": "false"}), profile=PROFILE)
    assert got.is_local_gpu is False


def test_pool_defaults_apply_when_nothing_else_is_set() -> None:
    got = resolve(pod({}), pools=POOLS)
    assert (got.tflops_request, got.vram_request, got.qos) == (1_000, GI, Qos.LOW)


def test_a_dedicated_pod_takes_whole_gpus_and_no_layers_share() -> None:
    """The grant at bind is each GPU's capacity; a profile's or pool's share is a default for shared pods."""
    got = resolve(pod({"tensor-fusion.ai/dedicated-gpu": "true"}), profile=PROFILE, pools=POOLS)
    assert got.dedicated_gpu is True
    assert (got.tflops_request, got.tflops_limit, got.vram_request, got.vram_limit) == (0, 0, 0, 0)
    assert (got.gpu_count, got.gpu_model, got.qos) == (2, "A100", Qos.HIGH)  # every other field layers as usual
    assert got.describe() == "2× whole GPU, A100"
    assert resolve(pod({"tensor-fusion.ai/dedicated-gpu": "false"}), pools=POOLS).dedicated_gpu is False


def test_workload_spec_sits_between_annotations_and_profile() -> None:
    workload = ProfileSpec(resources=Resources(tflops_request=7_000), qos=Qos.CRITICAL)
    annotations = {
        "tensor-fusion.ai/generate-workload": "false",
        "tensor-fusion.ai/workload": "w",
        "tensor-fusion.ai/qos": "low",
    }
    got = resolve(pod(annotations), workload=workload, profile=PROFILE)
    assert (got.tflops_request, got.qos, got.gpu_model) == (7_000, Qos.LOW, "A100")


def test_unknown_pool_is_an_error_only_when_pools_are_known() -> None:
    annotations = {"tensor-fusion.ai/gpupool": "nowhere", "tensor-fusion.ai/vram-request": "1Gi"}
    assert resolve(pod(annotations)).pool == "nowhere"
    with pytest.raises(DomainError, match="no such GPU pool; known: default-pool, profile-pool"):
        resolve(pod(annotations), pools=POOLS)


def test_references_for_the_caller_to_fetch() -> None:
    p = pod(
        {
            "tensor-fusion.ai/workload-profile": "prof",
            "tensor-fusion.ai/workload": "w",
            "tensor-fusion.ai/generate-workload": "false",
        }
    )
    assert (referenced_profile(p), referenced_workload(p)) == ("prof", "w")
    assert referenced_workload(pod({"tensor-fusion.ai/workload": "w"})) is None


def test_inject_container_defaults_to_the_only_container_and_dedupes() -> None:
    assert resolve(pod({"tensor-fusion.ai/vram-request": "1Gi"}, ("main",))).containers == ("main",)
    got = resolve(
        pod({"tensor-fusion.ai/vram-request": "1Gi", "tensor-fusion.ai/inject-container": "a, b,a"}, ("a", "b"))
    )
    assert got.containers == ("a", "b")


def test_auto_flags_set_enable_bits() -> None:
    got = resolve(
        pod(
            {
                "tensor-fusion.ai/vram-request": "1Gi",
                "tensor-fusion.ai/auto-limits": "true",
                "tensor-fusion.ai/auto-replicas": "false",
            }
        )
    )
    assert got.auto_scaling == {"autoSetLimits": {"enable": True}, "autoSetReplicas": {"enable": False}}


LOCAL = "tensor-fusion.ai/is-local-gpu"
NO_STANDALONE = "tensor-fusion.ai/no-standalone-worker-mode"


def test_standalone_worker_mode_defaults_to_embedded() -> None:
    assert resolve(pod({"tensor-fusion.ai/vram-request": "1Gi"})).no_standalone_worker_mode is False


def test_profile_standalone_worker_mode_is_honoured_in_local_mode() -> None:
    standalone = ProfileSpec(resources=Resources(vram_request=GI), is_local_gpu=True, standalone_worker_mode=True)
    assert resolve(pod({}), profile=standalone).no_standalone_worker_mode is True
    assert resolve(pod({}), workload=standalone).no_standalone_worker_mode is True
    pools = {"default-pool": standalone}
    assert resolve(pod({}), pools=pools).no_standalone_worker_mode is True


def test_standalone_annotation_beats_profile_both_ways() -> None:
    local = {LOCAL: "true"}
    on = ProfileSpec(resources=Resources(vram_request=GI), standalone_worker_mode=True)
    off = ProfileSpec(resources=Resources(vram_request=GI), standalone_worker_mode=False)
    assert resolve(pod({**local, NO_STANDALONE: "false"}), profile=on).no_standalone_worker_mode is False
    assert resolve(pod({**local, NO_STANDALONE: "true"}), profile=off).no_standalone_worker_mode is True
    # the profile beats the pool default
    pools = {"default-pool": on}
    assert resolve(pod(local), profile=off, pools=pools).no_standalone_worker_mode is False


def test_profile_standalone_worker_mode_needs_local_mode_too() -> None:
    standalone = ProfileSpec(resources=Resources(vram_request=GI), is_local_gpu=True, standalone_worker_mode=True)
    with pytest.raises(DomainError) as caught:
        resolve(pod({LOCAL: "false"}), profile=standalone)
    assert str(caught.value) == (
        'standaloneWorkerMode: true in the WorkloadProfile; only allowed with tensor-fusion.ai/is-local-gpu: "true" '
        "(or isLocalGPU: true)"
    )
    pools = {"default-pool": ProfileSpec(resources=Resources(vram_request=GI), standalone_worker_mode=True)}
    with pytest.raises(DomainError, match="standaloneWorkerMode: true in pool default-pool defaults; only allowed"):
        resolve(pod({}), pools=pools)


def test_isolation_layers_like_every_field_and_survives_the_resolved_contract() -> None:
    pools = {**POOLS, "default-pool": ProfileSpec(resources=Resources(vram_request=GI), isolation=IsolationMode.SOFT)}
    assert resolve(pod({"tensor-fusion.ai/vram-request": "1Gi"})).isolation is None  # the GPU's own mode
    assert resolve(pod({}), pools=pools).isolation is IsolationMode.SOFT
    profile = ProfileSpec(resources=Resources(vram_request=GI), isolation=IsolationMode.HARD)
    assert resolve(pod({}), profile=profile, pools=pools).isolation is IsolationMode.HARD
    got = resolve(pod({"tensor-fusion.ai/isolation": "shared"}), profile=profile, pools=pools)
    assert got.isolation is IsolationMode.SHARED
    assert resolved.decode(resolved.encode(got)).isolation is IsolationMode.SHARED
    plain = resolve(pod({"tensor-fusion.ai/vram-request": "1Gi"}))
    assert "isolation" not in resolved.encode(plain)  # what older readers never saw
    assert resolved.decode(resolved.encode(plain)).isolation is None
    assert parse_spec({"isolation": "partitioned"}, where="spec").isolation is IsolationMode.PARTITIONED
    assert to_crd(profile)["isolation"] == "hard"


def test_the_nvidia_vendor_is_accepted_whatever_its_case() -> None:
    assert (
        resolve(pod({"tensor-fusion.ai/vram-request": "1Gi", "tensor-fusion.ai/vendor": "NVIDIA"})).vram_request == GI
    )


def test_eviction_protection_is_whole_seconds_and_survives_the_resolved_contract() -> None:
    got = resolve(pod({"tensor-fusion.ai/vram-request": "1Gi", "tensor-fusion.ai/eviction-protection": "1m30.5s"}))
    assert got.eviction_protection_s == 91  # rounded up: never less than asked
    assert resolved.decode(resolved.encode(got)).eviction_protection_s == 91
    plain = resolve(pod({"tensor-fusion.ai/vram-request": "1Gi"}))
    assert "evictionProtection" not in resolved.encode(plain) and plain.eviction_protection_s is None


def test_gpu_indices_set_the_count_and_survive_the_resolved_contract() -> None:
    got = resolve(pod({"tensor-fusion.ai/vram-request": "1Gi", "tensor-fusion.ai/gpu-indices": "2, 0"}))
    assert (got.gpu_indices, got.gpu_count) == ((2, 0), 2)
    assert resolved.decode(resolved.encode(got)).gpu_indices == (2, 0)
    assert "gpuIndices" not in resolved.encode(resolve(pod({"tensor-fusion.ai/vram-request": "1Gi"})))


def test_compute_percent_from_the_pod_or_a_lower_layer() -> None:
    asked = resolve(pod({"tensor-fusion.ai/compute-percent-request": "12.5", "tensor-fusion.ai/vram-request": "1Gi"}))
    assert (asked.compute_percent_request, asked.compute_percent_limit) == (12_500, 12_500)  # the limit defaults
    assert (asked.tflops_request, asked.tflops_limit) == (0, 0)  # charged by the webhook, which knows the pool
    assert asked.describe() == "12.5% of the GPU / 1Gi per GPU (limit 12.5% / 1Gi)"
    percent_profile = ProfileSpec(resources=Resources(percent_request=25_000, percent_limit=50_000, vram_request=GI))
    inherited = resolve(pod({}), profile=percent_profile)
    assert (inherited.compute_percent_request, inherited.compute_percent_limit) == (25_000, 50_000)
    # the pod's TFLOPS replace the profile's percent, side by side (both sides here)
    own = resolve(
        pod({"tensor-fusion.ai/tflops-request": "10", "tensor-fusion.ai/tflops-limit": "20"}), profile=percent_profile
    )
    assert (own.compute_percent_request, own.tflops_request, own.tflops_limit) == (None, 10_000, 20_000)
    # and the pod's percent replaces the profile's TFLOPS, side by side
    over = resolve(
        pod({"tensor-fusion.ai/compute-percent-request": "40", "tensor-fusion.ai/compute-percent-limit": "60"}),
        profile=PROFILE,
    )
    assert (over.compute_percent_request, over.compute_percent_limit, over.tflops_request) == (40_000, 60_000, 0)
    # one side only leaves the sides in two forms: refused, naming both origins
    with pytest.raises(DomainError, match="from the pod's annotations, not with a TFLOPS request from the WorkloadP"):
        resolve(pod({"tensor-fusion.ai/compute-percent-limit": "40"}), profile=PROFILE)


def test_a_percent_is_charged_as_its_share_of_the_base_gpu() -> None:
    req = resolve(
        pod({"tensor-fusion.ai/compute-percent-request": "50", "tensor-fusion.ai/compute-percent-limit": "75"})
    )
    got = charged(req, 312_000)
    assert (got.tflops_request, got.tflops_limit) == (156_000, 234_000)
    assert charged(resolve(pod({"tensor-fusion.ai/tflops-request": "10"})), 312_000).tflops_request == 10_000
    assert resolved.decode(resolved.encode(got)) == got


def test_the_profile_crd_carries_compute_percent() -> None:
    spec = parse_spec(
        {"resources": {"requests": {"computePercent": 25}, "limits": {"computePercent": "50"}}}, where="s"
    )
    assert (spec.resources.percent_request, spec.resources.percent_limit) == (25_000, 50_000)
    assert parse_spec(to_crd(spec), where="s") == spec
    with pytest.raises(DomainError, match="compute is asked in TFLOPS or in percent of a GPU, one of the two"):
        parse_spec({"resources": {"requests": {"computePercent": 25, "tflops": "10"}}}, where="s")
