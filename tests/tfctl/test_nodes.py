"""``tfctl nodes``: GPU nodes as their plugins publish them, and the nodes whose toolkit lets any pod take GPUs
(listed, exit 1)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.tfctl.test_top import node
from tf_shell.kube.api import GatewayError, RawObject
from tfctl import nodes
from tfctl.main import main
from vgpu.contract import inventory
from vgpu.names import LABEL_NODE_DEVICE_DELIVERY, LABEL_NODE_ENVVAR_GUARD, SystemAnnotation


def labelled(raw: RawObject, guard: str | None, delivery: str | None) -> RawObject:
    labels = {LABEL_NODE_ENVVAR_GUARD: guard, LABEL_NODE_DEVICE_DELIVERY: delivery}
    raw["metadata"]["labels"] = {k: v for k, v in labels.items() if v is not None}
    return raw


def unhealthy_one(raw: RawObject) -> RawObject:
    key = SystemAnnotation.NODE_INVENTORY.value
    published = inventory.decode(raw["metadata"]["annotations"][key])
    sick = dataclasses.replace(published.gpus[0], health=inventory.Health.UNHEALTHY)
    raw["metadata"]["annotations"][key] = inventory.encode(
        dataclasses.replace(published, gpus=(sick, *published.gpus[1:]))
    )
    return raw


class Listed:
    def __init__(self, listed: list[RawObject]) -> None:
        self.listed = listed

    def nodes(self) -> list[RawObject]:
        return self.listed


def run_nodes(monkeypatch: pytest.MonkeyPatch, listed: list[RawObject]) -> int:
    monkeypatch.setattr(nodes.MetricsCluster, "connect", classmethod(lambda cls, kubeconfig: Listed(listed)))
    return main(["nodes"])


def test_every_gpu_node_with_its_delivery_and_guard(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = [
        labelled(node("gpu-b", 2, mig_parent=True), "on", "volume-mounts"),
        labelled(unhealthy_one(node("gpu-a", 2)), "on", "cdi"),
        {"metadata": {"name": "cpu-1"}},
    ]
    assert run_nodes(monkeypatch, listed) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NODE", "POOL", "GPUS", "BACKEND", "ISOLATION", "DELIVERY", "ENVVAR-GUARD"]
    assert [line.split() for line in lines[1:]] == [
        ["gpu-a", "default-pool", "1/2", "none", "shared", "cdi", "on"],
        ["gpu-b", "default-pool", "2/2", "none", "shared", "volume-mounts", "on"],  # the GPU in MIG mode: not counted
    ]


def test_nodes_open_to_envvar_requests_are_named_and_fail_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = [
        labelled(node("gpu-a", 1), "on", "volume-mounts"),
        labelled(node("gpu-b", 1), "off", "envvar"),
        labelled(node("gpu-c", 1), None, None),  # a plugin older than the check: unknown, not safe
    ]
    assert run_nodes(monkeypatch, listed) == nodes.OPEN
    out = capsys.readouterr().out
    assert "2 node(s) let any pod take GPUs by naming them in NVIDIA_VISIBLE_DEVICES: gpu-b, gpu-c" in out
    assert out.splitlines()[3].split()[-2:] == ["-", "-"]


def test_no_gpu_node_and_an_unreachable_api(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_nodes(monkeypatch, [{"metadata": {"name": "cpu-1"}}]) == 0
    assert "no node publishes a GPU inventory" in capsys.readouterr().out

    def refuse(cls: object, kubeconfig: str | None) -> object:
        raise GatewayError("connect to https://127.0.0.1:1: refused")

    monkeypatch.setattr(nodes.MetricsCluster, "connect", classmethod(refuse))
    assert main(["nodes"]) == 2
    assert "tfctl nodes: connect to https://127.0.0.1:1: refused" in capsys.readouterr().err
