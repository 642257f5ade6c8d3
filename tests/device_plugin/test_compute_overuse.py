"""The compute report: a pod's mean share of a GPU over the window, by the driver's count, against the cap its
HAMi-core is given (the judgement, table-tested), and the whole loop in the real plugin assembly on a hami-core
node: a container scripted far past its cap is reported once on the pod and the node and counted; its neighbour
within the margin is not; on a node without a limiter nothing is judged."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from device_plugin.cluster.node_events import REASON_COMPUTE_OVERUSE
from device_plugin.enforcement.compute_guard import caps_of
from device_plugin.enforcement.compute_overuse import ComputeOveruse, Share, judge, shares
from device_plugin.settings import PluginSettings
from tests.device_plugin.fakes import A100_TFLOPS, GPU0, GPU1, FakeKube, allocation, gpu_file, grant, make_pod, uid_of
from tests.device_plugin.harness import plugin, run, until
from vgpu.contract.allocation import decode
from vgpu.contract.usage import ContainerUsage, PodGpu
from vgpu.metric_names import COMPUTE_OVERUSE
from vgpu.names import IsolationMode

MARGIN = 10
CAPACITY = 100_000  # milli-TFLOPS: 1 % of the GPU is 1 TFLOPS


def row(percent: float, *, container: str = "main", pod: str = "uid-a", gpu: str = GPU0) -> ContainerUsage:
    return ContainerUsage(namespace="team-a", pod="trainer", pod_uid=pod, container=container, gpu=gpu,
                          tflops_used=int(percent * CAPACITY / 100), vram_used=0, tflops_measured=True,
                          tflops_request=20_000, tflops_limit=20_000, vram_request=0, vram_limit=0)  # fmt: skip


CAPS: Mapping[PodGpu, tuple[int, int]] = {("uid-a", GPU0): (20, CAPACITY), ("uid-b", GPU0): (20, CAPACITY)}


def reported(passes_of: Sequence[Sequence[ContainerUsage]], passes: int = 3) -> list[list[float]]:
    """The means reported after each pass."""
    history: Mapping[PodGpu, tuple[float, ...]] = {}
    said: frozenset[PodGpu] = frozenset()
    out = []
    for rows in passes_of:
        found = judge(shares(rows, CAPS), margin=MARGIN, passes=passes, window_s=15, history=history, reported=said)
        history, said = found.history, found.reported
        out.append([round(o.mean, 1) for o in found.report])
    return out


def test_a_pod_past_its_cap_and_the_margin_over_a_full_window_is_reported_once_until_it_falls_back() -> None:
    over, under = [row(90)], [row(25)]
    assert reported([over] * 5) == [[], [], [90.0], [], []]
    # Back within its cap and the margin (the mean of the last three passes), then over again: reported again,
    # as soon as the window's mean passes it.
    assert reported([over] * 3 + [under] * 3 + [over] * 3) == [[], [], [90.0], [], [], [], [46.7], [], []]


@pytest.mark.parametrize(
    ("percents", "passes"),
    [
        pytest.param([30, 30, 30], 3, id="at-cap-plus-margin"),
        pytest.param([20] * 5 + [100] + [20] * 6, 12, id="a-5s-burst-to-the-whole-gpu-in-a-minute"),
        pytest.param([40, 40], 3, id="a-window-not-yet-full"),
    ],
)
def test_a_pod_within_the_margin_a_burst_or_a_short_history_is_not_reported(percents: list[float], passes: int) -> None:
    assert reported([[row(p)] for p in percents], passes=passes) == [[]] * len(percents)


def test_a_pods_containers_on_a_gpu_are_judged_together_and_pods_and_gpus_apart() -> None:
    """Two containers at 20 % each pass a 20 % cap together (each within it alone, as HAMi-core holds them);
    another pod at 25 % and the same pod on another GPU (no cap there) are not reported."""
    rows = [row(20, container="prep"), row(20, container="serve"), row(25, pod="uid-b"), row(90, gpu=GPU1)]
    assert reported([rows] * 3)[-1] == [40.0]


def test_rows_without_a_measured_share_a_cap_or_a_capacity_are_not_judged() -> None:
    rows = [replace(row(90), tflops_measured=False), row(90, pod="uid-c")]
    assert shares(rows, CAPS) == ()
    assert shares([row(90)], {("uid-a", GPU0): (20, 0)}) == ()


def test_the_message_names_the_pod_its_use_its_cap_and_that_it_is_only_reported() -> None:
    share = Share(rows=(row(90),), used=90.0, cap=20)
    assert ComputeOveruse(share=share, mean=87.4, window_s=60).message(MARGIN) == (
        f"container main of pod team-a/trainer used 87% of GPU {GPU0} on average over 60s by the driver's count, "
        "over the 20% its TFLOPS limit gives HAMi-core by more than 10 points: a process the limiter does not hold "
        "(one that left it, or containers each held alone); reported only (--compute-overuse)"
    )
    two = Share(rows=(row(40, container="prep"), row(40, container="serve")), used=80.0, cap=20)
    assert (
        ComputeOveruse(share=two, mean=80, window_s=60)
        .message(MARGIN)
        .startswith("pod team-a/trainer's containers prep, serve together used 80% of GPU")
    )


def test_each_pods_cap_is_what_its_hami_core_is_given_and_none_under_shared() -> None:
    soft = decode(allocation("u1", gpus=(grant(GPU0, tflops=31_200),)))
    shared = decode(allocation("u2", gpus=(grant(GPU0, tflops=31_200),), isolation=IsolationMode.SHARED))
    assert caps_of({"u1": soft, "u2": shared}) == {("u1", GPU0): (10, A100_TFLOPS), ("u2", GPU0): (100, A100_TFLOPS)}


# --- the whole loop in the plugin ---------------------------------------------------------------------------


def test_in_the_plugin_a_pod_past_its_cap_is_reported_once_and_its_neighbour_and_a_node_without_hami_core_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two pods of 31.2 TFLOPS (10 % of an A100) on GPU0: one scripted at 90 % of the SMs, one at 15 % (within
    the margin). Sampling every 50 ms with a 0.2 s window."""
    pods = [make_pod(name, namespace="ml", alloc=None, phase="Running") for name in ("busy", "modest")]
    for pod in pods:
        pod["metadata"]["annotations"]["tensor-fusion.ai/allocation"] = allocation(
            uid_of(pod), gpus=(grant(GPU0, tflops=31_200),)
        )
    script = [
        {"pod": "busy", "container": "main", "gpu": 0, "smPercent": 90},
        {"pod": "modest", "container": "main", "gpu": 0, "smPercent": 15},
    ]

    async def scenario(backend: str) -> tuple[FakeKube, float | None]:
        kube = FakeKube(pods)
        path = gpu_file(tmp_path / f"{backend}.yaml")
        async with plugin(tmp_path, kube, path, usage_interval=0.05, backend=backend, compute_overuse_window=0.2) as (
            daemon,
            _,
        ):
            gpu_file(path, usage=script)
            if backend == "hami-core":
                await until(lambda: kube.pod_events, timeout=10)
            await asyncio.sleep(0.5)  # ten more passes: not said again
            await daemon.node_events.drain()
            return kube, daemon.metrics.registry.get_sample_value(COMPUTE_OVERUSE.name)

    caplog.set_level(logging.INFO, logger="device_plugin.daemon")
    kube, count = run(scenario("hami-core"))
    assert "judges nothing" not in caplog.text
    ((ns, name, uid, reason, message, warning),) = kube.pod_events
    assert (ns, name, uid, reason, warning) == ("ml", "busy", uid_of(pods[0]), REASON_COMPUTE_OVERUSE, True)
    assert message.startswith(f"container main of pod ml/busy used 90% of GPU {GPU0} on average over 0.2s")
    assert [e[2] for e in kube.node_events if e[1] == REASON_COMPUTE_OVERUSE] == [message]
    assert count == 1

    kube, count = run(scenario("none"))
    assert kube.pod_events == [] and count == 0
    # Accepted there, and said at start to do nothing, not silently ignored.
    assert "--compute-overuse=report judges nothing on --backend=none" in caplog.text


@pytest.mark.parametrize(
    ("field", "given"),
    [("compute_overuse_margin", 0), ("compute_overuse_margin", 101), ("compute_overuse_window", 0)],
)
def test_a_margin_or_window_out_of_range_is_refused_naming_the_flag(field: str, given: float) -> None:
    with pytest.raises(ValueError, match=field):
        PluginSettings(node_name="n", **{field: given})
