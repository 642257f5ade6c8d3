"""The throughput benchmark's cases are what its table claims: B plain, A one shape, C all different, and the
scheduler's client limits are the ones it passes."""

from __future__ import annotations

from pathlib import Path

from benchmarks.throughput import cases
from tests.e2e import deploy
from vgpu.names import LABEL_ENABLED, SCHEDULER_NAME, Annotation

SHAPE = (Annotation.TFLOPS_REQUEST, Annotation.VRAM_REQUEST, Annotation.PLACEMENT_POLICY)


def test_b_is_plain_through_our_profile_a_one_shape_c_all_different() -> None:
    build = cases("binpack")
    plain = build["B"]("b-0", 0)
    assert plain["spec"]["schedulerName"] == SCHEDULER_NAME and not plain["metadata"].get("labels")
    for case, distinct in (("A", 1), ("C", 20)):
        pods = [build[case](f"{case}-{i}", i) for i in range(20)]
        assert all(p["metadata"]["labels"][LABEL_ENABLED] == "true" for p in pods)
        shapes = {tuple(p["metadata"]["annotations"][k] for k in SHAPE) for p in pods}
        assert len(shapes) == distinct
        assert {s[2] for s in shapes} == {"binpack"}


def test_the_scheduler_config_takes_the_client_limits_and_keeps_the_rest() -> None:
    shipped = deploy.scheduler_config(Path("/kubeconfig"), 8080)
    raised = deploy.scheduler_config(Path("/kubeconfig"), 8080, (1234.0, 4321))
    assert raised["clientConnection"] == {"kubeconfig": "/kubeconfig", "qps": 1234.0, "burst": 4321}
    assert shipped.pop("clientConnection") == {"kubeconfig": "/kubeconfig", "qps": 1000, "burst": 2000}
    del raised["clientConnection"]
    assert raised == shipped
