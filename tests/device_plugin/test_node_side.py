"""Hand-off receipts kept true against PodResources, the node inventory publisher, metrics, the fake
GPU file and the command line — each through its own seam with fakes, no cluster or GPU."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from device_plugin.cluster.handoff import HandoffKeeper
from device_plugin.cluster.pod_cache import PodCache
from device_plugin.cluster.publisher import InventoryPublisher, label_value
from device_plugin.daemon import Daemon
from device_plugin.enforcement.delivery import NodeSetup
from device_plugin.gpus.board import DeviceBoard, discover
from device_plugin.gpus.fake_probe import FakeProbe, FakeProbeError
from device_plugin.gpus.health import HealthPolicy
from device_plugin.gpus.probe import GpuDevice
from device_plugin.kubelet.kubelet_api import PodDevices
from device_plugin.main import catalog_from, main, settings_from
from device_plugin.metrics import GpuCollector, PluginMetrics
from tests.device_plugin.fakes import GIB, GPU0, GPU1, NODE, FakeKube, allocation, gpu_file, make_pod, uid_of
from tests.device_plugin.harness import plugin, run
from tests.device_plugin.kubelet import TestKubelet
from vgpu.catalog import builtin
from vgpu.contract.allocation import Handoff, decode_handoff, encode_handoff
from vgpu.contract.inventory import decode
from vgpu.names import (
    LABEL_NODE_DEVICE_DELIVERY,
    LABEL_NODE_ENVVAR_GUARD,
    LABEL_NODE_GPU_COUNT,
    LABEL_NODE_GPU_MODEL,
    LABEL_NODE_POOL,
    RESOURCE_MILLI_TFLOPS,
    RESOURCE_VRAM,
    DeviceDelivery,
    EnforcementBackend,
    EnvvarGuard,
    SystemAnnotation,
)

HANDOFF = SystemAnnotation.HANDOFF.value


class Book:
    def __init__(self) -> None:
        self.adopted: dict[str, list[tuple[str, tuple[str, ...]]]] = {}

    def serving(self) -> Collection[str]:
        return self.adopted.keys()

    def adopt(self, uid: str, done: Iterable[tuple[str, tuple[str, ...]]]) -> None:
        self.adopted[uid] = list(done)


def _keeper(kube: FakeKube, truth: PodDevices) -> tuple[HandoffKeeper, PodCache]:
    cache = PodCache()
    cache.replace(kube.list_pods("node-a").items)

    async def pod_devices() -> PodDevices:
        return truth

    keeper = HandoffKeeper(kube, cache, "node-a", PluginMetrics(), pod_devices=pod_devices, now=lambda: "T")
    return keeper, cache


def test_reconcile_rewrites_a_wrong_receipt_writes_a_missing_one_and_adopts_partial_pods() -> None:
    wrong = make_pod("wrong", alloc=allocation("x"))
    wrong["metadata"]["annotations"][HANDOFF] = encode_handoff(
        Handoff(pod_uid=uid_of(wrong), node="node-a", devices=(("main", ("s-9",)),), at="old")
    )
    unwritten = make_pod("unwritten", alloc=allocation("y"))
    partial = make_pod("partial", alloc=allocation("z"), init=[("init", 1)])
    kube = FakeKube([wrong, unwritten, partial])
    truth = {
        ("default", "wrong"): {"main": ("s-1",)},
        ("default", "unwritten"): {"main": ("s-2",)},
        ("default", "partial"): {"init": ("s-3",)},
    }

    async def scenario() -> None:
        keeper, _ = _keeper(kube, truth)
        book = Book()
        await keeper.reconcile_once(book)
        assert dict(decode_handoff(kube.annotation(uid_of(wrong), HANDOFF) or "").devices) == {"main": ("s-1",)}
        assert dict(decode_handoff(kube.annotation(uid_of(unwritten), HANDOFF) or "").devices) == {"main": ("s-2",)}
        assert kube.annotation(uid_of(partial), HANDOFF) is None
        assert book.adopted == {uid_of(partial): [("init", ("s-3",))]}
        patches = len(kube.pod_patches)
        await keeper.reconcile_once(book)  # everything agrees now: no further patch
        assert len(kube.pod_patches) == patches

    run(scenario())


def test_a_failed_receipt_patch_is_retried_by_reconcile() -> None:
    pod = make_pod("p", alloc=allocation("u"))
    kube = FakeKube([pod])
    kube.fail_pod_patches = 1

    async def scenario() -> None:
        keeper, cache = _keeper(kube, {})
        record = cache.get(uid_of(pod))
        assert record is not None
        keeper.record(record, (("main", ("s-1",)),))
        await keeper.drain()
        assert kube.annotation(uid_of(pod), HANDOFF) is None
        await keeper.reconcile_once(Book())
        assert dict(decode_handoff(kube.annotation(uid_of(pod), HANDOFF) or "").devices) == {"main": ("s-1",)}

    run(scenario())


def _board(tmp_path: Path) -> DeviceBoard:
    gpus = discover(FakeProbe(gpu_file(tmp_path / "gpus.yaml")).devices(), builtin(), 0)
    return DeviceBoard(gpus, 4, HealthPolicy())


def test_inventory_is_patched_on_change_and_on_heartbeat_only(tmp_path: Path) -> None:
    kube = FakeKube(node_labels={LABEL_NODE_POOL: "training"})
    clock = [0.0]
    setup = [NodeSetup(EnvvarGuard.OFF, DeviceDelivery.ENVVAR)]

    async def scenario() -> None:
        board = _board(tmp_path)
        publisher = InventoryPublisher(
            kube,
            board,
            PluginMetrics(),
            node="node-a",
            backend=EnforcementBackend.HAMI_CORE,
            setup=lambda: setup[0],
            heartbeat_s=30,
            now=lambda: f"beat-{clock[0]}",
            clock=lambda: clock[0],
        )
        assert await publisher.publish_once()
        labels, annotations = kube.node_patches[-1]
        assert labels == {
            LABEL_NODE_POOL: "training",
            LABEL_NODE_GPU_MODEL: "A100-SXM4-80GB",
            LABEL_NODE_GPU_COUNT: "2",
            LABEL_NODE_ENVVAR_GUARD: "off",
            LABEL_NODE_DEVICE_DELIVERY: "envvar",
        }
        inv = decode(annotations[SystemAnnotation.NODE_INVENTORY.value])
        assert [(g.uuid, g.tflops, g.numa) for g in inv.gpus] == [(GPU0, 312_000, 0), (GPU1, 312_000, 1)]
        assert (inv.pool, inv.slices_per_gpu, inv.backend, inv.heartbeat) == ("training", 4, "hami-core", "beat-0.0")
        both = {RESOURCE_MILLI_TFLOPS: "624000", RESOURCE_VRAM: str(2 * 80 * 1024**3)}
        assert kube.resource_patches == [both]
        assert {s: kube.node["status"][s] for s in ("capacity", "allocatable")} == {
            "capacity": both,
            "allocatable": both,
        }
        clock[0] = 10.0
        assert not await publisher.publish_once()  # nothing changed, heartbeat not due
        health, flipped = board.health.xid(GPU1, 79, 10.0)
        board.set_health(health, flipped)
        assert await publisher.publish_once()
        assert decode(kube.node_patches[-1][1][SystemAnnotation.NODE_INVENTORY.value]).gpus[1].health == "Unhealthy"
        # The unhealthy GPU leaves the node's totals: kube-scheduler must not count on it.
        assert kube.resource_patches[-1] == {RESOURCE_MILLI_TFLOPS: "312000", RESOURCE_VRAM: str(80 * 1024**3)}
        clock[0] = 45.0
        assert await publisher.publish_once()  # heartbeat due
        assert len(kube.node_patches) == 3
        clock[0] = 50.0
        setup[0] = NodeSetup(EnvvarGuard.ON, DeviceDelivery.VOLUME_MOUNTS)  # the toolkit check's new conclusion
        assert await publisher.publish_once()
        labels = kube.node_patches[-1][0]
        assert (labels[LABEL_NODE_ENVVAR_GUARD], labels[LABEL_NODE_DEVICE_DELIVERY]) == ("on", "volume-mounts")

    run(scenario())


def test_label_values_are_valid() -> None:
    assert label_value("NVIDIA GeForce RTX 4090 (rev a)") == "NVIDIA-GeForce-RTX-4090-rev-a"
    assert len(label_value("x" * 100)) == 63


def test_unknown_model_is_usable_with_the_default_tflops(caplog: pytest.LogCaptureFixture) -> None:
    (gpu,) = discover((GpuDevice(uuid=GPU0, index=0, name="Mystery GPU 9000", memory=1 << 30),), builtin(), 55_000)
    assert (gpu.model, gpu.tflops) == ("Mystery GPU 9000", 55_000)
    assert "not in the GPU catalog" in caplog.text


def test_metrics_report_each_gpus_capacity_allocation_and_live_figures_with_the_node(tmp_path: Path) -> None:
    probe = FakeProbe(gpu_file(tmp_path / "gpus.yaml"))
    board = _board(tmp_path)
    metrics = PluginMetrics()
    allocated = {GPU0: (10_500, 4 * GIB)}  # what the usage sampler's last pass found granted
    metrics.registry.register(GpuCollector(probe, board.gpus, "node-a", lambda: allocated))
    metrics.allocate_seconds.labels("ok").observe(0.002)
    labels = [
        {"node": "node-a", "gpu": uuid, "index": str(i), "model": "A100-SXM4-80GB"}
        for i, uuid in enumerate((GPU0, GPU1))
    ]

    def both(name: str) -> list[float | None]:
        return [metrics.registry.get_sample_value(name, gpu) for gpu in labels]

    assert both("tf_gpu_utilization_ratio") == [0.30, 0.31]
    assert both("tf_gpu_power_watts") == [90.5, 90.5]
    assert both("tf_gpu_tflops_capacity") == [312.0, 312.0]
    assert both("tf_gpu_tflops_allocated") == [10.5, 0.0]
    assert both("tf_gpu_vram_capacity_bytes") == [80 * GIB, 80 * GIB]
    assert both("tf_gpu_vram_allocated_bytes") == [4 * GIB, 0]
    assert both("tf_gpu_vram_used_bytes") == [GIB, GIB]
    assert both("tf_gpu_healthy") == [1, 1]
    assert metrics.registry.get_sample_value("tf_device_plugin_allocate_seconds_count", {"outcome": "ok"}) == 1
    text = generate_latest(metrics.registry).decode()
    assert 'tf_build_info{component="device-plugin",version="' in text
    assert "process_cpu_seconds_total" in text


def test_fake_probe_delivers_new_events_once_and_reports_check_failures(tmp_path: Path) -> None:
    path = gpu_file(tmp_path / "gpus.yaml", events=[(GPU0, 31)])
    probe = FakeProbe(path)
    assert probe.wait_xid(0) == ()  # events present at start are history
    gpu_file(path, events=[(GPU0, 31), (GPU1, 79)], fail={GPU0: "fell off the bus"})
    assert [(e.uuid, e.xid) for e in probe.wait_xid(1)] == [(GPU1, 79)]
    assert probe.wait_xid(0) == ()
    assert probe.check(GPU0) == "fell off the bus" and probe.check(GPU1) is None
    path.write_text("gpus: [{uuid: x}]")
    with pytest.raises(FakeProbeError, match="needs uuid, name and memoryMiB"):
        probe.devices()


def test_cli_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_PLUGIN_BACKEND", "mps")
    settings = settings_from(
        ["--node-name", "n1", "--ignored-xids", "13,79", "--default-tflops", "2.5", "--podresources-socket", "/x.sock"]
    )
    assert settings.node == "n1" and settings.backend is EnforcementBackend.MPS
    assert settings.health.ignored_xids == {13, 79} and settings.default_milli_tflops == 2500
    assert settings.podresources_path == Path("/x.sock")


def test_the_podresources_socket_cannot_be_switched_off(capsys: pytest.CaptureFixture[str]) -> None:
    # Without the kubelet's record no grant is proven, so no GPU container could ever start.
    with pytest.raises(SystemExit) as stopped:
        settings_from(["--node-name", "n1", "--podresources-socket", ""])
    assert stopped.value.code == 2
    refusal = (
        "--podresources-socket (env TF_PLUGIN_PODRESOURCES_SOCKET) '': must name the kubelet's PodResources socket"
    )
    assert refusal in capsys.readouterr().err


def test_pod_cache_never_takes_an_older_version_of_a_pod_nor_revives_a_deleted_one() -> None:
    # A busy watch delivers old versions after a hand-off patch's answer or a fresh LIST was applied.
    pod = make_pod("p", alloc=allocation("p"))
    kube = FakeKube([pod])
    listed = kube.list_pods("node-a").items
    uid = uid_of(pod)
    cache = PodCache()
    cache.replace(listed)
    patched = kube.patch_pod_annotations("default", "p", {HANDOFF: "receipt"})
    cache.apply("MODIFIED", patched)
    cache.apply("MODIFIED", listed[0])  # the watch's older version: ignored
    record = cache.get(uid)
    assert record is not None and record.handoff == "receipt"
    cache.replace(listed)  # a relist taken before the patch keeps the newer record
    record = cache.get(uid)
    assert record is not None and record.handoff == "receipt"
    kube.delete(uid)
    cache.apply("DELETED", {**patched, "metadata": {**patched["metadata"], "resourceVersion": "99"}})
    assert cache.merge(listed)[0].uid == uid  # a LIST from before the deletion is returned as read...
    assert cache.get(uid) is None  # ...but does not bring the pod back
    cache.replace(listed)
    assert cache.get(uid) is None


def test_a_gpu_catalog_file_changes_the_tflops_the_plugin_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("- {key: A100-SXM4-80GB, tflops: '250.5', memoryMiB: 81920}\n- {key: Z1, tflops: 1}\n")
    monkeypatch.setenv("TF_PLUGIN_GPU_CATALOG", str(catalog))
    catalog = catalog_from(settings_from(["--node-name", "node-a"]))
    kube = FakeKube()

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), catalog=catalog):
            while (text := kube.node["metadata"]["annotations"].get(SystemAnnotation.NODE_INVENTORY.value)) is None:
                await asyncio.sleep(0.01)
            assert [(g.uuid, g.model, g.tflops) for g in decode(text).gpus] == [
                (GPU0, "A100-SXM4-80GB", 250_500),
                (GPU1, "A100-SXM4-80GB", 250_500),
            ]

    run(scenario())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- {key: A100-SXM4-80GB, tflops: fast}\n", "catalog.yaml[0].tflops 'fast': "),
        (
            "- {key: X, tflops: 1}\n- {key: Y, tflops: 1, memoryMiB: -1}\n",
            "catalog.yaml[1].memoryMiB '-1': must be a whole number",
        ),
        ("{key: A100, tflops: 1}\n", "catalog.yaml: must be a list of models"),
        ("- [unclosed\n", "catalog.yaml: not valid YAML or JSON"),
        (None, "catalog.yaml: cannot read it (No such file or directory)"),
    ],
)
def test_a_bad_gpu_catalog_file_stops_the_plugin_naming_the_file(
    tmp_path: Path, text: str | None, expected: str
) -> None:
    catalog = tmp_path / "catalog.yaml"
    if text is not None:
        catalog.write_text(text)
    settings = settings_from(["--node-name", "node-a", "--gpu-catalog", str(catalog)])
    with pytest.raises(SystemExit) as stopped:
        catalog_from(settings)
    assert f"tf-device-plugin: --gpu-catalog {tmp_path}/{expected}" in str(stopped.value)


def test_probe_shows_the_tflops_a_gpu_catalog_file_sets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    catalog = tmp_path / "catalog.json"
    catalog.write_text('[{"key": "A100-SXM4-80GB", "tflops": "250.5"}]')
    trainer = {"pod": "trainer", "container": "main", "gpu": 1, "smPercent": 20, "vramMiB": 512}
    gpus = gpu_file(tmp_path / "gpus.yaml", fail={GPU1: "fell off the bus"}, usage=[trainer])
    assert main(["--probe", "--fake-gpus", str(gpus), "--gpu-catalog", str(catalog)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 GPU(s) found"
    assert out[2] == "  published as A100-SXM4-80GB: 250.5 TFLOPS, 80Gi VRAM, NUMA node 0, MIG off"
    assert out[7] == "  health check: fell off the bus"
    assert out[8] == "  now: utilization 31%, memory used 1Gi, temperature 40 °C, power 90.5 W, compute processes 1"


def test_the_layout_check_interval_flag_reaches_the_daemon(tmp_path: Path) -> None:
    # 30 s by default: with the flag the daemon notices a GPU gone within a fraction of a second and stops.
    gpus = gpu_file(tmp_path / "gpus.yaml")
    flags = f"--node-name {NODE} --layout-check-interval 0.05 --health-check-interval 0.05 --metrics-port 0"
    settings = settings_from([*flags.split(), "--plugin-dir", str(tmp_path), "--live-limits-dir", "", "--cdi-dir", ""])
    assert settings.layout_check_interval == 0.05

    async def scenario() -> None:
        kubelet = TestKubelet(tmp_path)
        await kubelet.start()
        probe = FakeProbe(gpus)
        daemon = Daemon(
            settings,
            probe,
            FakeKube(),
            catalog=builtin(),
            pod_devices=kubelet.pod_devices,
            resolver=probe,
            socket_poll_s=0.05,
        )
        stopping = asyncio.Event()
        task = asyncio.create_task(daemon.run(stopping))
        try:
            await asyncio.wait_for(kubelet.registrations.get(), 5)
            doc = yaml.safe_load(gpus.read_text())
            gpus.write_text(yaml.safe_dump({**doc, "gpus": doc["gpus"][:1]}))  # GPU1 is gone
            await asyncio.wait_for(task, 5)
            assert stopping.is_set()
        finally:
            stopping.set()
            await asyncio.wait_for(task, 5)
            await kubelet.stop()

    run(scenario())
