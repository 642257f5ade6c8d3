"""Runs the real plugin assembly (Daemon) against a test kubelet in a temporary directory."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from device_plugin.daemon import Daemon
from device_plugin.gpus.fake_probe import FakeProbe
from device_plugin.kubelet.kubelet_api import PodDevices
from device_plugin.settings import PluginSettings
from tests.device_plugin.fakes import NODE, FakeKube
from tests.device_plugin.kubelet import TestKubelet
from vgpu.catalog import Catalog, builtin
from vgpu.names import TOOLKIT_ACCEPT_ENVVAR, TOOLKIT_ACCEPT_MOUNTS

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Return once ``predicate()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def settings(tmp: Path, **overrides: Any) -> PluginSettings:
    """The plugin's settings for a test: its sockets in ``tmp``, fast health checks, no /metrics server, no
    live-limits directories, no node-local receipts (on the pods instead) and no CDI spec files unless ``overrides`` (settings fields) ask for them, on a
    node whose NVIDIA toolkit is set as docs/security.md asks (GPUs by volume mounts, none by environment)."""
    toolkit = tmp / "toolkit.toml"
    toolkit.write_text(f"{TOOLKIT_ACCEPT_ENVVAR} = false\n{TOOLKIT_ACCEPT_MOUNTS} = true\n")
    base: dict[str, Any] = {
        "node_name": NODE,
        "plugin_dir": str(tmp),
        "endpoint": "tf-vgpu.sock",
        "slices_per_gpu": 4,
        "health_check_interval": 0.05,
        "heartbeat": 60,
        "metrics_port": 0,
        "live_limits_dir": "",
        "receipts_file": "",
        "cdi_dir": "",
        "nvidia_toolkit_config": str(toolkit),
        "nvidia_cdi_dirs": "",
    }
    return PluginSettings(**(base | overrides))


@contextlib.asynccontextmanager
async def plugin(
    tmp: Path,
    kube: FakeKube,
    gpus: Path,
    *,
    kubelet: TestKubelet | None = None,
    pod_devices: Callable[[], Awaitable[PodDevices]] | None = None,
    catalog: Catalog | None = None,
    live_limits_grace_s: float = 30.0,
    cdi_grace_s: float = 30.0,
    **overrides: Any,
) -> AsyncIterator[tuple[Daemon, TestKubelet]]:
    """A registered plugin reading the test kubelet's PodResources record (unless ``pod_devices``), with
    ``overrides`` of its settings; on exit it is stopped (SIGTERM path) and the kubelet too."""
    own = kubelet is None
    if kubelet is None:
        kubelet = TestKubelet(tmp)
        await kubelet.start()
    probe = FakeProbe(gpus)  # its scripted processes' owners and killer too, as under --fake-gpus
    daemon = Daemon(
        settings(tmp, **overrides),
        probe,
        kube,
        catalog=catalog or builtin(),
        pod_devices=pod_devices or kubelet.pod_devices,
        resolver=probe,
        killer=probe,
        live_limits_grace_s=live_limits_grace_s,
        cdi_grace_s=cdi_grace_s,
        socket_poll_s=0.05,
        socket_retry_s=0.2,
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
