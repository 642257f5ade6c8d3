"""Child processes of the end-to-end cluster: where their binaries come from, started with their
logs on disk, stopped by PID.

WHY: the tier runs a dozen long-lived programs (etcd, the API server, the scheduler, the kubelet,
the fake runtime, our three binaries). A failed test must leave nothing listening and must show
what each program said, so every process gets its own log file, a bounded stop (SIGTERM, then
SIGKILL), and the harness waits for each one to answer before using it. The Kubernetes binaries
come from ``scripts/build-k8s.sh`` (the one place that knows the pinned version), cached outside
the clone, so tests, the demo and CI agree on the cache and never rebuild what is there.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-k8s.sh"
NEEDED = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "fake-cri")


def build(script: Path) -> Path:
    """Run a build script of scripts/ (a no-op when everything is cached): the directory its last stdout line
    names (progress goes to stderr)."""
    done = subprocess.run([str(script)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(done.stdout.strip().splitlines()[-1])


def cached(script: Path) -> bool:
    """Whether a build script's ``--check`` finds everything in the cache already (nothing to build)."""
    check = subprocess.run([str(script), "--check"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return check.returncode == 0


def ensure_binaries() -> Path:
    """Run the Kubernetes build script (a no-op when everything is cached) and return the bin directory."""
    bin_dir = build(BUILD_SCRIPT)
    missing = [name for name in NEEDED if not (bin_dir / name).exists()]
    if missing:
        raise FileNotFoundError(f"{BUILD_SCRIPT} finished but {missing} are not in {bin_dir}")
    return bin_dir


def built() -> bool:
    """Whether every Kubernetes binary is in the cache already (nothing to build)."""
    return cached(BUILD_SCRIPT)


class StartupError(RuntimeError):
    """A process died or never became ready; the message carries the tail of its log."""


# Ports handed out by free_port in this process: each once.
_GIVEN: set[int] = set()


def free_port() -> int:
    """A loopback port free now for a child to listen on, chosen below the kernel's ephemeral range.

    A port the kernel picks (bind to 0) is an ephemeral one, which any outgoing connection (etcd's, the API
    server's, a client's) may take between this choice and the child's bind: the webhook once failed with
    "address already in use" that way. Ports below the range are never given to outgoing connections.
    """
    low = _ephemeral_low()
    for _ in range(1000):
        port = random.randint(max(1025, low - 12000), low - 1)
        if port in _GIVEN:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free loopback port below {low}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"(no log at {path})"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


@dataclass
class Proc:
    """One child process with its log file."""

    name: str
    argv: Sequence[str]
    log: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"\n=== start: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                list(self.argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.popen.returncode if self.popen else None
            raise StartupError(f"{self.name} exited with {code}; last log lines:\n{tail(self.log)}")

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """Signal the process by PID, wait a bounded time, then SIGKILL it."""
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, sig)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.stop(timeout=10, sig=signal.SIGKILL)


def wait_until(
    what: str, probe: Callable[[], bool], timeout: float, procs: Sequence[Proc] = (), every: float = 0.2
) -> None:
    """Poll ``probe`` until it is true; fail fast if one of ``procs`` died meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            p.check_alive()
        with contextlib.suppress(Exception):
            if probe():
                return
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name} ({p.log}):\n{tail(p.log)}" for p in procs)
            raise StartupError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}")
        time.sleep(every)


def http_ok(url: str, ca: Path | None = None, token: str | None = None) -> bool:
    """True when ``url`` answers 200 (TLS checked against ``ca`` when given)."""
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def tcp_listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine outside 127.0.0.0/8, or None when it has none (Endpoints and
    EndpointSlices refuse loopback addresses, so what the API server reaches through a Service listens here)."""
    if shutil.which("ip"):
        listed = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
        found = re.findall(r"\binet (\d+\.\d+\.\d+\.\d+)/", listed.stdout)
        return found[0] if found else None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        try:
            udp.connect(("192.0.2.1", 9))  # TEST-NET-1: picks the source address of a route out; sends nothing
        except OSError:
            return None
        address: str = udp.getsockname()[0]
        return None if address.startswith("127.") else address
