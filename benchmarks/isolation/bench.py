"""The isolation benchmark's runs on one GPU, scenario by scenario: one ``tenant_load`` process per tenant, its
environment from :func:`~benchmarks.isolation.tenants.tenant_env`, its rows read as it runs, and each mode's
figures filed for the report. The whole run around them (prerequisites, plan, machine, report) is
:mod:`benchmarks.isolation.run`."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu_check.constants import MIB, VRAM_LIMIT
from benchmarks.gpu_check.procs import DEADLINE, Reader, step
from benchmarks.gpu_check.report import say
from benchmarks.isolation.driver_count import counted, sm_share
from benchmarks.isolation.figures import around, mean_rate, seconds_rows, share, shares_after, split, together
from benchmarks.isolation.mps import MpsError, control
from benchmarks.isolation.plan import (
    BASELINE,
    BURST_IDLE_S,
    BURST_RUN_S,
    FILL_CHUNK_MIB,
    FILL_HOLD_S,
    GUARD_S,
    LIVE,
    LIVE_HALF_S,
    POD_PROCS,
    SINGLE_S,
    SM_READ_AFTER_S,
    SM_READ_SLACK_S,
    TAMPER_CAP,
    Step,
)
from benchmarks.isolation.tenants import Gpu, plugin_ceiling, tampered, tenant_env
from device_plugin.enforcement import hami_region
from device_plugin.enforcement.envs import EnforcementPaths
from device_plugin.enforcement.mps_plan import SERVER_LIST, ceiling_commands, server_pids
from device_plugin.hami_build.graph_edits import graph_charging
from vgpu.names import LIVE_LIMITS_DIR, Env, IsolationMode

HERE = Path(__file__).resolve().parent
WORK = Path("/tmp/isolation-bench")  # the tenant load, the preload list, MPS's folders, each tenant's limits
HAMI_LOG = Path("/tmp/vgpulog")  # where HAMi-core writes its info-level lines
HAMI_LOG_LEVEL = "LIBCUDA_LOG_LEVEL"
HAMI_POLICY_DISABLE = "disable"  # Env.HAMI_UTILIZATION_POLICY's value that turns HAMi-core's limiter off
# Where HAMi-core 8f3a89c keeps its region's limiter switch (shared_region_t.utilization_switch, an int; 1: on),
# which its limiter obeys unless the environment forces it on (tests/device_plugin/hami_layout.py has the layout).
SWITCH_OFFSET = 2008900
WATCHER_LOG_KEPT = 8 << 20
EMULATED_NOTE = (
    "EMULATED GPU: HAMi-core's own code limits the tenants, but the GPU is a model (benchmarks/isolation/emulated): "
    "these figures are the model's, not a GPU's"
)
WITHIN_MIB = 1024  # an allocation inside the VRAM limit: refused only if something else is wrong
OVER_MIB = VRAM_LIMIT // MIB + 1024  # past it


@dataclass
class Bench:
    """The runs of one GPU: each tenant started with its own live-limits folder, its output logged, the
    uncapped rates every share is measured against, and each mode's figures in ``result``."""

    binary: Path
    gpu: Gpu
    paths: EnforcementPaths
    result: dict[str, Any]
    machine_env: dict[str, str] = field(default_factory=dict)  # what every tenant needs besides its grant
    log: list[str] = field(default_factory=list)
    uncapped: dict[str, float | None] = field(default_factory=dict)
    started: int = 0
    mps: tuple[Path, list[str]] | None = None  # the running MPS daemon's pipe folder and its log
    pause: Callable[[float], None] = time.sleep  # the wait before a live change (the tests' is instant)

    def env(self, mode: IsolationMode, percent: int | None, name: str) -> dict[str, str]:
        self.started += 1
        live = WORK / "tenants" / f"{self.started:03d}-{mode}-{name}"
        shutil.rmtree(live, ignore_errors=True)
        live.mkdir(parents=True)
        envs = tenant_env(
            mode, self.gpu, percent=percent, vram_limit=VRAM_LIMIT, paths=self.paths, live_dir=live, name=name
        )
        # HAMi-core's utilisation watcher logs what it sees and does at info level (a log switch only), into
        # HAMI_LOG: why its compute cap holds or not is read there (kept as hami-watcher.log).
        return self.machine_env | (envs | {HAMI_LOG_LEVEL: "3"} if mode is IsolationMode.SOFT else envs)

    def start(self, envs: dict[str, str], *args: str, wrap: Sequence[str] = ()) -> Reader:
        cmd = [*wrap, str(self.binary), *args]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **envs}
        )
        self.log.append(f"started PID {proc.pid}: {' '.join(cmd)}")
        return Reader(proc)

    def finish(self, label: str, reader: Reader, timeout: float) -> list[dict[str, Any]]:
        err = reader.finish(timeout)
        for stream in (reader.proc.stdout, reader.proc.stderr):
            if stream is not None:
                stream.close()
        self.log.append(
            f"### {label}: PID {reader.proc.pid}, rc {reader.proc.returncode}\n"
            f"--- stdout\n{''.join(reader.raw)}--- stderr (tail)\n{err[-3000:]}\n"
        )
        return reader.rows

    def run(
        self, label: str, envs: dict[str, str], *args: str, seconds: float, wrap: Sequence[str] = ()
    ) -> list[dict[str, Any]]:
        """A tenant run to its end (``seconds`` measured; killed half a minute after), its command after ``wrap``."""
        return self.finish(label, self.start(envs, *args, wrap=wrap), seconds + 30)

    def single(self, mode: IsolationMode, st: Step) -> dict[str, Any]:
        percent = st.targets[0] if st.targets else None
        reader = self.start(self.env(mode, percent, st.kernel), st.kernel, f"{st.seconds}")
        driver = self.driver_sm(reader, st.seconds) if st.kernel == "compute" else None
        rows = self.finish(f"{st.mode} {st.label}", reader, st.seconds + 30)
        rate = mean_rate(rows)
        if st.mode == BASELINE:
            self.uncapped[st.kernel] = rate
        return {
            "kernel": st.kernel,
            "target": percent,
            "rate": rate,
            "unit": step(rows, "ready").get("unit"),
            "share": share(rate, self.uncapped.get(st.kernel)),
            "per_second": [r["rate"] for r in seconds_rows(rows)],
            "error": step(rows, "error").get("error"),
            "graph_charging": graph_charging("".join(reader.err)) if mode is IsolationMode.SOFT else None,
            "driver": driver,
        }

    def driver_sm(self, reader: Reader, seconds: float) -> dict[str, Any]:
        """The running tenant's SM share by the driver, as the device plugin's compute report reads it, over its
        run after the warm-up second (read while it runs; it costs the run nothing)."""
        ready = reader.wait_for("step", "ready", 60)
        if ready is None:
            return {"driver_sm": None, "matched": "it never said it was ready"}
        self.pause(SM_READ_AFTER_S)
        over = max(0.5, seconds - SM_READ_AFTER_S - SM_READ_SLACK_S)
        return sm_share(self.gpu.uuid, int(ready["pid"]), self.machine_env, over) | {"seconds": over}

    def pair(self, mode: IsolationMode, st: Step) -> dict[str, Any]:
        readers = [self.start(self.env(mode, t, f"pair-{t}"), "compute", f"{st.seconds}") for t in st.targets]
        labels = [f"{st.mode} {st.label} ({t} %)" for t in st.targets]
        rows = [self.finish(label, r, st.seconds + 30) for label, r in zip(labels, readers, strict=True)]
        window = together(*rows)
        rates = [mean_rate(r, *window) if window else None for r in rows]
        made = split(st.targets, rates, self.uncapped.get("compute"))
        return {
            "targets": list(st.targets),
            "seconds_together": round(window[1] - window[0], 1) if window else 0.0,
            "rates": rates,
            "shares": list(made.shares) if made else None,
            "points": list(made.points) if made else None,
            "total": made.total if made else None,
        }

    def latency(self, mode: IsolationMode, st: Step) -> dict[str, Any]:
        neighbour = None
        if len(st.targets) > 1:  # the neighbour saturates the GPU before the stream starts, and after it ends
            neighbour = self.start(self.env(mode, st.targets[1], "neighbour"), "compute", f"{st.seconds + 3}")
            neighbour.wait_for("step", "ready", 30)
        envs = self.env(mode, st.targets[0], "stream")
        rows = self.run(f"{st.mode} {st.label}", envs, "latency", f"{st.seconds}", seconds=st.seconds)
        if neighbour is not None:
            self.finish(f"{st.mode} neighbour of the latency stream", neighbour, st.seconds + 30)
        done = step(rows, "done")
        return {k: done.get(k) for k in ("launches", "p50_us", "p99_us", "p999_us", "max_us")} | {
            "target": st.targets[0],
            "neighbour": st.targets[1] if neighbour else None,
        }

    def allocation(self, label: str, envs: dict[str, str], wrap: Sequence[str] = ()) -> dict[str, Any]:
        rows = self.run(label, envs, "alloc", f"{WITHIN_MIB}", f"{OVER_MIB}", seconds=0, wrap=wrap)
        within, over = step(rows, "within"), step(rows, "over")
        return {
            "limit_mib": VRAM_LIMIT // MIB,
            "device_mib_seen": step(rows, "mem_get_info").get("total_mib"),
            "within_mib": WITHIN_MIB,
            "within_ok": within.get("ok"),
            "over_mib": OVER_MIB,
            "over_ok": over.get("ok"),
            "over_error": over.get("error") or None,
        }

    def at_limit(self, label: str, envs: dict[str, str]) -> dict[str, Any]:
        """A tenant filling GPU memory until its limiter refuses (or twice its limit is held), and the driver's
        count of it meanwhile: how far past its VRAM limit the device plugin's VRAM guard sees it."""
        most = 2 * VRAM_LIMIT // MIB
        reader = self.start(envs, "fill", f"{FILL_CHUNK_MIB}", f"{most}", f"{FILL_HOLD_S:g}")
        filled = reader.wait_for("step", "filled", 60)
        seen: dict[str, Any] = (
            counted(self.gpu.uuid, int(filled["pid"]), self.machine_env)
            if filled is not None
            else {"driver_mib": None, "matched": "it never said it had filled"}
        )
        reader.proc.terminate()  # counted: it need not hold on
        self.finish(label, reader, 30)
        driver = seen["driver_mib"]
        return {
            "filled_mib": None if filled is None else filled["mib"],
            "stopped": None if filled is None else filled["stopped"],
            **seen,
            "past_limit_mib": None if driver is None else driver - VRAM_LIMIT // MIB,
        }

    def ceiling(self) -> list[str] | None:
        """Under MPS, the ceiling the device plugin holds with the tamperer alone on the GPU, put in force on
        the benchmark's daemon (its running server too): the commands sent, or None where none runs."""
        if self.mps is None:
            return None
        pipe, log = self.mps
        servers = server_pids(control(pipe, [SERVER_LIST], log) or "")
        commands = list(ceiling_commands(plugin_ceiling(self.gpu, TAMPER_CAP, VRAM_LIMIT), servers))
        if control(pipe, commands, log) is None:
            raise MpsError(f"the MPS daemon refused the ceiling: {log[-1].strip()}")
        return commands

    def after_ready(self, reader: Reader, after_s: float, write: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``after_s`` after the tenant is ready, ``write`` done: what it said, and when (``at``; None, with the
        state "tenant never ready", where the tenant never was)."""
        if reader.wait_for("step", "ready", 60) is None:
            return {"state": "tenant never ready", "at": None}
        self.pause(after_s)
        return write() | {"at": time.time()}

    def rewrite_region(self, envs: dict[str, str], reader: Reader, after_s: float, sm_limit: int) -> dict[str, Any]:
        """``after_s`` after the tenant is ready, its HAMi-core region written with ``sm_limit`` (and the VRAM
        limit) by the plugin's own writer (device_plugin.enforcement.hami_region), as a live limit change or
        the plugin's guard putting a tampered region back does: what it found and wrote, and when."""

        def sync() -> dict[str, Any]:
            synced = hami_region.sync(Path(envs[Env.HAMI_SHARED_REGION]), [(VRAM_LIMIT, sm_limit)])
            return {"state": synced.region.state, "writes": [str(w) for w in synced.writes]}

        return self.after_ready(reader, after_s, sync)

    def tampering(self, mode: IsolationMode, st: Step, figures: dict[str, Any]) -> dict[str, Any]:
        """A tenant that starts its process with its limits raised. Under hard, beside the plugin's MPS ceiling;
        under soft, beside the plugin's guard, which puts the region the process made back after GUARD_S: what
        it gained before and after that."""
        held = self.ceiling() if mode is IsolationMode.HARD else None
        envs, changed = tampered(self.env(mode, TAMPER_CAP, "tamperer"), self.gpu)
        reader = self.start(envs, "compute", f"{st.seconds}")
        guard = self.rewrite_region(envs, reader, GUARD_S, TAMPER_CAP) if mode in LIVE else None
        rows = self.finish(f"{st.mode} {st.label}", reader, st.seconds + 30)
        honest = next(
            (s["share"] for s in figures.get("single", []) if s["kernel"] == "compute" and s["target"] == TAMPER_CAP),
            None,
        )
        uncapped = self.uncapped.get("compute")
        seen = around(rows, guard["at"], uncapped) if guard and guard["at"] is not None else None
        got = seen.before if seen else share(mean_rate(rows), uncapped)
        # What it keeps: past the honest run's share, or past its limit once the guard has put the region back
        # (the honest run is short: a limiter may still be settling in it).
        kept, against = (seen.after, TAMPER_CAP) if seen else (got, honest)
        return {
            "target": TAMPER_CAP,
            "changed": changed,
            "honest_share": honest,
            "tampered_share": got,
            "guard": guard and {"state": guard["state"], "writes": guard.get("writes", []), "after_s": GUARD_S},
            "guarded_share": seen.after if seen else None,
            "gain_points": kept - against if kept is not None and against is not None else None,
            "ceiling": held,
            "memory": self.allocation(f"{st.mode} tampered allocation", envs),
            "own_region": self.own_region(st, envs) if guard else None,
        }

    def own_region(self, st: Step, envs: dict[str, str]) -> dict[str, Any]:
        """The raised limits in a region of the process's own, which no guard watches, and HAMi-core's limiter
        switched off in the process's environment (what the plugin's own value cannot stop there): its share,
        its memory."""
        region = Path(envs[Env.HAMI_SHARED_REGION])
        own = envs | {
            Env.HAMI_SHARED_REGION: str(region.with_name(f"own-{region.name}")),
            Env.HAMI_UTILIZATION_POLICY: HAMI_POLICY_DISABLE,
        }
        # As its container would run it: the pod's live-limits directory mounted where the plugin mounts it.
        wrap = in_container(region.parent)
        label = f"{st.mode} tampering in a region of its own"
        rows = self.run(label, own, "compute", f"{SINGLE_S}", seconds=SINGLE_S, wrap=wrap)
        got = share(mean_rate(rows), self.uncapped.get("compute"))
        return {
            "share": got,
            "gain_points": got - TAMPER_CAP if got is not None else None,
            "memory": self.allocation(f"{st.mode} allocation in a region of its own", own, wrap),
            "mount_namespace": bool(wrap),
        }

    def burst(self, mode: IsolationMode, st: Step) -> dict[str, Any]:
        """One tenant at its cap, idle, then again: what the limiter lets through in the seconds after the pause."""
        cap = st.targets[0]
        args = ("compute", f"{st.seconds}", f"{BURST_RUN_S}", f"{BURST_IDLE_S}")
        rows = self.run(f"{st.mode} {st.label}", self.env(mode, cap, "burst"), *args, seconds=st.seconds + BURST_IDLE_S)
        uncapped = self.uncapped.get("compute")
        paused, resumed = step(rows, "idle").get("wall"), step(rows, "resume").get("wall")
        after = shares_after(rows, resumed, uncapped) if resumed is not None else []
        return {
            "target": cap,
            "idle_s": BURST_IDLE_S,
            "before_share": around(rows, paused, uncapped).before if paused is not None else None,
            "after_shares": after,
            "worst_points": max(after) - cap if after else None,
            "error": step(rows, "error").get("error") or (None if resumed is not None else "no resume row"),
        }

    def live(self, mode: IsolationMode, st: Step) -> dict[str, Any]:
        """One tenant at its first cap; halfway, the second written to its HAMi-core region by the plugin's own
        writer (device_plugin.enforcement.hami_region), as a live limit change or a tampered region put back is."""
        first, second = st.targets
        envs = self.env(mode, first, "live")
        reader = self.start(envs, "compute", f"{st.seconds}")
        written = self.rewrite_region(envs, reader, LIVE_HALF_S, second)
        rows = self.finish(f"{st.mode} {st.label}", reader, st.seconds + 30)
        uncapped = self.uncapped.get("compute")
        seen = around(rows, written["at"], uncapped) if written["at"] is not None else None
        return {
            "targets": [first, second],
            "region": {k: v for k, v in written.items() if k != "at"},
            "before_share": seen.before if seen else None,
            "after_share": seen.after if seen else None,
            "per_second": [share(r["rate"], uncapped) for r in seconds_rows(rows)],
            "error": step(rows, "error").get("error"),
        }

    def pod(self, mode: IsolationMode, st: Step) -> dict[str, Any]:
        """One pod's processes, all busy under its one grant (one environment, one HAMi-core region): their
        total against its limit."""
        cap = st.targets[0]
        envs = self.env(mode, cap, "pod")
        readers = [self.start(envs, "compute", f"{st.seconds}") for _ in range(POD_PROCS)]
        rows = [
            self.finish(f"{st.mode} {st.label} (process {i + 1})", r, st.seconds + 30) for i, r in enumerate(readers)
        ]
        window = together(*rows)
        uncapped = self.uncapped.get("compute")
        shares = [share(mean_rate(r, *window), uncapped) for r in rows] if window else []
        known = [s for s in shares if s is not None]
        total = sum(known) if known and len(known) == len(shares) else None
        return {
            "target": cap,
            "processes": POD_PROCS,
            "seconds_together": round(window[1] - window[0], 1) if window else 0.0,
            "shares": shares,
            "total": total,
            "points": total - cap if total is not None else None,
        }

    def switch(self, mode: IsolationMode, st: Step) -> dict[str, Any]:
        """One tenant at its cap; halfway, a 0 written into its HAMi-core region's limiter switch, as any process of
        the container may (the region is mode 0666): whether the cap holds after it."""
        cap = st.targets[0]
        envs = self.env(mode, cap, "switch")
        reader = self.start(envs, "compute", f"{st.seconds}")

        def switch_off() -> dict[str, Any]:
            fd = os.open(envs[Env.HAMI_SHARED_REGION], os.O_WRONLY)
            try:
                os.pwrite(fd, (0).to_bytes(4, "little"), SWITCH_OFFSET)
            finally:
                os.close(fd)
            return {"state": "switch written"}

        written = self.after_ready(reader, LIVE_HALF_S, switch_off)
        rows = self.finish(f"{st.mode} {st.label}", reader, st.seconds + 30)
        seen = around(rows, written["at"], self.uncapped.get("compute")) if written["at"] is not None else None
        return {
            "target": cap,
            "policy": envs.get(Env.HAMI_UTILIZATION_POLICY),
            "before_share": seen.before if seen else None,
            "after_share": seen.after if seen else None,
            "error": step(rows, "error").get("error") or (None if written["at"] is not None else written["state"]),
        }

    def one(self, mode: IsolationMode, st: Step, figures: dict[str, Any]) -> None:
        """Run ``st`` and file its figures under ``figures``."""
        if st.scenario == "single":
            figures.setdefault("single", []).append(self.single(mode, st))
        elif st.scenario == "pair":
            figures.setdefault("pairs", []).append(self.pair(mode, st))
        elif st.scenario == "latency":
            figures.setdefault("latency", {})["beside" if len(st.targets) > 1 else "alone"] = self.latency(mode, st)
        elif st.scenario == "memory":
            figures["memory"] = self.allocation(f"{st.mode} allocation", self.env(mode, TAMPER_CAP, "alloc"))
            figures["memory"]["at_limit"] = self.at_limit(f"{st.mode} at its limit", self.env(mode, TAMPER_CAP, "fill"))
        elif st.scenario == "burst":
            figures["burst"] = self.burst(mode, st)
        elif st.scenario == "live":
            figures["live"] = self.live(mode, st)
        elif st.scenario == "pod":
            figures["pod"] = self.pod(mode, st)
        elif st.scenario == "switch":
            figures["switch"] = self.switch(mode, st)
        else:
            figures["tampering"] = self.tampering(mode, st, figures)

    def steps(self, mode: IsolationMode, steps: list[Step], figures: dict[str, Any]) -> None:
        """Each run in turn while the budget allows it; a failing run is recorded and the next one runs."""
        for st in steps:
            if DEADLINE[0] - time.time() < st.cost:
                figures.setdefault("out_of_budget", []).append(st.label)
                continue
            say(f"{st.mode}: {st.label}")
            try:
                self.one(mode, st, figures)
            except Exception as exc:  # recorded; the other runs still say something
                figures.setdefault("errors", {})[st.label] = f"{type(exc).__name__}: {exc}"
                self.log.append(f"### {st.mode} {st.label}: FAILED\n{traceback.format_exc()}")


def in_container(live_dir: Path) -> list[str]:
    """The prefix that runs a tenant as its container would see the plugin's live-limits directory: in a mount
    namespace of its own, ``live_dir`` mounted at LIVE_LIMITS_DIR over a private /run (nothing is made on the
    host, whose other tenants must not find one); none where the benchmark cannot make one (no unshare, not
    root)."""
    assert LIVE_LIMITS_DIR.startswith("/run/")
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return []
    script = (
        f'mount -t tmpfs none /run && mkdir -p {LIVE_LIMITS_DIR} && mount --bind "$0" {LIVE_LIMITS_DIR} && exec "$@"'
    )
    return ["unshare", "-m", "sh", "-c", script, str(live_dir)]
