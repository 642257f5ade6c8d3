"""``tf-device-plugin``: command-line flags (each also a ``TF_PLUGIN_*`` variable) to a running daemon.

Flags are the operator's whole interface on a node: where the kubelet's sockets are, how many
slices each GPU offers, which enforcement backend this node uses, health-check timing, GPU models
added to or overriding the built-in catalog, and the fake GPU file that replaces NVML on machines
without GPUs (demo, end-to-end tests). ``--probe`` prints what the node's GPUs would be published
as and exits (no kubelet or API server needed): the first thing to run on a new GPU node.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from device_plugin.daemon import Daemon, PluginConfig
from device_plugin.envs import EnforcementPaths
from device_plugin.fake_probe import FakeProbe
from device_plugin.health import DEFAULT_IGNORED_XIDS, HealthPolicy
from device_plugin.kubelet_api import DEFAULT_PODRESOURCES_SOCKET
from device_plugin.lifecycle import DEFAULT_ENDPOINT, DEFAULT_PLUGIN_DIR, SocketConfig
from device_plugin.probe import GpuProbe, ProbeError
from device_plugin.probe_report import report
from vgpu.catalog import Catalog
from vgpu.catalog_file import CatalogFileError, load
from vgpu.logfmt import LogFormat, formatter
from vgpu.names import DEFAULT_SLICES_PER_GPU, DISTRIBUTION, EnforcementBackend
from vgpu.quantity import parse_milli

log = logging.getLogger("device_plugin")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tf-device-plugin",
        description="GPU node daemon: advertises vGPU slices to the kubelet, hands each container its GPU "
        "grant and limits, publishes the node's GPU inventory. --probe prints what NVML (or --fake-gpus) "
        "finds, as it would be published, and exits.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version(DISTRIBUTION)}")

    def add(flag: str, default: str | None, help: str, **kw: Any) -> None:  # noqa: A002
        env = "TF_PLUGIN_" + flag.upper().replace("-", "_")
        p.add_argument(f"--{flag}", default=os.environ.get(env, default), help=f"{help} [env {env}]", **kw)

    add("node-name", os.environ.get("NODE_NAME"), "this node's name (default: $NODE_NAME)")
    add("plugin-dir", str(DEFAULT_PLUGIN_DIR), "kubelet device-plugin socket directory")
    add("endpoint", DEFAULT_ENDPOINT, "our socket's file name in the plugin dir")
    add(
        "podresources-socket",
        DEFAULT_PODRESOURCES_SOCKET,
        "kubelet PodResources socket: its record of which pod got which devices proves every grant before "
        "a container starts (required)",
    )
    add("slices-per-gpu", str(DEFAULT_SLICES_PER_GPU), "device IDs advertised per healthy GPU", type=int)
    add("backend", EnforcementBackend.NONE.value, "limit enforcement", choices=[b.value for b in EnforcementBackend])
    add("hami-library", EnforcementPaths().hami_library, "host path of HAMi-core's libvgpu.so")
    add("hami-preload", EnforcementPaths().hami_preload, "host file mounted as the container's /etc/ld.so.preload")
    add("mps-pipe-host", EnforcementPaths().mps_pipe_host, "host MPS pipe directory")
    add("mps-pipe-container", EnforcementPaths().mps_pipe_container, "MPS pipe directory inside containers")
    add("fake-gpus", None, "YAML/JSON file describing fake GPUs; replaces NVML")
    add("default-tflops", "0", "TFLOPS advertised for GPU models missing from the catalog (quantity)")
    add(
        "gpu-catalog",
        None,
        "YAML/JSON list of GPU models {key, tflops, memoryMiB, nvmlNames, aliases} added to the built-in "
        "catalog, replacing the model with the same key",
    )
    add("ignored-xids", ",".join(map(str, sorted(DEFAULT_IGNORED_XIDS))), "XIDs that do not mark a GPU unhealthy")
    add("health-check-interval", "5", "seconds between periodic GPU health checks", type=float)
    add("health-recovery", "60", "seconds without faults before an unhealthy GPU is healthy again", type=float)
    add("pool", None, "GPU pool of this node (default: its existing pool label, else the default pool)")
    add("heartbeat", "30", "seconds between inventory heartbeats (patches happen on change too)", type=float)
    add(
        "lookup-wait",
        "2",
        "seconds Allocate waits for a late allocation of a pod already on the node (API down: for the pod cache)",
        type=float,
    )
    add("reconcile-interval", "10", "seconds between hand-off receipt reconciliations", type=float)
    add("metrics-port", "9400", "port of /metrics (0 disables)", type=int)
    add("kubeconfig", None, "kubeconfig path (default: in-cluster, then ~/.kube/config)")
    add("log-level", "info", "log level", choices=["debug", "info", "warning", "error"])
    add(
        "log-format",
        LogFormat.TEXT.value,
        "text, or json: one object per line with pod, container, gpus and devices as keys",
        choices=[f.value for f in LogFormat],
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="print the GPUs found (NVML, or --fake-gpus) as they would be published, then exit",
    )
    return p


def _catalog(args: argparse.Namespace) -> Catalog:
    try:
        return load(Path(args.gpu_catalog) if args.gpu_catalog else None)
    except CatalogFileError as exc:
        raise SystemExit(f"tf-device-plugin: --gpu-catalog {exc}") from None


def _default_tflops(args: argparse.Namespace) -> int:
    return parse_milli(str(args.default_tflops), key="--default-tflops")


def _podresources(args: argparse.Namespace) -> Path:
    if not args.podresources_socket:
        raise SystemExit(
            "tf-device-plugin: --podresources-socket must name the kubelet's PodResources socket: without it no "
            "grant can be proven and no GPU container could start"
        )
    return Path(args.podresources_socket)


def config_from(args: argparse.Namespace) -> PluginConfig:
    if not args.node_name:
        raise SystemExit("tf-device-plugin: --node-name (or $NODE_NAME) is required")
    xids = frozenset(int(x) for x in str(args.ignored_xids).split(",") if x.strip())
    return PluginConfig(
        node=args.node_name,
        sockets=SocketConfig(plugin_dir=Path(args.plugin_dir), endpoint=args.endpoint),
        podresources_socket=_podresources(args),
        slices_per_gpu=args.slices_per_gpu,
        backend=EnforcementBackend(args.backend),
        paths=EnforcementPaths(
            hami_library=args.hami_library,
            hami_preload=args.hami_preload,
            mps_pipe_host=args.mps_pipe_host,
            mps_pipe_container=args.mps_pipe_container,
        ),
        default_tflops=_default_tflops(args),
        catalog=_catalog(args),
        health=HealthPolicy(ignored_xids=xids, recovery_s=args.health_recovery),
        health_check_s=args.health_check_interval,
        pool=args.pool,
        heartbeat_s=args.heartbeat,
        lookup_wait_s=args.lookup_wait,
        reconcile_s=args.reconcile_interval,
        metrics_port=args.metrics_port,
    )


def _probe(fake: str | None) -> GpuProbe:
    if fake:
        return FakeProbe(Path(fake))
    from device_plugin.nvml_backend import NvmlProbe  # only where a driver exists

    try:
        return NvmlProbe()
    except ProbeError as exc:
        raise SystemExit(f"tf-device-plugin: {exc}") from None


def _print_probe(args: argparse.Namespace) -> int:
    catalog, default_tflops = _catalog(args), _default_tflops(args)
    probe = _probe(args.fake_gpus)
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
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter(LogFormat(args.log_format)))
    if args.probe:
        return _print_probe(args)
    config = config_from(args)
    from device_plugin.kube import KubeApi

    probe = _probe(args.fake_gpus)
    try:
        asyncio.run(_serve(Daemon(config, probe, KubeApi(args.kubeconfig))))
    finally:
        probe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
