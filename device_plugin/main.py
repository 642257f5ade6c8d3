"""``tf-device-plugin``: command-line flags (each also a ``TF_PLUGIN_*`` variable) to a running daemon.

Flags (the fields of :class:`~device_plugin.settings.PluginSettings`) are the operator's whole
interface on a node: where the kubelet's sockets are, how many slices each GPU offers, which
enforcement backend this node uses, health-check timing, GPU models added to or overriding the
built-in catalog, and the fake GPU file that replaces NVML on machines without GPUs (demo,
end-to-end tests). ``--probe`` prints what the node's GPUs would be published
as and exits (no kubelet or API server needed): the first thing to run on a new GPU node.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from device_plugin import owned
from device_plugin.daemon import Daemon, PluginConfig
from device_plugin.envs import EnforcementPaths
from device_plugin.fake_probe import FakeProbe
from device_plugin.health import HealthPolicy
from device_plugin.lifecycle import SocketConfig
from device_plugin.owned import OwnedProbe
from device_plugin.probe import GpuProbe, ProbeError
from device_plugin.probe_report import report
from device_plugin.process_owner import ProcessResolver, ProcResolver
from device_plugin.settings import PluginSettings
from vgpu import settings_cli
from vgpu.catalog import Catalog
from vgpu.catalog_file import CatalogFileError, load
from vgpu.logfmt import formatter
from vgpu.quantity import parse_milli

log = logging.getLogger("device_plugin")


def settings_from(argv: Sequence[str] | None = None) -> PluginSettings:
    """Settings from the ``TF_PLUGIN_*`` environment, overridden by the flags given."""
    return settings_cli.settings_from(
        PluginSettings,
        "tf-device-plugin",
        "GPU node daemon: advertises vGPU slices to the kubelet, hands each container its GPU grant and limits, "
        "publishes the node's GPU inventory. --probe prints what NVML (or --fake-gpus) finds, as it would be "
        "published, and exits.",
        argv,
    )


def _catalog(settings: PluginSettings) -> Catalog:
    try:
        return load(Path(settings.gpu_catalog) if settings.gpu_catalog else None)
    except CatalogFileError as exc:
        raise SystemExit(f"tf-device-plugin: --gpu-catalog {exc}") from None


def config_from(settings: PluginSettings) -> PluginConfig:
    if not settings.node_name:
        raise SystemExit("tf-device-plugin: --node-name (or $NODE_NAME) is required")
    xids = frozenset(int(x) for x in settings.ignored_xids.split(",") if x.strip())
    return PluginConfig(
        node=settings.node_name,
        sockets=SocketConfig(plugin_dir=Path(settings.plugin_dir), endpoint=settings.endpoint),
        podresources_socket=Path(settings.podresources_socket),
        slices_per_gpu=settings.slices_per_gpu,
        backend=settings.backend,
        paths=EnforcementPaths(
            hami_library=settings.hami_library,
            hami_preload=settings.hami_preload,
            mps_pipe_host=settings.mps_pipe_host,
            mps_pipe_container=settings.mps_pipe_container,
        ),
        default_tflops=parse_milli(settings.default_tflops),
        catalog=_catalog(settings),
        health=HealthPolicy(ignored_xids=xids, recovery_s=settings.health_recovery),
        health_check_s=settings.health_check_interval,
        pool=settings.pool,
        heartbeat_s=settings.heartbeat,
        lookup_wait_s=settings.lookup_wait,
        reconcile_s=settings.reconcile_interval,
        metrics_port=settings.metrics_port,
        metrics_address=settings.metrics_address,
        usage_interval_s=settings.usage_interval,
        live_limits_dir=Path(settings.live_limits_dir) if settings.live_limits_dir else None,
    )


def _probe(settings: PluginSettings) -> tuple[GpuProbe, ProcessResolver]:
    """The GPUs this plugin manages: NVML's (or the fake file's), narrowed to ``--gpus``; and who owns
    their processes: ``/proc`` (or the fake file's script)."""
    try:
        if settings.fake_gpus:
            fake = FakeProbe(Path(settings.fake_gpus))
            return OwnedProbe(fake, owned.parse(settings.gpus)), fake
        from device_plugin.nvml_backend import NvmlProbe  # only where a driver exists

        return OwnedProbe(NvmlProbe(), owned.parse(settings.gpus)), ProcResolver()
    except ProbeError as exc:
        raise SystemExit(f"tf-device-plugin: {exc}") from None


def _print_probe(settings: PluginSettings) -> int:
    catalog, default_tflops = _catalog(settings), parse_milli(settings.default_tflops)
    probe, _ = _probe(settings)
    try:
        sys.stdout.write(report(probe, catalog, default_tflops))
    finally:
        probe.close()
    return 0


async def _serve(daemon: Daemon) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    loop.add_signal_handler(signal.SIGHUP, daemon.server.restart.set)
    await daemon.run(stopping)


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from(argv)
    logging.basicConfig(level=settings.log_level.upper())
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter(settings.log_format))
    if settings.probe:
        return _print_probe(settings)
    config = config_from(settings)
    from device_plugin.kube import KubeApi

    probe, resolver = _probe(settings)
    try:
        asyncio.run(_serve(Daemon(config, probe, KubeApi(settings.kubeconfig), resolver=resolver)))
    finally:
        probe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
