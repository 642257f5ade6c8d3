"""A pod's sample sums its containers and GPUs and counts each GPU's grant once; a node's adds the unattributed;
a sample is served for two of its plugin's intervals; utilisation is exact to a thousandth of a percent."""

from __future__ import annotations

import pytest

from tests.vgpu.usage_builders import GI, T0, node_usage, samples_of, used
from vgpu.contract.usage import Unattributed
from vgpu.names import GpuMetric
from vgpu.usage_samples import (
    fresh,
    node_samples,
    node_value,
    pod_value,
    sampled,
    utilization_milli,
)


def test_a_pod_sums_its_containers_and_gpus_and_counts_each_gpus_grant_once() -> None:
    doc = node_usage(
        "n1",
        used("trainer", container="main", gpu="GPU-0", tflops=10_000, vram=2 * GI),
        used("trainer", container="sidecar", gpu="GPU-0", tflops=5_000, vram=1 * GI),  # same GPU: same grant
        used("trainer", container="main", gpu="GPU-1", tflops=7_500, vram=3 * GI),
    )
    node, (pod,) = node_samples(doc)
    assert (pod.namespace, pod.name, pod.uid, pod.node) == ("team-a", "trainer", "uid-team-a-trainer", "n1")
    assert (pod.tflops_used, pod.vram_used) == (22_500, 6 * GI)
    assert (pod.tflops_request, pod.tflops_limit) == (40_000, 80_000)  # 2 GPUs x (20, 40) TFLOPS
    assert (pod.vram_request, pod.vram_limit) == (8 * GI, 16 * GI)
    assert (node.tflops_used, node.vram_used) == (22_500, 6 * GI)
    assert pod.sampled.timestamp == "2025-03-01T12:00:00Z" and pod.sampled.window_s == 5.0


def test_a_node_counts_what_no_container_could_be_found_for() -> None:
    lost = Unattributed(gpu="GPU-0", processes=2, tflops_used=3_000, vram_used=GI, tflops_measured=True)
    node, pods = node_samples(node_usage("n1", used("a"), unattributed=(lost,)))
    assert (node.tflops_used, node.vram_used) == (13_000, 3 * GI)
    assert sum(p.tflops_used for p in pods) == 10_000


def test_values_are_kubernetes_quantities() -> None:
    (pod,) = samples_of(node_usage("n1", used("a", tflops=12_500, vram=1536 * 1024**2, limit=40_000))).pods.values()
    assert pod_value(pod, GpuMetric.TFLOPS) == "12500m"
    assert pod_value(pod, GpuMetric.VRAM_BYTES) == "1536Mi"
    assert pod_value(pod, GpuMetric.UTILIZATION) == "31250m"  # 12.5 of 40 TFLOPS: 31.25 %
    node = samples_of(node_usage("n1", used("a", tflops=12_000))).nodes["n1"]
    assert (node_value(node, GpuMetric.TFLOPS), node_value(node, GpuMetric.UTILIZATION)) == ("12", None)


def test_no_utilisation_without_a_limit() -> None:
    (pod,) = samples_of(node_usage("n1", used("a", limit=0, request=0))).pods.values()
    assert pod_value(pod, GpuMetric.UTILIZATION) is None
    assert pod_value(pod, GpuMetric.TFLOPS) == "10"


def test_tflops_a_plugin_could_not_measure_are_absent_not_idle() -> None:
    """A MIG instance or an old driver gives memory only: an HPA must find no TFLOPS or utilisation there,
    never a 0 it would scale down on; memory is still served, and the node's TFLOPS go absent too."""
    usage = node_usage("n1", used("mig", tflops=0, measured=False), used("gpu", tflops=5_000))
    snap = samples_of(usage)
    mig, plain = snap.pods[("team-a", "mig")], snap.pods[("team-a", "gpu")]
    assert [pod_value(mig, m) for m in GpuMetric] == [
        None if m is not GpuMetric.VRAM_BYTES else "2Gi" for m in GpuMetric
    ]
    assert pod_value(plain, GpuMetric.TFLOPS) == "5"
    assert node_value(snap.nodes["n1"], GpuMetric.TFLOPS) is None
    assert node_value(snap.nodes["n1"], GpuMetric.VRAM_BYTES) == "4Gi"


@pytest.mark.parametrize(
    ("used_milli", "limit", "percent_milli"),
    [(0, 40_000, 0), (40_000, 40_000, 100_000), (60_000, 40_000, 150_000), (1, 3, 33_333), (2, 3, 66_667)],
)
def test_utilisation_rounds_half_up_to_a_thousandth_of_a_percent(
    used_milli: int, limit: int, percent_milli: int
) -> None:
    assert utilization_milli(used_milli, limit) == percent_milli


def test_a_sample_is_served_for_two_intervals_of_its_plugin() -> None:
    when = sampled(node_usage("n1", interval_s=5.0))
    assert fresh(when, T0) and fresh(when, T0 + 10.0)
    assert not fresh(when, T0 + 10.001)
    assert fresh(when, T0 - 3.0)  # a node clock a little ahead of ours


def test_a_pod_reported_by_two_nodes_keeps_the_newer_sample() -> None:
    snap = samples_of(
        node_usage("old", used("a", tflops=1_000), at=T0), node_usage("new", used("a", tflops=2_000), at=T0 + 3)
    )
    assert snap.pods[("team-a", "a")].node == "new"


@pytest.mark.parametrize("stamp", ["yesterday", "2025-03-01T12:00:00"])
def test_an_unreadable_sample_time_is_an_error_naming_it(stamp: str) -> None:
    doc = node_usage("n1", used("a"))
    bad = type(doc)(node="n1", sampled_at=stamp, interval_s=5.0, containers=doc.containers)
    with pytest.raises(ValueError, match="sampledAt"):
        node_samples(bad)
