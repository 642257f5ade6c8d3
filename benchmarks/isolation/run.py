"""The isolation benchmark's whole run: prerequisites said, the plan made again for the modes that can run,
the machine made ready (:mod:`benchmarks.isolation.machines`), each planned run
(:class:`~benchmarks.isolation.bench.Bench`), hard mode's inside :func:`~benchmarks.isolation.mps.mps_daemon`, and
the report written whatever happened."""

from __future__ import annotations

import dataclasses
import itertools
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.gpu_check.procs import set_budget
from benchmarks.gpu_check.report import say
from benchmarks.isolation import bench
from benchmarks.isolation.machines import Machine, emulated_gpu, paths_for, real_gpu
from benchmarks.isolation.mps import MpsError, mps_daemon
from benchmarks.isolation.plan import BASELINE, ISSUE_SCENARIOS, SINGLE_S, Plan, measured, ordered, plan, render_plan
from benchmarks.isolation.prereqs import blocked, check
from benchmarks.isolation.report import write_report
from device_plugin.hami_build.changes import describe, with_changes
from vgpu.names import IsolationMode


def measure(
    made: Plan,
    hami_src: Path,
    out: Path,
    result: dict[str, Any],
    changes: tuple[str, ...] = (),
    machine: Callable[[Plan, Path, Path], Machine] = real_gpu,
) -> None:
    """The plan's runs on ``machine``, mode by mode (the builds first); each mode's figures in ``result['modes']``."""
    src = with_changes(hami_src, bench.WORK / "hami-core-changed", changes) if changes else hami_src
    on = machine(made, src, out)
    gpu, lib = on.gpu, on.lib
    result["gpu"] = dataclasses.asdict(gpu)
    Path("/tmp/vgpulock").mkdir(exist_ok=True)  # HAMi-core's lock directory outside its images
    bench.HAMI_LOG.unlink(missing_ok=True)  # this run's lines only
    runs = bench.Bench(on.binary, gpu, paths_for(lib), result, on.env)
    planned = [s for s in made.steps if s.scenario != "setup"]
    try:
        for name, group in itertools.groupby(planned, key=lambda s: s.mode):
            steps = list(group)
            if name == BASELINE:
                runs.steps(IsolationMode.SHARED, steps, result.setdefault("baseline", {}))
                continue
            mode = IsolationMode(name)
            figures: dict[str, Any] = result["modes"].setdefault(mode, {"status": "measured"})
            if mode is IsolationMode.SOFT and lib is None:
                result["modes"][mode] = {"status": "not measured", "reasons": ["HAMi-core did not build (its log)"]}
            elif mode is IsolationMode.HARD:
                mps_log: list[str] = []
                try:
                    with mps_daemon(gpu.index, bench.WORK / "mps", mps_log) as pipe:
                        runs.mps = (pipe, mps_log)
                        runs.steps(mode, steps, figures)
                    runs.mps = None
                except MpsError as exc:
                    result["modes"][mode] = {"status": "not measured", "reasons": [str(exc)]}
                result["modes"][mode]["mps"] = mps_log
            else:
                runs.steps(mode, steps, figures)
    finally:
        (out / "runs.log").write_text("\n".join(runs.log))
        if bench.HAMI_LOG.exists():  # its newest lines: a long run logs every 120 ms per process
            (out / "hami-watcher.log").write_bytes(bench.HAMI_LOG.read_bytes()[-bench.WATCHER_LOG_KEPT :])


def run_all(
    out: Path,
    hami_src: Path,
    budget: float,
    asked: tuple[IsolationMode, ...],
    changes: tuple[str, ...] = (),
    scenarios: tuple[str, ...] = ISSUE_SCENARIOS,
    single_s: float = SINGLE_S,
    emulated: bool = False,
) -> int:
    """The whole benchmark (on the emulated GPU with ``emulated``); 0 when every mode that could run was
    measured, else 1."""
    started = time.time()
    set_budget(budget)
    out.mkdir(parents=True, exist_ok=True)
    bench.WORK.mkdir(parents=True, exist_ok=True)
    needs = check(asked, hami_src, changes, emulated=emulated)
    say("prerequisites:")
    for need in needs:
        say(f"  {need.line()}")
    runnable = tuple(m for m in measured(asked) if not blocked(needs, m))
    result: dict[str, Any] = {
        "budget_s": budget,
        "asked": list(ordered(asked)),
        "hami_build": describe(changes),
        "scenarios": list(scenarios),
        "prerequisites": [need.line() for need in needs],
        "modes": {m: {"status": "not measured", "reasons": blocked(needs, m)} for m in ordered(asked)},
        "notes": [],
    }
    try:
        if runnable:
            made = plan(budget - (time.time() - started), runnable, scenarios, single_s)
            say(render_plan(made))
            result["notes"] = [*([bench.EMULATED_NOTE] if emulated else []), *made.notes]
            result["pair_s"] = made.pair_s
            for mode in runnable:
                result["modes"][mode] = {"status": "measured"}
            measure(made, hami_src, out, result, changes, emulated_gpu if emulated else real_gpu)
        else:
            say("no mode can run here: see the prerequisites above")
    except Exception:  # recorded; the report is still written
        result["error"] = traceback.format_exc()
        say(f"FAILED: {result['error'].strip().splitlines()[-1]}")
    finally:
        result["wall_s"] = round(time.time() - started, 1)
        say(write_report(out, result))
    return 0 if runnable and "error" not in result else 1
