"""One real GPU node: a real kubelet over a fake container runtime, in a private mount namespace.

WHY: the device plugin's contract is with the kubelet (registration, ListAndWatch, Allocate at
admission, restarts that wipe its socket directory), and only a real kubelet behaves like one.
The kubelet hard-codes /var/lib/kubelet/device-plugins whatever --root-dir says, so it runs under
``unshare -m`` with a scratch directory bind-mounted there; our device plugin, outside that
namespace, uses the scratch directory itself (a bind mount: the same directory). The fake runtime
records every CreateContainer, which is where the env our plugin answered must show up, and which GPUs
NVIDIA's container toolkit would hand the container under the node's toolkit configuration.
The kubelet changes a few kernel sysctls at start; they are restored when the node stops.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vgpu.names import TOOLKIT_ACCEPT_ENVVAR, TOOLKIT_ACCEPT_MOUNTS

from .procs import Proc, free_port, http_ok, wait_until

KUBELET_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")


@dataclass
class KubeletNode:
    name: str
    bin: Path
    root: Path
    kubeconfig: Path
    ca: Path
    labels: dict[str, str] = field(default_factory=dict)
    cri: Proc | None = None
    kubelet: Proc | None = None
    sysctls: dict[str, str] = field(default_factory=dict)

    @property
    def device_plugin_dir(self) -> Path:
        """The directory the kubelet sees as /var/lib/kubelet/device-plugins."""
        return self.root / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root / "kubelet" / "pod-resources" / "kubelet.sock"

    @property
    def cri_socket(self) -> Path:
        return self.root / "cri.sock"

    @property
    def toolkit_config(self) -> Path:
        """The node's NVIDIA container toolkit configuration: the fake runtime decides each container's GPUs by it
        (read at every create, as the toolkit does) and the device plugin checks it."""
        return self.root / "nvidia-container-runtime" / "config.toml"

    def set_toolkit(self, *, guarded: bool) -> None:
        """Write the toolkit configuration: as docs/security.md asks (GPUs by volume mounts, none by
        environment), or with the toolkit's defaults (an empty file: any container naming GPUs gets them)."""
        self.toolkit_config.parent.mkdir(parents=True, exist_ok=True)
        text = f"{TOOLKIT_ACCEPT_ENVVAR} = false\n{TOOLKIT_ACCEPT_MOUNTS} = true\n" if guarded else ""
        staged = self.toolkit_config.with_suffix(".staged")
        staged.write_text(text)
        staged.replace(self.toolkit_config)

    @property
    def creates_log(self) -> Path:
        """One JSON line per CRI CreateContainer the kubelet made."""
        return self.root / "create-container.jsonl"

    def creates(self) -> list[dict[str, Any]]:
        if not self.creates_log.exists():
            return []
        return [json.loads(line) for line in self.creates_log.read_text().splitlines() if line.strip()]

    def start(self) -> None:
        if os.geteuid() != 0:
            raise PermissionError("a real kubelet needs root (mount namespace, cgroups)")
        for sub in ("device-plugins", "kubelet", "pod-logs", "volume-plugins", "cwd", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.sysctls = {k: (Path("/proc/sys") / k).read_text().strip() for k in SYSCTLS}
        self.set_toolkit(guarded=True)
        self.cri = Proc(
            f"fake-cri-{self.name}",
            [
                str(self.bin / "fake-cri"),
                f"-socket={self.cri_socket}",
                f"-log={self.creates_log}",
                f"-nvidia-toolkit-config={self.toolkit_config}",
            ],
            self.root / "logs" / "fake-cri.log",
        ).start()
        wait_until("fake CRI socket", self.cri_socket.exists, 30, [self.cri])
        self.healthz_port = free_port()
        self.port = free_port()
        (self.root / "kubelet-config.yaml").write_text(yaml.safe_dump(self._config()))
        self.start_kubelet()

    def _config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupsPerQOS": False,
            "cgroupDriver": "cgroupfs",
            "enforceNodeAllocatable": [],
            "address": "127.0.0.1",
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.cri_socket}",
            "podLogsDir": str(self.root / "pod-logs"),
            "volumePluginDir": str(self.root / "volume-plugins"),
            "nodeStatusUpdateFrequency": "1s",
            "nodeStatusReportFrequency": "1s",
            "syncFrequency": "10s",
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "localStorageCapacityIsolation": False,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%", "imagefs.available": "0%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "kubeAPIQPS": 100,
            "kubeAPIBurst": 200,
            "resolvConf": "",
            "maxPods": 110,
        }

    def start_kubelet(self) -> None:
        mount = f'mkdir -p {KUBELET_DEVICE_PLUGIN_DIR} && mount --bind "$0" {KUBELET_DEVICE_PLUGIN_DIR} && exec "$@"'
        self.kubelet = Proc(
            f"kubelet-{self.name}",
            [
                "unshare",
                "-m",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                mount,
                str(self.device_plugin_dir),
                str(self.bin / "kubelet"),
                f"--config={self.root / 'kubelet-config.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={self.root / 'kubelet'}",
                f"--cert-dir={self.root / 'kubelet' / 'pki'}",
                f"--hostname-override={self.name}",
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in self.labels.items()),
                "--v=2",
            ],
            self.root / "logs" / "kubelet.log",
            cwd=self.root / "cwd",
        ).start()
        wait_until(
            "kubelet healthz",
            lambda: http_ok(f"http://127.0.0.1:{self.healthz_port}/healthz"),
            90,
            [self.kubelet],
        )
        wait_until("kubelet.sock", (self.device_plugin_dir / "kubelet.sock").exists, 30, [self.kubelet])

    def kubelet_sock_identity(self) -> tuple[int, int]:
        """(inode, ctime_ns) of kubelet.sock: a restart makes a new one (the inode may be reused)."""
        st = (self.device_plugin_dir / "kubelet.sock").stat()
        return st.st_ino, st.st_ctime_ns

    def restart_kubelet(self) -> None:
        """Stop and start the kubelet; returns once the new kubelet has made its own kubelet.sock (the old
        file outlives the old process, and the new kubelet answers healthz before it replaces it)."""
        assert self.kubelet is not None
        before = self.kubelet_sock_identity()
        self.kubelet.stop()
        self.start_kubelet()
        wait_until(
            "a new kubelet.sock", lambda: self._sock_identity_or_none() not in (None, before), 30, [self.kubelet]
        )

    def _sock_identity_or_none(self) -> tuple[int, int] | None:
        try:
            return self.kubelet_sock_identity()
        except FileNotFoundError:  # between the new kubelet's removal of the old one and its own
            return None

    def stop(self) -> None:
        for proc in (self.kubelet, self.cri):
            if proc is not None:
                proc.stop()
        for key, value in self.sysctls.items():
            (Path("/proc/sys") / key).write_text(value + "\n")

    @property
    def procs(self) -> list[Proc]:
        return [p for p in (self.cri, self.kubelet) if p is not None]
