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

The daemon's ceiling (what a client may set for itself) follows the node's hard grants: raised by Allocate
before the answer goes back (:meth:`MpsDaemon.admit`), lowered at the next look once a pod has gone, so that
a tenant who edits its own variables gains at most the widest cap granted beside it (docs/isolation-mps.md).
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
    SERVER_LIST,
    Ceiling,
    MpsPlan,
    backoff,
    ceiling,
    ceiling_commands,
    compute_mode_verdict,
    problems,
    server_pids,
)
from device_plugin.gpus.probe import ComputeMode, GpuProbe
from device_plugin.metrics import PluginMetrics
from vgpu.contract.allocation import PodAllocation

log = logging.getLogger(__name__)
COMMAND_TIMEOUT_S: Final = 30.0  # one control invocation (the -d start included)
PID_WAIT_S: Final = 5.0  # for the daemon's PID file after ``-d`` returned
STOP_WAIT_S: Final = 10.0  # after ``quit``, before the daemon is killed
_POLL_S: Final = 0.02
_OUTPUT_WAIT_S: Final = 0.5  # for a failed invocation's error text, or a query's answer
ADMITTED_KEPT_S: Final = 300.0  # how long a grant Allocate answered counts before the pod watch shows it


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
        grants: Callable[[], Mapping[str, PodAllocation] | None],
        poll_s: float,
        backoff_s: float,
    ) -> None:
        """``fault(problems)`` marks GPUs unhealthy now (the health monitor's); ``grants()``: the node's
        grants by pod UID, None until the plugin has listed its pods; ``poll_s``: seconds between looks at
        the daemon's PID and the grants; ``backoff_s``: the first restart delay, doubled on each failure in
        a row."""
        self.plan = plan
        self._probe, self._metrics, self._fault, self._grants = probe, metrics, fault, grants
        self._poll_s, self._backoff_s = poll_s, backoff_s
        self._down: str | None = None  # why the daemon does not run; None while it does (or before a start)
        self._modes: dict[str, str | None] = {}  # per GPU, what its compute mode stops
        self._admitted: dict[str, tuple[PodAllocation, float]] = {}  # answered grants, by pod UID, and when
        self._ceiling_lock = asyncio.Lock()
        self.held: Ceiling | None = None  # the ceiling in force on the running daemon (None: NVIDIA's defaults)
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

    async def admit(self, uid: str, alloc: PodAllocation) -> None:
        """Allocate's answer for pod ``uid`` is about to go back: raise the ceiling to its grant first, so
        that its container's clients are not held below it."""
        self._admitted[uid] = (alloc, time.monotonic())
        await self.hold()

    async def hold(self) -> None:
        """Put the ceiling of the grants known now in force, where it differs from the one held."""
        async with self._ceiling_lock:
            now = time.monotonic()
            self._admitted = {u: e for u, e in self._admitted.items() if now - e[1] < ADMITTED_KEPT_S}
            known = self._grants()
            if known is None and not self._admitted:
                return
            grants = {u: alloc for u, (alloc, _) in self._admitted.items()} | dict(known or {})
            if known is not None:  # a pod the watch shows is its to decide from now on, its end included
                self._admitted = {u: e for u, e in self._admitted.items() if u not in known}
            wanted = ceiling(self.plan, grants.values())  # grants off its GPUs (a MIG unit's) do not count
            if wanted is None or wanted == self.held or self.pid is None:
                return
            said, listing = await self._invoke(self.plan.command, f"{SERVER_LIST}\n".encode(), answer=True)
            if said is None:
                said, _ = await self._invoke(
                    self.plan.command,
                    "".join(f"{c}\n" for c in ceiling_commands(wanted, server_pids(listing))).encode(),
                )
            if said is not None:
                self._metrics.errors.labels("mps_ceiling").inc()
                log.warning("setting the MPS ceiling to %s failed (%s)", wanted, said)
                return
            log.info("MPS ceiling: %d%% of the SMs, device memory %s MiB", wanted.percent, list(wanted.mib))
            self.held = wanted

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
            said, _ = await self._invoke(plan.start, b"")
            if said is not None:
                return f"the MPS control daemon did not start: {said}"
            running = await self._pid()
            if running is None:
                return f"the MPS control daemon wrote no live PID to {plan.pid_file} within {PID_WAIT_S:.0f}s"
        self.pid, self.held = running, None
        said = await self._command(plan.defaults)
        if said is not None:  # NVIDIA's own defaults apply: 100 % of the SMs, no memory limit
            self._metrics.errors.labels("mps_defaults").inc()
            log.warning("setting the MPS defaults failed (%s)", said)
        log.info("the MPS control daemon runs (PID %d) for %s", running, ", ".join(plan.gpus))
        self._down = None
        await self.hold()
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
        """Return when the daemon's process is gone; meanwhile the ceiling follows the grants."""
        while self.pid is not None and alive(self.pid):
            await asyncio.sleep(self._poll_s)
            await self.hold()

    def _set_down(self, why: str) -> None:
        self._down = why
        self._fault({u: p for u, p in problems(self.plan.gpus, why, self._modes).items() if p})

    # --- the control program --------------------------------------------------------------------------------
    async def _command(self, commands: Sequence[str]) -> str | None:
        """Send ``commands`` to the running daemon, one a line; None when it took them, else why not."""
        said, _ = await self._invoke(self.plan.command, "".join(f"{c}\n" for c in commands).encode())
        return said

    async def _invoke(self, argv: Sequence[str], stdin: bytes, *, answer: bool = False) -> tuple[str | None, str]:
        """Run the control program with the daemon's environment: (None on success, else what went wrong;
        what it printed, where ``answer`` asks for it — never for ``-d``, whose daemon keeps the pipe)."""
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE if answer else asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **self.plan.env},
                start_new_session=True,  # the daemon it forks must not die with the plugin's terminal signals
            )
        except OSError as exc:
            return f"cannot run {argv[0]} ({exc})", ""
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
            return f"{' '.join(argv)} did not answer within {COMMAND_TIMEOUT_S:.0f}s ({type(exc).__name__})", ""
        if process.returncode == 0:
            if not answer or process.stdout is None:
                return None, ""
            try:
                printed = await asyncio.wait_for(process.stdout.read(), _OUTPUT_WAIT_S)
            except TimeoutError:
                printed = b""
            return None, printed.decode(errors="replace")
        try:
            err = await asyncio.wait_for(process.stderr.read(4096), _OUTPUT_WAIT_S)
        except TimeoutError:
            err = b""
        lines = err.decode(errors="replace").strip().splitlines()
        return f"{' '.join(argv)} exited {process.returncode}: {lines[-1] if lines else 'no output'}", ""
