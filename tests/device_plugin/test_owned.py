"""A node shared with NVIDIA's device plugin: ours manages only the GPUs ``--gpus`` names, so each GPU is
advertised by one plugin and none is double-booked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from device_plugin.gpus.board import discover
from device_plugin.gpus.fake_probe import FakeProbe
from device_plugin.gpus.owned import OwnedProbe, parse
from device_plugin.gpus.probe import ProbeError
from device_plugin.gpus.slices import slices
from device_plugin.main import main
from vgpu.catalog import builtin

UUIDS = [f"GPU-{i}0000000-0000-0000-0000-000000000000" for i in range(4)]


@pytest.fixture
def gpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "gpus.yaml"
    doc = {
        "gpus": [
            {"uuid": u, "index": i, "name": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81251} for i, u in enumerate(UUIDS)
        ]
    }
    doc["gpus"][3] |= {
        "mig": True,
        "migDevices": [{"uuid": "MIG-30000000-0000-0000-0000-000000000000", "slices": 7, "memoryMiB": 81251}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_only_the_named_gpus_are_published_and_advertised(gpus_file: Path) -> None:
    probe = OwnedProbe(FakeProbe(gpus_file), parse(f"0, {UUIDS[3]}"))
    published = discover(probe.devices(), builtin(), 0)
    assert [g.uuid for g in published] == [UUIDS[0], UUIDS[3], "MIG-30000000-0000-0000-0000-000000000000"]
    assert {s.uuid for s in slices(published, 2)} == {UUIDS[0], "MIG-30000000-0000-0000-0000-000000000000"}
    assert [d.uuid for d in OwnedProbe(FakeProbe(gpus_file), parse("")).devices()] == UUIDS  # empty: all


def test_a_gpu_no_device_answers_to_stops_the_plugin_with_its_name(
    gpus_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ProbeError, match="--gpus names 7, GPU-nope, which no GPU of this node is; it has: 0 "):
        OwnedProbe(FakeProbe(gpus_file), parse("0,7,GPU-nope"))
    with pytest.raises(SystemExit) as stopped:
        main(["--probe", f"--fake-gpus={gpus_file}", "--gpus=9"])
    assert "tf-device-plugin: --gpus names 9" in str(stopped.value.code)
    assert main(["--probe", f"--fake-gpus={gpus_file}", "--gpus=1"]) == 0
    out = capsys.readouterr().out
    assert UUIDS[1] in out and UUIDS[0] not in out and out.startswith("1 GPU(s) found")
