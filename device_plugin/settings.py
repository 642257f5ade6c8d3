"""The device plugin's settings: one typed object, read from flags and ``TF_PLUGIN_*`` environment variables.

It exists so that every knob of the node daemon is named, typed, defaulted and documented in one place,
the way the extender's and the webhook's are: :mod:`tf_shell.settings_cli` makes each field a flag, and
the daemon (:class:`~device_plugin.daemon.Daemon`) reads them, and the values derived from them, here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from device_plugin.enforcement.compute_overuse import ComputeOveruseAction
from device_plugin.enforcement.envs import EnforcementPaths
from device_plugin.enforcement.mps_plan import MpsConfig
from device_plugin.enforcement.vram_overuse import OveruseAction
from device_plugin.gpus.health import DEFAULT_IGNORED_XIDS, HealthPolicy
from device_plugin.kubelet.kubelet_api import DEFAULT_PODRESOURCES_SOCKET
from device_plugin.kubelet.lifecycle import DEFAULT_ENDPOINT, DEFAULT_PLUGIN_DIR, SocketConfig
from tf_shell.access import TTL_S
from tf_shell.logfmt import LogFormat, LogLevel
from vgpu.errors import DomainError
from vgpu.names import CDI_SPEC_DIR, DEFAULT_SLICES_PER_GPU, NVIDIA_TOOLKIT_CONFIG, DeviceDelivery, EnforcementBackend
from vgpu.quantity import parse_bytes, parse_milli

_PATHS = EnforcementPaths()


class PluginSettings(BaseSettings):
    """Settings of ``tf-device-plugin``."""

    model_config = SettingsConfigDict(env_prefix="TF_PLUGIN_", env_ignore_empty=True, extra="ignore", frozen=True)

    node_name: str | None = Field(
        None,
        validate_default=True,
        description="This node's name; unset: $NODE_NAME (the chart sets it from the pod's spec.nodeName).",
    )
    plugin_dir: str = Field(str(DEFAULT_PLUGIN_DIR), description="The kubelet's device-plugin socket directory.")
    endpoint: str = Field(DEFAULT_ENDPOINT, description="Our socket's file name in the plugin directory.")
    podresources_socket: str = Field(
        DEFAULT_PODRESOURCES_SOCKET,
        description="The kubelet's PodResources socket: its record of which pod got which devices proves every "
        "grant before a container starts (required).",
    )
    slices_per_gpu: int = Field(DEFAULT_SLICES_PER_GPU, ge=1, description="Device IDs advertised per healthy GPU.")
    backend: EnforcementBackend = Field(EnforcementBackend.NONE, description="How per-container limits are enforced.")
    hami_library: str = Field(_PATHS.hami_library, description="Host path of HAMi-core's libvgpu.so.")
    hami_preload: str = Field(
        _PATHS.hami_preload, description="Host file mounted as the container's /etc/ld.so.preload."
    )
    mps_pipe_host: str = Field(
        _PATHS.mps_pipe_host,
        description="Host MPS pipe directory: the MPS control daemon's (--backend=mps; the same path in the "
        "plugin's container), mounted into each container.",
    )
    mps_pipe_container: str = Field(_PATHS.mps_pipe_container, description="MPS pipe directory inside containers.")
    mps_shm_host: str = Field(
        _PATHS.mps_shm_host,
        description="Host directory that is the plugin's /dev/shm (--backend=mps: the MPS server's), mounted at "
        "/dev/shm in each container: MPS clients share memory with their server there.",
    )
    mps_log_dir: str = Field(
        "/run/nvidia/mps/log",
        description="The MPS control daemon's log directory (control.log, server.log); --backend=mps.",
    )
    mps_control: str = Field(
        "nvidia-cuda-mps-control",
        description="NVIDIA's MPS control program (a path, or a name on PATH) the plugin runs as the MPS control "
        "daemon for its GPUs under --backend=mps (docs/isolation-mps.md).",
    )
    mps_restart_backoff: float = Field(
        1.0,
        gt=0,
        description="Seconds before the MPS control daemon is started again after it died or failed to start; "
        "doubled on each failure in a row, up to 60.",
    )
    live_limits_dir: str = Field(
        "/var/lib/tensor-fusion/limits",
        description="Host directory of the per-container live-limits directories (<dir>/<pod UID>/<container>/, "
        "mounted into the container): limits.json, and HAMi-core's shared region, are rewritten there when a "
        "pod's limits change in place (docs/live-limits.md). The same path inside the plugin's container. Empty: "
        "off, limits are fixed at container start.",
    )
    receipts_file: str = Field(
        "/var/lib/tensor-fusion/handoff/receipts.json",
        description="Host file of the node's hand-off receipts (which device IDs each pod got; the same path in "
        "the plugin's container, in a directory that survives reboots). Empty: each receipt is written on its "
        "pod instead (annotation tensor-fusion.ai/handoff), one more pod write per GPU pod.",
    )
    live_limits_interval: float = Field(
        5.0,
        gt=0,
        description="Seconds between passes comparing each live-limits directory with its pod's allocation, "
        "besides the pass on every pod change (docs/live-limits.md).",
    )
    cdi_dir: str = Field(
        CDI_SPEC_DIR,
        description="Host CDI spec directory, one the container runtime reads (containerd >= 1.7 with enable_cdi, "
        "CRI-O): each Allocate answer is also written there as a CDI device, which the runtime applies after the "
        "container's own env and envFrom, so a container cannot override its limits (docs/security.md). The same "
        "path inside the plugin's container. Empty: off, the answer's env alone (a container's own variables of "
        "the same name win).",
    )
    device_delivery: Literal["auto", "envvar", "volume-mounts", "cdi"] = Field(
        "auto",
        description="How containers are given their GPUs: envvar (NVIDIA_VISIBLE_DEVICES), volume-mounts (/dev/null "
        "under /var/run/nvidia-container-devices, read where the NVIDIA toolkit accepts them), cdi (NVIDIA's CDI "
        "devices, nvidia.com/gpu=<UUID>); auto: the first of volume-mounts, cdi, envvar the node's toolkit "
        "configuration and CDI specs allow, checked every --toolkit-check-interval (docs/security.md).",
    )
    nvidia_toolkit_config: str = Field(
        NVIDIA_TOOLKIT_CONFIG,
        description="The NVIDIA container toolkit's configuration (host path, the same in the plugin's container): "
        "read to report a node whose toolkit gives GPUs to any container naming them by environment.",
    )
    nvidia_cdi_dirs: str = Field(
        "/etc/cdi,/var/run/cdi",
        description="Directories of NVIDIA's CDI specs (kind nvidia.com/gpu), separated by commas: cdi delivery "
        "needs one naming every GPU by UUID.",
    )
    toolkit_check_interval: float = Field(
        60.0, gt=0, description="Seconds between reads of the toolkit's configuration and NVIDIA's CDI specs."
    )
    fake_gpus: str | None = Field(None, description="YAML/JSON file describing fake GPUs; replaces NVML.")
    gpus: str = Field(
        "",
        description="The GPUs this plugin manages, by index or UUID, separated by commas; empty: all. On a node "
        "shared with NVIDIA's device plugin, give that one the others, so no GPU is advertised twice.",
    )
    default_tflops: str = Field(
        "0", description="TFLOPS advertised for GPU models missing from the catalog (a Kubernetes quantity)."
    )
    gpu_catalog: str | None = Field(
        None,
        description="YAML/JSON list of GPU models {key, tflops, memoryMiB, nvmlNames, aliases} added to the "
        "built-in catalog, replacing the model with the same key.",
    )
    ignored_xids: str = Field(
        ",".join(map(str, sorted(DEFAULT_IGNORED_XIDS))),
        description="XIDs that do not mark a GPU unhealthy, separated by commas.",
    )
    health_check_interval: float = Field(5.0, gt=0, description="Seconds between periodic GPU health checks.")
    health_recovery: float = Field(
        60.0, ge=0, description="Seconds without faults before an unhealthy GPU is healthy again."
    )
    pool: str | None = Field(
        None, description="GPU pool of this node; unset: its existing pool label, else the default pool."
    )
    heartbeat: float = Field(
        30.0, gt=0, description="Seconds between inventory heartbeats (patches happen on change too)."
    )
    lookup_wait: float = Field(
        2.0,
        ge=0,
        description="Seconds Allocate waits for a late allocation of a pod already on the node (API down: for "
        "the pod cache).",
    )
    reconcile_interval: float = Field(10.0, gt=0, description="Seconds between hand-off receipt reconciliations.")
    layout_check_interval: float = Field(
        30.0,
        gt=0,
        description="Seconds between listings of the GPUs that notice a changed layout (a MIG reconfiguration, a "
        "GPU gone or new); the plugin then exits, for its DaemonSet to start it again with the new layout.",
    )
    metrics_port: int = Field(
        9400, ge=0, le=65535, description="Port of /metrics and /usage; 0 disables both, and usage sampling."
    )
    metrics_address: str = Field("0.0.0.0", description="Address /metrics and /usage listen on.")
    access_review_ttl: float = Field(
        TTL_S,
        gt=0,
        description="Seconds a caller's token and its right to read /metrics or /usage (nodes/metrics, nodes/stats "
        "of this node, asked of the API server for callers off loopback) are believed before they are asked "
        "again (a refusal: 30 s at most).",
    )
    usage_interval: float = Field(
        5.0,
        gt=0,
        description="Seconds between samples of each GPU's per-process use, attributed to containers on /usage "
        "and in the per-container metrics.",
    )
    vram_overuse: OveruseAction = Field(
        OveruseAction.KILL,
        description="What to do about a pod that holds more GPU memory than its VRAM limit by the driver's "
        "count (its containers on a GPU together, past the tolerance, in two usage samples in a row): kill "
        "(SIGKILL its largest process on that GPU and post a Warning Event GpuMemoryLimitExceeded on the pod and "
        "the node; needs the KILL capability), "
        "report (the Event only) or off. Runs with the usage sampler, even with --metrics-port=0.",
    )
    vram_overuse_tolerance: str = Field(
        "512Mi",
        description="GPU memory a pod may hold on a GPU past its VRAM limit by the driver's count before "
        "--vram-overuse acts (the driver counts what the in-container limiters do not).",
    )
    compute_overuse: ComputeOveruseAction = Field(
        ComputeOveruseAction.REPORT,
        description="On --backend=hami-core: report (a Warning Event GpuComputeLimitExceeded on the pod and the node) "
        "a pod whose containers on a GPU used more of it than its TFLOPS limit gives HAMi-core, by the driver's "
        "count, on average over --compute-overuse-window and by more than --compute-overuse-margin; or off.",
    )
    compute_overuse_margin: int = Field(
        10, ge=1, le=100, description="Points of the GPU a pod's mean share may pass its cap by before it is reported."
    )
    compute_overuse_window: float = Field(
        60.0,
        gt=0,
        description="Seconds of usage samples a pod's mean share of a GPU is taken over (HAMi-core's own bursts, "
        "seconds long, must not be reported).",
    )
    kubeconfig: str | None = Field(
        None, description="Path to a kubeconfig; unset means in-cluster config, then ~/.kube/config."
    )
    log_level: LogLevel = Field("info", description="Log level.")
    log_format: LogFormat = Field(
        LogFormat.TEXT, description="text, or json: one object per line with pod, container, gpus and devices as keys."
    )
    probe: bool = Field(
        False, description="Print the GPUs found (NVML, or --fake-gpus) as they would be published, then exit."
    )

    @field_validator("node_name")
    @classmethod
    def _from_the_pod(cls, value: str | None) -> str | None:
        return value or os.environ.get("NODE_NAME")

    @field_validator("podresources_socket")
    @classmethod
    def _proves_grants(cls, value: str) -> str:
        if not value:
            raise ValueError(
                "must name the kubelet's PodResources socket: without it no grant can be proven and no GPU "
                "container could start"
            )
        return value

    @field_validator("default_tflops", "vram_overuse_tolerance")
    @classmethod
    def _quantity(cls, value: str, info: ValidationInfo) -> str:
        parse = parse_bytes if info.field_name == "vram_overuse_tolerance" else parse_milli
        try:
            parse(value)
        except DomainError as exc:
            raise ValueError("; ".join(e.problem for e in exc.errors)) from None
        return value

    @field_validator("ignored_xids")
    @classmethod
    def _xids(cls, value: str) -> str:
        if not all(x.strip().isdecimal() for x in value.split(",") if x.strip()):
            raise ValueError("must be XID numbers separated by commas, such as 13,79")
        return value

    # --- values derived from the fields ----------------------------------------------------------
    @property
    def node(self) -> str:
        """This node's name (the caller has checked it is set: the CLI refuses to start without it)."""
        if not self.node_name:
            raise ValueError("node_name is not set (--node-name or $NODE_NAME)")
        return self.node_name

    @property
    def sockets(self) -> SocketConfig:
        return SocketConfig(plugin_dir=Path(self.plugin_dir), endpoint=self.endpoint)

    @property
    def podresources_path(self) -> Path:
        return Path(self.podresources_socket)

    @property
    def enforcement_paths(self) -> EnforcementPaths:
        return EnforcementPaths(
            hami_library=self.hami_library,
            hami_preload=self.hami_preload,
            mps_pipe_host=self.mps_pipe_host,
            mps_pipe_container=self.mps_pipe_container,
            mps_shm_host=self.mps_shm_host,
        )

    @property
    def mps(self) -> MpsConfig:
        return MpsConfig(control=self.mps_control, pipe_dir=self.mps_pipe_host, log_dir=self.mps_log_dir)

    @property
    def default_milli_tflops(self) -> int:
        """TFLOPS for models missing from the catalog, in milli-TFLOPS."""
        return parse_milli(self.default_tflops)

    @property
    def vram_tolerance(self) -> int:
        """``--vram-overuse-tolerance`` in bytes."""
        return parse_bytes(self.vram_overuse_tolerance)

    @property
    def health(self) -> HealthPolicy:
        xids = frozenset(int(x) for x in self.ignored_xids.split(",") if x.strip())
        return HealthPolicy(ignored_xids=xids, recovery_s=self.health_recovery)

    @property
    def receipts_path(self) -> Path | None:
        """Where the node's hand-off receipts are kept; None: on the pods."""
        return Path(self.receipts_file) if self.receipts_file else None

    @property
    def cdi_path(self) -> Path | None:
        """Where the CDI spec files are written; None: CDI off."""
        return Path(self.cdi_dir) if self.cdi_dir else None

    @property
    def wanted_delivery(self) -> DeviceDelivery | None:
        """The delivery asked for; None: automatic."""
        return None if self.device_delivery == "auto" else DeviceDelivery(self.device_delivery)

    @property
    def nvidia_cdi_paths(self) -> tuple[Path, ...]:
        return tuple(Path(d.strip()) for d in self.nvidia_cdi_dirs.split(",") if d.strip())

    @property
    def live_limits_path(self) -> Path | None:
        """Where the live-limits directories are; None: off."""
        return Path(self.live_limits_dir) if self.live_limits_dir else None
