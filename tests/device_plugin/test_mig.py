"""MIG on the node side: the fake GPU file's MIG layouts, what is published for them, a unit's health
following its GPU's, and a changed layout stopping the plugin so that it starts again with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from device_plugin.gpus.board import DeviceBoard, LayoutWatch, discover
from device_plugin.gpus.fake_probe import FakeProbe
from device_plugin.gpus.health import HealthPolicy
from vgpu.catalog import builtin
from vgpu.contract.inventory import Health

PARENT = "GPU-40000000-0000-0000-0000-000000000000"
PLAIN = "GPU-80000000-0000-0000-0000-000000000000"
UNITS = [f"MIG-{i}0000000-0000-0000-0000-000000000000" for i in range(7)]


def write(path: Path, *, mig: bool, fail: str | None = None) -> None:
    parent: dict[str, object] = {"uuid": PARENT, "index": 0, "name": "NVIDIA A100-SXM4-40GB", "memoryMiB": 40960}
    if mig:
        parent |= {"mig": True, "migDevices": [{"uuid": u, "slices": 1, "memoryMiB": 4864} for u in UNITS]}
    if fail:
        parent["fail"] = fail
    plain = {"uuid": PLAIN, "index": 1, "name": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81251}
    path.write_text(yaml.safe_dump({"gpus": [parent, plain]}))


def test_a_gpu_in_mig_mode_is_published_unschedulable_with_its_seven_instances(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    write(path, mig=True)
    gpus = discover(FakeProbe(path).devices(), builtin(), 0)
    assert [(g.uuid, g.mig, g.parent) for g in gpus][:2] == [(PARENT, True, None), (UNITS[0], False, PARENT)]
    units = [g for g in gpus if g.parent]
    assert len(units) == 7 and {g.model for g in units} == {"A100-SXM4-40GB MIG 1g.5gb"}
    assert {(g.tflops, g.vram) for g in units} == {(44_571, 4864 * 1024**2)}


def test_a_unit_is_as_healthy_as_its_gpu(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = tmp_path / "gpus.yaml"
        write(path, mig=True)
        probe = FakeProbe(path)
        board = DeviceBoard(discover(probe.devices(), builtin(), 0), 4, HealthPolicy())
        write(path, mig=True, fail="fell off the bus")
        health, flipped = board.health.checked({g.uuid: probe.check(g.uuid) for g in board.gpus()}, 0.0)
        board.set_health(health, flipped)
        sick = {g.uuid for g in board.gpus() if g.health is Health.UNHEALTHY}
        assert sick == {PARENT, *UNITS}

    asyncio.run(scenario())


def test_a_mig_reconfiguration_stops_the_plugin_to_start_again_with_the_new_layout(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = tmp_path / "gpus.yaml"
        write(path, mig=False)
        probe = FakeProbe(path)
        board = DeviceBoard(discover(probe.devices(), builtin(), 0), 4, HealthPolicy())
        watch = LayoutWatch(probe, board, builtin(), 0, interval_s=0.01)
        assert await watch.changed() is None
        stopping = asyncio.Event()
        task = asyncio.create_task(watch.run(stopping))
        await asyncio.sleep(0.05)
        assert not stopping.is_set()  # nothing changed: the plugin runs on
        write(path, mig=True)
        await asyncio.wait_for(stopping.wait(), 5)
        await task
        change = await watch.changed()
        assert change is not None and PARENT in change and UNITS[0] in change

    asyncio.run(scenario())
