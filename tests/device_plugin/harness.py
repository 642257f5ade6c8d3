"""Runs the real plugin assembly (Daemon) against a test kubelet in a temporary directory."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from device_plugin.daemon import Daemon, PluginConfig
from device_plugin.fake_probe import FakeProbe
from device_plugin.kubelet_api import PodDevices
from device_plugin.lifecycle import SocketConfig
from tests.device_plugin.fakes import NODE, FakeKube
from tests.device_plugin.kubelet import TestKubelet

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Return once ``predicate()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def config(tmp: Path, **overrides: Any) -> PluginConfig:
    sockets = SocketConfig(plugin_dir=tmp, endpoint="tf-vgpu.sock", poll_s=0.05, retry_s=0.2)
    base = PluginConfig(node=NODE, sockets=sockets, slices_per_gpu=4, health_check_s=0.05, heartbeat_s=60)
    return dataclasses.replace(base, **overrides)


@contextlib.asynccontextmanager
async def plugin(
    tmp: Path,
    kube: FakeKube,
    gpus: Path,
    *,
    kubelet: TestKubelet | None = None,
    pod_devices: Callable[[], Awaitable[PodDevices]] | None = None,
    **overrides: Any,
) -> AsyncIterator[tuple[Daemon, TestKubelet]]:
    """A registered plugin reading the test kubelet's PodResources record (unless ``pod_devices``); on exit
    it is stopped (SIGTERM path) and the kubelet too."""
    own = kubelet is None
    if kubelet is None:
        kubelet = TestKubelet(tmp)
        await kubelet.start()
    probe = FakeProbe(gpus)  # its scripted processes' owners too, as under --fake-gpus
    daemon = Daemon(
        config(tmp, **overrides), probe, kube, pod_devices=pod_devices or kubelet.pod_devices, resolver=probe
    )
    stopping = asyncio.Event()
    task = asyncio.create_task(daemon.run(stopping))
    try:
        await asyncio.wait_for(kubelet.registrations.get(), 5)
        yield daemon, kubelet
    finally:
        stopping.set()
        await asyncio.wait_for(task, 5)
        if own:
            await kubelet.stop()
