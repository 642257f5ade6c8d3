"""scheduled_pod decodes each distinct request text once; a corrupt text is reported on every call."""

from __future__ import annotations

import pytest

from scheduler_extender.objects import scheduled_pod
from tests.scheduler_extender.fakes import gpu_request, make_pod
from vgpu.contract import resolved as resolved_contract
from vgpu.names import QOS_PRIORITY_VALUE, Qos, SystemAnnotation, qos_of_priority
from vgpu.request import GpuRequest

REQUEST = GpuRequest(
    pool="default-pool",
    containers=("main",),
    gpu_count=1,
    tflops_request=20_000,
    tflops_limit=20_000,
    vram_request=8 * 2**30,
    vram_limit=8 * 2**30,
    qos=Qos.MEDIUM,
)


def pod(name: str, text: str) -> dict[str, object]:
    annotations = {SystemAnnotation.RESOLVED_REQUEST.value: text}
    return {"metadata": {"name": name, "namespace": "ns", "uid": name, "annotations": annotations}}


def test_replicas_share_one_decoded_request_equal_to_a_fresh_decode() -> None:
    text = resolved_contract.encode(REQUEST)
    first, second = scheduled_pod(pod("a", text)), scheduled_pod(pod("b", text))
    assert first.request == second.request == resolved_contract.decode(text) == REQUEST
    assert first.request is second.request
    assert (first.ref.name, second.ref.name) == ("a", "b")


def test_a_corrupt_request_is_an_error_every_time() -> None:
    for name in ("a", "b"):
        scheduled = scheduled_pod(pod(name, "{not json"))
        assert scheduled.request is None
        assert scheduled.request_error is not None and scheduled.request_error.startswith("invalid ")


@pytest.mark.parametrize(
    ("asked", "priority", "ranked"),
    [
        (Qos.CRITICAL, 0, Qos.MEDIUM),  # asked for critical, got the medium class's priority: ranked medium
        (Qos.LOW, 100_000, Qos.CRITICAL),
        (Qos.MEDIUM, 10_000, Qos.HIGH),
        (Qos.MEDIUM, 9_999, Qos.MEDIUM),
        (Qos.HIGH, -1_000_000, Qos.LOW),
    ],
)
def test_preemption_ranks_a_pod_by_its_kubernetes_priority_not_its_annotation(
    asked: Qos, priority: int, ranked: Qos
) -> None:
    scheduled = scheduled_pod(make_pod("p", gpu_request(qos=asked), priority=priority))
    assert scheduled.request is not None and scheduled.request.qos is ranked
    assert qos_of_priority(QOS_PRIORITY_VALUE[asked]) is asked  # each class's own value is its QoS
