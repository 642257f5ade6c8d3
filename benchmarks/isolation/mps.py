"""The hard mode's NVIDIA MPS control daemon, started by the benchmark and always put back.

:func:`mps_daemon` reads the GPU's compute mode, sets EXCLUSIVE_PROCESS (NVIDIA's advice for MPS: only
the MPS server holds a context), starts ``nvidia-cuda-mps-control -d`` with a private pipe and log
directory, and on the way out — error or not — sends the daemon ``quit`` and restores the compute mode it
found. Every command goes through a runner (``procs.run`` by default; a fake in the tests) and is kept in
the caller's log.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from benchmarks.gpu_check.procs import run as run_command
from vgpu.names import Env

LOG_DIRECTORY = "CUDA_MPS_LOG_DIRECTORY"  # the daemon's own log folder (not a tenant's variable)
EXCLUSIVE = "EXCLUSIVE_PROCESS"


class Runner(Protocol):
    def __call__(
        self, cmd: list[str], *, env: dict[str, str] | None = ..., stdin: str | None = ...
    ) -> subprocess.CompletedProcess[str]: ...


class MpsError(RuntimeError):
    """A step of the daemon's start failed; what was changed before it has been put back."""


def compute_mode(index: int, run: Runner) -> str:
    """The GPU's compute mode as ``nvidia-smi -c`` takes it back (``Default`` → ``DEFAULT``)."""
    done = run(["nvidia-smi", "-i", str(index), "--query-gpu=compute_mode", "--format=csv,noheader"])
    if done.returncode != 0 or not done.stdout.strip():
        raise MpsError(f"cannot read GPU {index}'s compute mode: rc {done.returncode} {done.stderr.strip()[:300]}")
    return done.stdout.strip().upper()


def checked(run: Runner, log: list[str], cmd: list[str], env: dict[str, str] | None = None, stdin: str = "") -> bool:
    done = run(cmd, env=env, stdin=stdin or None)
    log.append(f"$ {' '.join(cmd)}{' <<< ' + stdin.strip() if stdin else ''}: rc {done.returncode}")
    if done.returncode != 0:
        log.append(f"  {(done.stdout + done.stderr).strip()[:500]}")
    return done.returncode == 0


def daemon_env(pipe: Path) -> dict[str, str]:
    """The control program's environment for the daemon whose pipe directory is ``pipe`` (logs beside it)."""
    return {**os.environ, Env.MPS_PIPE_DIRECTORY.value: str(pipe), LOG_DIRECTORY: str(pipe.parent / "log")}


def control(pipe: Path, lines: Sequence[str], log: list[str], run: Runner = run_command) -> str | None:
    """Send ``lines`` to the running daemon of ``pipe``: what it printed, or None when it failed (logged)."""
    stdin = "".join(f"{line}\n" for line in lines)
    done = run(["nvidia-cuda-mps-control"], env=daemon_env(pipe), stdin=stdin)
    log.append(f"$ nvidia-cuda-mps-control <<< {'; '.join(lines)}: rc {done.returncode}")
    if done.returncode != 0:
        log.append(f"  {(done.stdout + done.stderr).strip()[:500]}")
        return None
    return done.stdout


@contextlib.contextmanager
def mps_daemon(index: int, folder: Path, log: list[str], run: Runner = run_command) -> Iterator[Path]:
    """The daemon up on GPU ``index`` with its pipe directory under ``folder`` (yielded); stopped and the
    compute mode restored on leaving, whatever happened inside. Every command and its outcome go to ``log``."""
    pipe, logs = folder / "pipe", folder / "log"
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = daemon_env(pipe)
    found = compute_mode(index, run)
    log.append(f"compute mode found: {found}")
    if not checked(run, log, ["nvidia-smi", "-i", str(index), "-c", EXCLUSIVE]):
        raise MpsError(f"cannot set GPU {index} to {EXCLUSIVE}: {log[-1].strip()}")
    try:
        if not checked(run, log, ["nvidia-cuda-mps-control", "-d"], env):
            raise MpsError(f"nvidia-cuda-mps-control -d failed: {log[-1].strip()}")
        try:
            yield pipe
        finally:
            checked(run, log, ["nvidia-cuda-mps-control"], env, "quit\n")
    finally:
        if not checked(run, log, ["nvidia-smi", "-i", str(index), "-c", found]):
            log.append(f"COMPUTE MODE NOT RESTORED: set it back by hand: nvidia-smi -i {index} -c {found}")
