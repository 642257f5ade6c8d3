"""The budget planner: which runs the isolation benchmark makes for the modes asked, and how long each lasts
so that all of them, builds and process starts included, fit in ``--budget`` seconds.

Every run but the two-tenant splits has a fixed length (a few seconds is enough to read a rate; a capped
single-tenant run can be made longer, ``--single-s``, to see a limiter settle); the splits take what is
left, up to the issue's 60 s each. Where that is less, they are scaled down and the plan says so; below
:data:`PAIR_MIN_S` the budget is refused. ``--scenarios`` keeps some of the issue's five (what a GPU session
still lacks: the splits at full length, say), with the uncapped runs they are measured against.
Pure: ``--dry-run`` prints it without touching a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vgpu.names import IsolationMode

KERNELS = ("compute", "memory", "graph")  # the single-tenant loads (tenant_load.cu)
CAPS = (10, 25, 50)  # single-tenant compute limits, percent of the GPU
SPLITS = ((30, 70), (10, 90))  # two saturating tenants' limits
LATENCY_SPLIT = (50, 50)  # the latency stream's limit and its saturating neighbour's
TAMPER_CAP = 25  # the limit a tampering tenant was granted (its honest rate: the single-tenant run at it)
# soft's tampering runs beside the plugin's guard of the live-limits directory: it puts the region back this long
# after the tenant is ready, its longest for a region the tenant's own process made (its pass interval,
# --live-limits-interval; docs/security.md, "Tampering with live limits"), and the run goes on TAMPER_S in all
GUARD_S = 5.0
TAMPER_S = 11.0
BURST_CAP = 25  # the limit of a tenant that runs, idles, and runs again
BURST_RUN_S = 6.0  # its running before the pause (settled at its cap), and again after it
BURST_IDLE_S = 20.0  # the pause: long enough for a limiter's refill and bucket to grow back
LIVE_CAPS = (50, 10)  # a running tenant's limit, then the one written to its HAMi-core region
LIVE_HALF_S = 8.0  # seconds at each: the change comes halfway
SWITCH_CAP = 25  # the limit of a tenant that writes a 0 into its region's limiter switch, halfway
POD_CAP = 25  # the limit of one pod whose processes all run busy
POD_PROCS = 2  # its processes, one grant: one environment, one HAMi-core region
POD_S = 10.0  # long enough for a limiter to settle on them
PAIR_GOAL_S = 60.0  # what the issue asks of each split
PAIR_MIN_S = 10.0  # shorter splits say nothing: refused
SINGLE_S = 4.0  # one single-tenant run by default (its first second is left out as warm-up)
LATENCY_S = 6.0
START_S = 2.0  # a process's CUDA start and warm-up, beside its measured seconds
ALLOC_S = 3.0  # one allocation probe, its start included
FILL_CHUNK_MIB = 64  # a tenant held at its limit allocates this much at a time: a limiter stops it this close
FILL_HOLD_S = 20.0  # the longest it holds what it got: the benchmark stops it once the driver's count is read
FILL_READ_S = 1.0  # that read (the device plugin's NVML probe, in a child process)
# A compute tenant's SM share by the driver, as the compute report reads it: taken over its run's seconds after
# the first (warm-up) and one more for the reading child's own start, so within the run and at no cost to it.
SM_READ_AFTER_S = 1.0
SM_READ_SLACK_S = 1.0
SETUP_S = {
    "build the tenant load": 30.0,  # nvcc, or g++ for the emulated GPU
    "build HAMi-core": 60.0,
    "start and stop the MPS daemon": 10.0,
}
MARGIN = 0.05  # of the budget, kept for what the estimates miss
ORDER = (IsolationMode.SHARED, IsolationMode.SOFT, IsolationMode.HARD, IsolationMode.PARTITIONED)
EMULATED_ORDER = ORDER[:2]  # the modes the emulated GPU runs (benchmarks/isolation/emulated)
LIMITED = (IsolationMode.SOFT, IsolationMode.HARD)  # the modes with a compute limit to cap and to tamper with
LIVE = (IsolationMode.SOFT,)  # the mode whose limit the plugin changes in running processes (HAMi-core's region)
BASELINE = "baseline"  # the uncapped runs every share is measured against
# --scenarios: the issue's five (the default), then a tenant idling and resuming, a limit changed live, a pod of
# several processes, and a tenant switching its limiter off in its region
SCENARIOS = ("single", "pair", "latency", "memory", "tampering", "burst", "live", "pod", "switch")
ISSUE_SCENARIOS = SCENARIOS[:5]


class BudgetError(ValueError):
    """The budget cannot hold the runs asked; the message says what it would take."""


@dataclass(frozen=True, slots=True)
class Step:
    """One run: ``mode`` (an IsolationMode's value, or ``baseline``), what it measures, the load, the
    limits in percent of the GPU (one per tenant; none: uncapped), seconds measured, seconds planned."""

    mode: str
    scenario: str  # setup, or one of SCENARIOS
    kernel: str
    targets: tuple[int, ...]
    seconds: float
    cost: float

    @property
    def label(self) -> str:
        limits = "/".join(f"{t}" for t in self.targets) + " %" if self.targets else "uncapped"
        if self.scenario == "setup":
            return self.kernel
        if self.scenario == "latency":
            return f"latency stream at {self.targets[0]} % " + ("alone" if len(self.targets) == 1 else "+ neighbour")
        if self.scenario == "memory":
            return "an allocation past the VRAM limit; held at it, the driver's count"
        if self.scenario == "tampering":
            return f"compute at {limits} with its own limits raised, and an allocation past the VRAM limit"
        if self.scenario == "burst":
            return f"compute at {limits}, idle {BURST_IDLE_S:g} s, then again"
        if self.scenario == "live":
            return f"compute at {self.targets[0]} %, lowered to {self.targets[1]} % while it runs"
        if self.scenario == "switch":
            return f"compute at {limits}, a 0 written into its region's limiter switch while it runs"
        if self.scenario == "pod":
            return f"one pod at {limits}: {POD_PROCS} compute processes"
        return f"{self.kernel} {limits}"


@dataclass(frozen=True, slots=True)
class Plan:
    budget: float
    modes: tuple[IsolationMode, ...]
    steps: tuple[Step, ...]
    pair_s: float
    notes: tuple[str, ...]

    @property
    def total(self) -> float:
        return sum(s.cost for s in self.steps)


def ordered(modes: tuple[IsolationMode, ...]) -> tuple[IsolationMode, ...]:
    """The modes in the order they run (MPS last: it changes the GPU's compute mode), each once."""
    return tuple(m for m in ORDER if m in modes)


def measured(modes: tuple[IsolationMode, ...]) -> tuple[IsolationMode, ...]:
    """The modes this version measures on a whole GPU: partitioned (MIG) is reported, never run."""
    return tuple(m for m in ordered(modes) if m is not IsolationMode.PARTITIONED)


def baseline_kernels(scenarios: tuple[str, ...]) -> tuple[str, ...]:
    """The uncapped loads the asked runs are measured against: every kernel for the single-tenant runs, the
    compute one for the others with a rate (the tampering's honest rate is a single-tenant compute run)."""
    if "single" in scenarios:
        return KERNELS
    return ("compute",) if {"pair", "tampering", "burst", "live", "pod", "switch"} & set(scenarios) else ()


def mode_steps(
    mode: IsolationMode, scenarios: tuple[str, ...], pair_s: float, single_s: float = SINGLE_S
) -> list[Step]:
    """One mode's runs in order: single-tenant (``single_s`` each), splits (``pair_s`` each), latency, memory,
    tampering, burst, live, pod, switch."""
    limited = mode in LIMITED
    steps = []
    if limited and "single" in scenarios:
        steps += [Step(mode, "single", k, (cap,), single_s, single_s + START_S) for k in KERNELS for cap in CAPS]
    elif limited and "tampering" in scenarios:  # its honest rate, to tell what tampering gained
        steps.append(Step(mode, "single", "compute", (TAMPER_CAP,), single_s, single_s + START_S))
    if "pair" in scenarios:
        steps += [Step(mode, "pair", "compute", split, pair_s, pair_s + START_S) for split in SPLITS]
    if "latency" in scenarios:
        steps += [
            Step(mode, "latency", "latency", targets, LATENCY_S, LATENCY_S + START_S)
            for targets in (LATENCY_SPLIT[:1], LATENCY_SPLIT)
        ]
    if "memory" in scenarios:
        steps.append(Step(mode, "memory", "alloc", (), 0.0, 2 * ALLOC_S + FILL_READ_S))
    if limited and "tampering" in scenarios:
        if mode in LIVE:  # past the guard's restore, then again in a region of its own (a run and a probe)
            seconds = max(single_s, TAMPER_S)
            extra = SINGLE_S + START_S + ALLOC_S
        else:
            seconds, extra = single_s, 0.0
        steps.append(Step(mode, "tampering", "compute", (TAMPER_CAP,), seconds, seconds + START_S + ALLOC_S + extra))
    if limited and "burst" in scenarios:
        running = 2 * BURST_RUN_S
        steps.append(Step(mode, "burst", "compute", (BURST_CAP,), running, running + BURST_IDLE_S + START_S))
    if mode in LIVE and "live" in scenarios:
        steps.append(Step(mode, "live", "compute", LIVE_CAPS, 2 * LIVE_HALF_S, 2 * LIVE_HALF_S + START_S))
    if limited and "pod" in scenarios:
        steps.append(Step(mode, "pod", "compute", (POD_CAP,), POD_S, POD_S + START_S))
    if mode in LIVE and "switch" in scenarios:
        steps.append(Step(mode, "switch", "compute", (SWITCH_CAP,), 2 * LIVE_HALF_S, 2 * LIVE_HALF_S + START_S))
    return steps


def all_steps(
    modes: tuple[IsolationMode, ...], scenarios: tuple[str, ...], pair_s: float, single_s: float = SINGLE_S
) -> list[Step]:
    """Every run, in order: the builds, the uncapped baselines, then each mode's runs."""
    steps = [Step("setup", "setup", "build the tenant load", (), 0.0, SETUP_S["build the tenant load"])]
    if IsolationMode.SOFT in modes:
        steps.append(Step("setup", "setup", "build HAMi-core", (), 0.0, SETUP_S["build HAMi-core"]))
    if IsolationMode.HARD in modes:
        what = "start and stop the MPS daemon"
        steps.append(Step("setup", "setup", what, (), 0.0, SETUP_S[what]))
    steps += [Step(BASELINE, "single", k, (), SINGLE_S, SINGLE_S + START_S) for k in baseline_kernels(scenarios)]
    for mode in modes:
        steps += mode_steps(mode, scenarios, pair_s, single_s)
    return steps


def plan(
    budget: float,
    modes: tuple[IsolationMode, ...],
    scenarios: tuple[str, ...] = ISSUE_SCENARIOS,
    single_s: float = SINGLE_S,
) -> Plan:
    """The runs of ``scenarios`` for ``modes`` within ``budget`` seconds, each capped single-tenant run
    ``single_s`` long; :class:`BudgetError` where they cannot fit."""
    runs = measured(modes)
    if not runs:
        raise BudgetError("no mode to run: partitioned (MIG) is reported, not measured; add shared, soft or hard")
    idle = [m for m in runs if not mode_steps(m, scenarios, 0.0)]
    if idle:
        raise BudgetError(
            f"--scenarios {','.join(scenarios)} has nothing to measure in {', '.join(idle)} (single-tenant caps, "
            f"tampering, burst and pod need a compute limit: {', '.join(LIMITED)}; live a limit the plugin changes in "
            f"running processes, and switch HAMi-core's region: {', '.join(LIVE)}); add a scenario or leave that mode "
            "out"
        )
    fixed_cost = sum(s.cost for s in all_steps(runs, scenarios, 0.0, single_s) if s.scenario != "pair")
    pairs = len(runs) * len(SPLITS) if "pair" in scenarios else 0
    usable = budget * (1 - MARGIN)
    pair_s = min(PAIR_GOAL_S, (usable - fixed_cost) / pairs - START_S) if pairs else 0.0
    if (pairs and pair_s < PAIR_MIN_S) or fixed_cost > usable:
        needed = (fixed_cost + pairs * (PAIR_MIN_S + START_S)) / (1 - MARGIN)
        splits = f", {pairs} two-tenant splits of at least {PAIR_MIN_S:g} s" if pairs else ""
        raise BudgetError(
            f"--budget {budget:g} s cannot hold the runs for {', '.join(runs)}: they need at least {needed:.0f} s "
            f"({fixed_cost:.0f} s of builds and fixed runs{splits}, {MARGIN:.0%} margin); raise --budget or "
            "measure fewer --modes or --scenarios"
        )
    notes = []
    if pairs and pair_s < PAIR_GOAL_S:
        full = math.ceil((fixed_cost + pairs * (PAIR_GOAL_S + START_S)) / (1 - MARGIN))
        notes.append(
            f"two-tenant splits scaled down to {pair_s:.0f} s each (the issue asks >= {PAIR_GOAL_S:g} s) to fit "
            f"--budget {budget:g} s; --budget {full} would give them {PAIR_GOAL_S:g} s"
        )
    if IsolationMode.PARTITIONED in modes:
        notes.append(
            "partitioned (MIG): reported, not measured in this version (it needs MIG enabled, and then the whole "
            "GPU the other modes run on is not reachable)"
        )
    return Plan(budget, ordered(modes), tuple(all_steps(runs, scenarios, pair_s, single_s)), pair_s, tuple(notes))


def render_plan(made: Plan) -> str:
    """The plan as printed: one line a run, the total against the budget, and the notes."""
    lines = [f"plan for --budget {made.budget:g} s, modes {', '.join(made.modes)}:"]
    for step in made.steps:
        lines.append(f"  {step.cost:6.1f} s  {step.mode:<9} {step.scenario:<9} {step.label}")
    lines.append(f"  {made.total:6.1f} s  in all (budget {made.budget:g} s, {MARGIN:.0%} kept as margin)")
    lines += [f"note: {n}" for n in made.notes]
    return "\n".join(lines)
