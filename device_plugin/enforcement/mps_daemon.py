"""Runs NVIDIA's MPS control daemon for the plugin's GPUs under ``--backend=mps``, and keeps it running.

The decisions are :mod:`device_plugin.enforcement.mps_plan`'s; this is the shell around them, on the
plugin's event loop (asyncio subprocesses; the probe's blocking calls and file work in threads). Each
start sets the GPUs' compute mode to exclusive-process, creates the pipe and log directories, runs
``nvidia-cuda-mps-control -d`` (which forks the daemon and returns; the daemon writes its PID file in the
pipe directory), or adopts a daemon already running there, and sends the defaults through the control pipe.
The daemon is watched by its PID; when it dies, or cannot start, its GPUs are faulted through the health
monitor at once (they leave allocatable, and the node gets a ``GpuUnhealthy`` Event with the reason), it is
started again after a doubling backoff, and the periodic health checks heal the GPUs once it runs again.
At plugin exit it is told ``quit``, the way NVIDIA documents, and killed if it lingers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from device_plugin.enforcement.mps_plan import (
    QUIT,
    MpsPlan,
    backoff,
    compute_mode_verdict,
    problems,
)
from device_plugin.gpus.probe import ComputeMode, GpuProbe
from device_plugin.metrics import PluginMetrics

log = logging.getLogger(__name__)
COMMAND_TIMEOUT_S: Final = 30.0  # one control invocation (the -d start included)
PID_WAIT_S: Final = 5.0  # for the daemon's PID file after ``-d`` returned
STOP_WAIT_S: Final = 10.0  # after ``quit``, before the daemon is killed
_POLL_S: Final = 0.02
_OUTPUT_WAIT_S: Final = 0.5  # for a failed invocation's error text


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def read_pid(path: str) -> int | None:
    """The PID in the daemon's PID file; None when there is none or it is not a number."""
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdecimal() else None


