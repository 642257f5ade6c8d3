"""Arbitrary input never escapes as anything but our DomainError."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vgpu.errors import DomainError
from vgpu.names import Annotation
from vgpu.profile import parse_spec
from vgpu.request import GpuRequest, PodView, resolve

KEYS = st.sampled_from([a.value for a in Annotation] + ["tensor-fusion.ai/other", "example.com/x"])
VALUES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["true", "false", "10", "4Gi", "500m", "0", "-1", "1e400", "low", "critical", "a,b", "python"]),
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
PROFILE_KEYS = st.sampled_from(
    ["resources", "qos", "gpuCount", "replicas", "isLocalGPU", "standaloneWorkerMode", "autoScalingConfig", "poolName"]
)


@given(
    st.dictionaries(KEYS, VALUES, max_size=8), st.lists(st.sampled_from(["python", "a", "b"]), max_size=3, unique=True)
)
def test_any_annotation_map_resolves_or_raises_domain_error(annotations: dict[str, str], containers: list[str]) -> None:
    try:
        got = resolve(PodView(annotations=annotations, containers=tuple(containers)))
    except DomainError as exc:
        assert exc.errors and all(str(e) for e in exc.errors)
    else:
        assert isinstance(got, GpuRequest)
        assert got.tflops_request <= got.tflops_limit and got.vram_request <= got.vram_limit
        assert 1 <= got.gpu_count <= 128


@given(st.dictionaries(PROFILE_KEYS, JSON, max_size=5))
def test_any_profile_spec_parses_or_raises_domain_error(spec: dict[str, object]) -> None:
    try:
        parse_spec(spec, where="spec")
    except DomainError as exc:
        assert exc.errors
