"""Beside NVIDIA's device plugin on one node: the chart's ``devicePlugin.gpus`` becomes the plugin's
``--gpus`` (the GPUs it manages), and a value the plugin could not read is refused at render."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.deploy.test_chart import WORKLOADS, container, pod_spec, render


def plugin_args(values: dict[str, object], tmp_path: Path) -> list[str]:
    kind, name, _ = WORKLOADS[1]
    args: list[str] = container(pod_spec(render(values, tmp_path), kind, name), "device-plugin")["args"]
    return args


def test_the_managed_gpus_reach_the_plugin_and_none_means_all(tmp_path: Path) -> None:
    assert "--gpus=0,GPU-6b8c" in plugin_args({"devicePlugin": {"gpus": "0,GPU-6b8c"}}, tmp_path)
    assert not any(a.startswith("--gpus") for a in plugin_args({}, tmp_path))


def test_a_list_with_spaces_or_empty_entries_is_refused(tmp_path: Path) -> None:
    with pytest.raises(subprocess.CalledProcessError) as refused:
        render({"devicePlugin": {"gpus": "0,,1"}}, tmp_path)
    assert "/devicePlugin/gpus': '0,,1' does not match pattern" in refused.value.stderr