class MpsDaemon:
    """Supervises one control daemon; :meth:`problem` is each GPU's health check for the monitor."""

    def __init__(
        self,
        plan: MpsPlan,
        probe: GpuProbe,
        metrics: PluginMetrics,
        *,
        fault: Callable[[Mapping[str, str]], None],
        poll_s: float,
        backoff_s: float,
    ) -> None:
        """``fault(problems)`` marks GPUs unhealthy now (the health monitor's); ``poll_s``: seconds between
        looks at the daemon's PID; ``backoff_s``: the first restart delay, doubled on each failure in a row."""
        self.plan = plan
        self._probe, self._metrics, self._fault = probe, metrics, fault
        self._poll_s, self._backoff_s = poll_s, backoff_s
        self._down: str | None = None  # why the daemon does not run; None while it does (or before a start)
        self._modes: dict[str, str | None] = {}  # per GPU, what its compute mode stops
        self.pid: int | None = None
        self.attempted = asyncio.Event()  # the first start is over, run or failed

    def problem(self, uuid: str) -> str | None:
        """What keeps GPU ``uuid`` from being used under MPS now; None: nothing (or not served)."""
        return problems(self.plan.gpus, self._down, self._modes).get(uuid)

    async def run(self) -> None:
        """Start, watch, restart, until cancelled (then :meth:`stop` ends the daemon)."""
        failures = 0
        while True:
            why = await self._start()
            if why is None:
                self.attempted.set()
                failures = 0
                await self._watch()
                why = f"the MPS control daemon (PID {self.pid}) exited"
                self.pid = None
            failures += 1
            delay = backoff(failures, self._backoff_s)
            self._metrics.errors.labels("mps_daemon").inc()
            log.error("%s; starting it again in %.1fs", why, delay)
            self._set_down(f"{why}; restarting it in {delay:.1f}s")
            self.attempted.set()
            await asyncio.sleep(delay)

    async def stop(self) -> None:
        """Tell the daemon ``quit`` and wait for it to go; kill it after :data:`STOP_WAIT_S`."""
        pid = self.pid or read_pid(self.plan.pid_file)
        if pid is None or not alive(pid):
            return
        said = await self._command((QUIT,))
        if said is not None:
            log.warning("telling the MPS control daemon to quit failed (%s)", said)
        deadline = time.monotonic() + STOP_WAIT_S
        while alive(pid) and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        if alive(pid):
            self._metrics.errors.labels("mps_stop").inc()
            log.warning("the MPS control daemon (PID %d) outlived quit by %.0fs; killing it", pid, STOP_WAIT_S)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
        log.info("the MPS control daemon stopped")

    # --- one start ------------------------------------------------------------------------------------------
    async def _start(self) -> str | None:
        """Prepare and start (or adopt) the daemon; None when it runs, else why not."""
        plan = self.plan
        try:
            await asyncio.to_thread(self._directories)
        except OSError as exc:
            return f"cannot create the MPS directories ({exc})"
        await self._compute_modes()
        running = read_pid(plan.pid_file)
        if running is not None and alive(running):
            log.info("adopting the MPS control daemon already running (PID %d)", running)
        else:
            said = await self._invoke(plan.start, b"")
            if said is not None:
                return f"the MPS control daemon did not start: {said}"
            running = await self._pid()
            if running is None:
                return f"the MPS control daemon wrote no live PID to {plan.pid_file} within {PID_WAIT_S:.0f}s"
        self.pid = running
        said = await self._command(plan.defaults)
        if said is not None:  # NVIDIA's own defaults apply: 100 % of the SMs, no memory limit
            self._metrics.errors.labels("mps_defaults").inc()
            log.warning("setting the MPS defaults failed (%s)", said)
        log.info("the MPS control daemon runs (PID %d) for %s", running, ", ".join(plan.gpus))
        self._down = None
        return None

    def _directories(self) -> None:
        for path in (self.plan.pipe_dir, self.plan.log_dir):
            Path(path).mkdir(mode=0o755, parents=True, exist_ok=True)

    async def _compute_modes(self) -> None:
        for uuid in self.plan.gpus:
            verdict = compute_mode_verdict(*await asyncio.to_thread(self._set_exclusive, uuid))
            if verdict.problem or verdict.warning:
                self._metrics.errors.labels("mps_compute_mode").inc()
                log.warning("GPU %s: %s", uuid, verdict.problem or verdict.warning)
            self._modes[uuid] = verdict.problem
        faulted = {u: p for u, p in self._modes.items() if p}
        if faulted:
            self._fault(faulted)

    def _set_exclusive(self, uuid: str) -> tuple[str | None, ComputeMode | None]:
        """(why setting exclusive-process failed, or None; the mode then, or None when unreadable)."""
        error = None
        try:
            self._probe.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_PROCESS)
        except Exception as exc:
            error = str(exc) or type(exc).__name__
        try:
            return error, self._probe.compute_mode(uuid)
        except Exception:
            return error, None

    async def _pid(self) -> int | None:
        deadline = time.monotonic() + PID_WAIT_S
        while time.monotonic() < deadline:
            pid = read_pid(self.plan.pid_file)
            if pid is not None and alive(pid):
                return pid
            await asyncio.sleep(_POLL_S)
        return None

    async def _watch(self) -> None:
        """Return when the daemon's process is gone."""
        while self.pid is not None and alive(self.pid):
            await asyncio.sleep(self._poll_s)

    def _set_down(self, why: str) -> None:
        self._down = why
        self._fault({u: p for u, p in problems(self.plan.gpus, why, self._modes).items() if p})

    # --- the control program --------------------------------------------------------------------------------
    async def _command(self, commands: Sequence[str]) -> str | None:
        """Send ``commands`` to the running daemon, one a line; None when it took them, else why not."""
        return await self._invoke(self.plan.command, "".join(f"{c}\n" for c in commands).encode())

    async def _invoke(self, argv: Sequence[str], stdin: bytes) -> str | None:
        """Run the control program with the daemon's environment; None on success, else what went wrong."""
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **self.plan.env},
                start_new_session=True,  # the daemon it forks must not die with the plugin's terminal signals
            )
        except OSError as exc:
            return f"cannot run {argv[0]} ({exc})"
        assert process.stdin is not None and process.stderr is not None
        try:
            process.stdin.write(stdin)
            process.stdin.close()
            # The exit, not the end of its output: the daemon ``-d`` forks may hold the pipes open.
            await asyncio.wait_for(process.wait(), COMMAND_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            if process.returncode is None:
                process.kill()
                await process.wait()
            return f"{' '.join(argv)} did not answer within {COMMAND_TIMEOUT_S:.0f}s ({type(exc).__name__})"
        if process.returncode == 0:
            return None
        try:
            err = await asyncio.wait_for(process.stderr.read(4096), _OUTPUT_WAIT_S)
        except TimeoutError:
            err = b""
        lines = err.decode(errors="replace").strip().splitlines()
        return f"{' '.join(argv)} exited {process.returncode}: {lines[-1] if lines else 'no output'}"
