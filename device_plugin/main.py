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

from device_plugin.daemon import Daemon
from device_plugin.gpus import owned
from device_plugin.gpus.fake_probe import FakeProbe
from device_plugin.gpus.owned import OwnedProbe
from device_plugin.gpus.probe import GpuProbe, ProbeError
from device_plugin.gpus.probe_report import report
from device_plugin.settings import PluginSettings
from device_plugin.usage.process_kill import PidfdKiller, ProcessKiller
from device_plugin.usage.process_owner import ProcessResolver, ProcResolver
from tf_shell import settings_cli
from tf_shell.access import Gate
from tf_shell.catalog_file import CatalogFileError, load
from tf_shell.logfmt import formatter
from vgpu.catalog import Catalog

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


def catalog_from(settings: PluginSettings) -> Catalog:
    """The built-in GPU catalog with ``--gpu-catalog``'s models; a bad file stops the plugin naming it."""
    try:
        return load(Path(settings.gpu_catalog) if settings.gpu_catalog else None)
    except CatalogFileError as exc:
        raise SystemExit(f"tf-device-plugin: --gpu-catalog {exc}") from None


def _require_node(settings: PluginSettings) -> None:
    if not settings.node_name:
        raise SystemExit("tf-device-plugin: --node-name (or $NODE_NAME) is required")


def _probe(settings: PluginSettings) -> tuple[GpuProbe, ProcessResolver, ProcessKiller]:
    """The GPUs this plugin manages: NVML's (or the fake file's), narrowed to ``--gpus``; who owns their
    processes, and how one is stopped: ``/proc`` and pidfds (or the fake file's script)."""
    try:
        if settings.fake_gpus:
            fake = FakeProbe(Path(settings.fake_gpus))
            return OwnedProbe(fake, owned.parse(settings.gpus)), fake, fake
        from device_plugin.gpus.nvml_backend import NvmlProbe  # only where a driver exists

        resolver = ProcResolver()
        return OwnedProbe(NvmlProbe(), owned.parse(settings.gpus)), resolver, PidfdKiller(resolver)
    except ProbeError as exc:
        raise SystemExit(f"tf-device-plugin: {exc}") from None


def _print_probe(settings: PluginSettings) -> int:
    catalog = catalog_from(settings)
    probe, _, _ = _probe(settings)
    try:
        sys.stdout.write(report(probe, catalog, settings.default_milli_tflops))
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
    _require_node(settings)
    catalog = catalog_from(settings)
    from device_plugin.cluster.kube import connect
    from tf_shell.kube.client import api_client
    from tf_shell.kube.reviews import KubeReviews

    probe, resolver, killer = _probe(settings)
    try:
        gate = Gate(KubeReviews(api_client(settings.kubeconfig)), settings.access_review_ttl)
        daemon = Daemon(
            settings, probe, connect(settings.kubeconfig), catalog=catalog, resolver=resolver, killer=killer, gate=gate
        )
        asyncio.run(_serve(daemon))
    finally:
        probe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
