"""Child processes under the run's time budget: a command run to its end, a long-lived child read line by
line while it runs, and the JSON lines the check's programs print."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

DEADLINE = [time.time() + 3600.0]  # --budget sets it: every wait ends by then


def set_budget(seconds: float) -> None:
    DEADLINE[0] = time.time() + seconds


def bounded(timeout: float) -> float:
    """``timeout``, cut to what is left of the run's budget (at least a few seconds)."""
    return max(3.0, min(timeout, DEADLINE[0] - time.time()))


def run(
    cmd: list[str],
    *,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``cmd`` to its end; a timeout is rc 124 and a missing program rc 127, never an exception."""
    timeout = bounded(timeout)
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, input=stdin, check=False
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return subprocess.CompletedProcess(cmd, 124, out, err + f"\n[gpu-check] timed out after {timeout}s")
    except OSError as exc:
        return subprocess.CompletedProcess(cmd, 127, "", f"[gpu-check] cannot run {cmd[0]}: {exc}")


def lines_of(text: str) -> list[dict[str, Any]]:
    """The JSON objects among ``text``'s lines."""
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                found.append(value)
    return found


def step(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The first row whose ``step`` is ``name``, else an empty one."""
    return next((r for r in rows if r.get("step") == name), {})


class Reader:
    """A child's output, drained by two threads: each JSON line of stdout kept with the time it came, and
    stderr kept whole (HAMi-core logs there; an undrained pipe would stall the child)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.rows: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._drain, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw.append(line)
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    self.rows.append({**value, "_seen": time.time()})

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)

    def wait_for(self, key: str, value: str, timeout: float) -> dict[str, Any] | None:
        deadline = time.time() + bounded(timeout)
        while time.time() < deadline:
            hit = next((r for r in self.rows if r.get(key) == value), None)
            if hit is not None:
                return hit
            if self.proc.poll() is not None and not self._threads[0].is_alive():
                return None
            time.sleep(0.05)
        return None

    def finish(self, timeout: float) -> str:
        """Wait for the child (killed after ``timeout``); its stderr."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=bounded(timeout))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.err.append("\n[gpu-check] killed after timeout")
        for thread in self._threads:
            thread.join(5)
        return "".join(self.err)
