"""The isolation benchmark's parts that need no GPU: its flags and their errors, the budget planner and the
dry run, the split arithmetic, each tenant's environment from the device plugin's ``envs.build``, tampering,
the prerequisite checker against fake commands on PATH, the MPS daemon's commands and the compute mode put
back on error, the report rendered from a canned result, and the wrapper script."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import benchmarks.isolation.__main__ as entry
from benchmarks.gpu_check import procs
from benchmarks.gpu_check import report as gpu_report
from benchmarks.gpu_check.constants import GIB, ROOT
from benchmarks.isolation import bench, machines, run, tenants
from benchmarks.isolation.figures import (
    LIVE_SETTLE_S,
    Around,
    Split,
    around,
    mean_rate,
    share,
    shares_after,
    split,
    together,
)
from benchmarks.isolation.mps import MpsError, mps_daemon
from benchmarks.isolation.plan import (
    BURST_CAP,
    BURST_IDLE_S,
    BURST_RUN_S,
    CAPS,
    GUARD_S,
    KERNELS,
    LIVE_CAPS,
    LIVE_HALF_S,
    MARGIN,
    PAIR_GOAL_S,
    PAIR_MIN_S,
    POD_CAP,
    POD_PROCS,
    POD_S,
    SCENARIOS,
    SINGLE_S,
    SPLITS,
    START_S,
    SWITCH_CAP,
    TAMPER_CAP,
    TAMPER_S,
    BudgetError,
    plan,
    render_plan,
)
from benchmarks.isolation.prereqs import blocked, check
from benchmarks.isolation.report import (
    burst_row,
    live_row,
    memory_row,
    pod_row,
    render_markdown,
    single_row,
    switch_row,
    tampering_row,
    write_report,
)
from benchmarks.isolation.tenants import Gpu, gpu_facts, tampered, tenant_env
from benchmarks.isolation.tenants import build as plugin_build
from device_plugin.enforcement.envs import ContainerGrant, EnforcementPaths, MountSpec
from device_plugin.hami_build.changes import CHANGES, describe
from device_plugin.hami_build.graph_edits import GRAPH, GRAPH_CHARGE
from device_plugin.hami_build.watcher_edits import WATCHER
from device_plugin.settings import PluginSettings
from tests.device_plugin.hami_layout import SharedRegion
from tests.device_plugin.test_hami_changes import STOCK_WATCHER, hami_tree
from vgpu.names import LIVE_LIMITS_DIR, EnforcementBackend, Env, IsolationMode

M = IsolationMode
ALL = tuple(IsolationMode)
FIXTURE = Path(__file__).parent / "data" / "isolation_result.json"
UUID = "GPU-11111111-2222-3333-4444-555555555555"
H100 = Gpu(
    index=0,
    uuid=UUID,
    name="NVIDIA H100 80GB HBM3",
    memory_mib=81559,
    mig="Disabled",
    compute_mode="Default",
    driver="580.159.04",
    cuda="13.0",
    tflops=989_000,
    in_catalog=True,
)


# flags and the dry run -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--modes", "shared,turbo"], "argument --modes: unknown mode turbo"),
        (["--modes", ","], "argument --modes: no mode named"),
        (["--budget", "0"], "--budget must be a positive number of seconds, not 0"),
        (["--budget", "soon"], "argument --budget: invalid float value: 'soon'"),
        (["--budget", "120"], "--budget 120 s cannot hold the runs for shared, soft, hard: they need at least"),
        (["--modes", "partitioned", "--dry-run"], "no mode to run: partitioned (MIG) is reported, not measured"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(entry, "run_all", lambda *a: pytest.fail("ran despite a bad argument"))
    with pytest.raises(SystemExit) as stopped:
        entry.main(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_flag_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUT", raising=False)
    args = entry.parser().parse_args([])
    assert (args.out, args.budget, args.modes, args.dry_run, args.emulated) == (
        Path("isolation-out"),
        480.0,
        None,  # all of them, or with --emulated the two it runs (main)
        False,
        False,
    )
    assert args.hami_src == ROOT / ".gpu" / "hami-core"
    assert entry.parser().parse_args(["--modes", " hard,soft "]).modes == (M.HARD, M.SOFT)


@pytest.mark.parametrize(
    ("budget", "modes", "expected"),
    [
        ("480", "shared,soft,hard,partitioned", "note: two-tenant splits scaled down to 19 s each"),
        ("1000", "shared,soft,hard", "    62.0 s  hard      pair      compute 10/90 %\n"),
        ("400", "soft", "    62.0 s  soft      pair      compute 30/70 %\n"),
    ],
)
def test_the_dry_run_prints_the_plan_and_touches_nothing(
    budget: str, modes: str, expected: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(entry, "run_all", lambda *a: pytest.fail("a dry run ran"))
    assert entry.main(["--dry-run", "--budget", budget, "--modes", modes]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"plan for --budget {budget} s, modes {modes.replace(',', ', ')}:\n")
    assert expected in out
    assert ("scaled down" in out) == ("scaled down" in expected)
    assert ("partitioned (MIG): reported, not measured" in out) == ("partitioned" in modes)


def test_a_real_run_goes_to_run_all_with_the_flags_and_a_sigterm_unwinds_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[Any, ...]] = []
    unwound: list[str] = []

    def run_all(*args: Any) -> int:
        seen.append(args)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            unwound.append("put back")
        return 0

    monkeypatch.setattr(entry, "run_all", run_all)
    monkeypatch.chdir(tmp_path)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        entry.main(
            [
                *("--out", "o", "--hami-src", "h", "--modes", "soft", "--budget", "400"),
                *("--scenarios", "pair,single", "--single-s", "12"),
            ]
        )
    assert (stopped.value.code, unwound) == (128 + signal.SIGTERM, ["put back"])
    assert seen == [(Path("o"), (tmp_path / "h").resolve(), 400.0, (M.SOFT,), (), ("single", "pair"), 12.0, False)]
    assert signal.getsignal(signal.SIGTERM) is before


# the planner ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [440.0, 480.0, 600.0, 2000.0])
def test_the_plan_fits_the_budget_with_its_margin(budget: float) -> None:
    made = plan(budget, ALL)
    assert made.total <= budget * (1 - MARGIN) + 1e-6
    assert PAIR_MIN_S <= made.pair_s <= PAIR_GOAL_S
    pairs = [s for s in made.steps if s.scenario == "pair"]
    assert {s.seconds for s in pairs} == {made.pair_s}
    assert [(s.mode, s.targets) for s in pairs] == [(m, t) for m in ("shared", "soft", "hard") for t in SPLITS]


def test_the_plan_has_each_mode_s_runs_in_order() -> None:
    steps = plan(2000, (M.HARD, M.SHARED, M.SOFT, M.PARTITIONED)).steps
    modes = [s.mode for s in steps]
    assert modes == sorted(modes, key=["setup", "baseline", "shared", "soft", "hard"].index)  # MPS last
    assert "partitioned" not in modes
    assert [s.kernel for s in steps if s.mode == "baseline"] == list(KERNELS)
    for mode, capped in (("shared", False), ("soft", True), ("hard", True)):
        mine = [s for s in steps if s.mode == mode]
        singles = [(s.kernel, s.targets) for s in mine if s.scenario == "single"]
        assert singles == ([(k, (c,)) for k in KERNELS for c in CAPS] if capped else [])
        assert [s.scenario for s in mine if s.scenario != "single"] == [
            "pair",
            "pair",
            "latency",
            "latency",
            "memory",
            *(["tampering"] if capped else []),
        ]
    setups = [s.kernel for s in steps if s.scenario == "setup"]
    assert setups == ["build the tenant load", "build HAMi-core", "start and stop the MPS daemon"]
    assert [s.kernel for s in plan(2000, (M.SHARED,)).steps if s.scenario == "setup"] == [setups[0]]


def test_the_smallest_budget_is_accepted_and_one_second_less_refused() -> None:
    with pytest.raises(BudgetError, match=r"need at least (\d+) s") as refused:
        plan(10, (M.SOFT,))
    least = float(str(refused.value).split("at least ")[1].split(" s")[0])
    assert plan(least + 0.5, (M.SOFT,)).pair_s == pytest.approx(PAIR_MIN_S, abs=0.6)
    with pytest.raises(BudgetError):
        plan(least - 1, (M.SOFT,))


def test_the_plan_says_how_much_budget_gives_the_full_splits() -> None:
    made = plan(480, ALL)
    full = float(made.notes[0].split("--budget ")[-1].split(" would")[0])
    assert plan(full, ALL).pair_s == pytest.approx(PAIR_GOAL_S, abs=0.1)
    assert plan(full, ALL).notes == (made.notes[1],)
    assert render_plan(made).splitlines()[-3].endswith("in all (budget 480 s, 5% kept as margin)")


def test_only_the_scenarios_asked_run_with_the_baselines_they_need() -> None:
    made = plan(310, (M.SHARED, M.HARD), ("pair",))  # what the splits at full length need
    assert [(s.mode, s.scenario, s.kernel) for s in made.steps if s.scenario != "pair"] == [
        ("setup", "setup", "build the tenant load"),
        ("setup", "setup", "start and stop the MPS daemon"),
        ("baseline", "single", "compute"),
    ]
    assert [(s.mode, s.targets) for s in made.steps if s.scenario == "pair"] == [
        (m, t) for m in ("shared", "hard") for t in SPLITS
    ]
    assert (made.pair_s, made.notes) == (PAIR_GOAL_S, ())
    # Tampering brings its honest rate (a capped compute run); shared has no limit to tamper with.
    tamper = plan(400, (M.SOFT,), ("tampering",)).steps
    assert [(s.mode, s.scenario, s.targets) for s in tamper if s.mode != "setup"] == [
        ("baseline", "single", ()),
        ("soft", "single", (TAMPER_CAP,)),
        ("soft", "tampering", (TAMPER_CAP,)),
    ]
    with pytest.raises(BudgetError, match="nothing to measure in shared"):
        plan(400, (M.SHARED, M.SOFT), ("tampering",))
    # Without splits nothing is scaled; a budget below the fixed runs is refused, naming no split.
    made = plan(100, (M.SHARED,), ("latency", "memory"))
    assert [s.scenario for s in made.steps] == ["setup", "latency", "latency", "memory"]
    assert (made.pair_s, made.notes) == (0.0, ())
    with pytest.raises(BudgetError, match=r"need at least 56 s \(53 s of builds and fixed runs, 5% margin\)"):
        plan(50, (M.SHARED,), ("latency", "memory"))


def test_a_pause_a_live_change_and_a_pod_are_asked_for_by_name_and_run_where_they_mean_something() -> None:
    assert {"burst", "live", "pod"}.isdisjoint(s.scenario for s in plan(2000, ALL).steps)  # not the five
    made = plan(400, (M.SOFT, M.HARD), ("burst", "live", "pod"))
    assert [(s.mode, s.scenario, s.targets, s.seconds, s.cost) for s in made.steps if s.mode != "setup"] == [
        ("baseline", "single", (), SINGLE_S, SINGLE_S + START_S),
        ("soft", "burst", (BURST_CAP,), 2 * BURST_RUN_S, 2 * BURST_RUN_S + BURST_IDLE_S + START_S),
        ("soft", "live", LIVE_CAPS, 2 * LIVE_HALF_S, 2 * LIVE_HALF_S + START_S),
        ("soft", "pod", (POD_CAP,), POD_S, POD_S + START_S),
        ("hard", "burst", (BURST_CAP,), 2 * BURST_RUN_S, 2 * BURST_RUN_S + BURST_IDLE_S + START_S),
        ("hard", "pod", (POD_CAP,), POD_S, POD_S + START_S),
    ]
    assert [s.label for s in made.steps if s.scenario in ("burst", "live", "pod")][:3] == [
        "compute at 25 %, idle 20 s, then again",
        "compute at 50 %, lowered to 10 % while it runs",
        "one pod at 25 %: 2 compute processes",
    ]
    with pytest.raises(BudgetError, match=r"nothing to measure in hard .*live a limit the plugin changes"):
        plan(400, (M.HARD,), ("live",))


def test_longer_single_runs_lengthen_the_capped_ones_only_and_count_in_the_budget() -> None:
    made = plan(600, (M.SOFT,), ("single", "tampering"), single_s=18)
    lengths = {(s.mode, s.scenario, bool(s.targets)): s.seconds for s in made.steps if s.scenario != "setup"}
    assert lengths == {
        ("baseline", "single", False): SINGLE_S,
        ("soft", "single", True): 18,
        ("soft", "tampering", True): 18,
    }
    fixed = plan(600, (M.SOFT,), ("single", "tampering")).total
    # soft's tampering runs TAMPER_S at least: past the guard's restore
    assert made.total - fixed == pytest.approx(len(KERNELS) * len(CAPS) * (18 - SINGLE_S) + (18 - TAMPER_S))
    assert [s.seconds for s in plan(600, (M.SOFT, M.HARD), ("tampering",)).steps if s.scenario == "tampering"] == [
        TAMPER_S,
        SINGLE_S,
    ]


def test_scenarios_are_checked_as_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.main(["--dry-run", "--modes", "hard", "--scenarios", "memory, pair", "--budget", "200"]) == 0
    out = capsys.readouterr().out
    assert "hard      pair" in out and "hard      memory" in out and "latency" not in out
    for argv, said in (
        (["--scenarios", "pair,bogus"], "unknown scenario bogus"),
        (["--scenarios", ","], "no scenario named"),
        # A flag that would change nothing is refused, not ignored.
        (["--modes", "shared,hard", "--scenarios", "tampering"], "has nothing to measure in shared (single-tenant"),
        (["--modes", "hard", "--hami-change", "graph-launch"], "--modes hard has no soft"),
        (["--modes", "soft", "--scenarios", "pair", "--single-s", "20"], "this plan has none (they run in soft"),
        (["--modes", "shared", "--single-s", "20"], "this plan has none"),
        (["--single-s", "3"], "--single-s must be at least 4 s"),
    ):
        with pytest.raises(SystemExit) as stopped:
            entry.main(["--dry-run", *argv])
        assert stopped.value.code == 2
        assert said in capsys.readouterr().err


# the arithmetic ------------------------------------------------------------------------------------------


def second(start: float, rate: float) -> dict[str, Any]:
    return {"step": "second", "from": start, "to": start + 1.0, "rate": rate}


def test_mean_rate_leaves_out_the_first_second_and_weights_by_time() -> None:
    rows = [{"step": "ready"}, second(0, 999), second(1, 100), {"step": "second", "from": 2, "to": 4, "rate": 400}]
    assert mean_rate(rows) == pytest.approx((100 + 800) / 3)
    assert mean_rate(rows, 0, 2) == pytest.approx((999 + 100) / 2)
    assert mean_rate([{"step": "done", "rate": 5}]) is None
    assert mean_rate(rows, 10, 20) is None


def test_together_is_the_common_window_after_each_tenant_settles() -> None:
    a = [second(t, 1) for t in range(0, 10)]
    b = [second(t, 1) for t in range(3, 15)]
    assert together(a, b) == (4.0, 10.0)
    assert together(a, []) is None
    assert together(a[:2], b) is None


def test_split_points_and_total() -> None:
    made = split((30, 70), [150.0, 340.0], 500.0)
    assert made == Split((30, 70), (30.0, 68.0))
    assert made.points == pytest.approx((0.0, -2.0))
    assert (made.total, made.worst) == (pytest.approx(98.0), pytest.approx(2.0))
    assert split((10, 90), [50.0, None], 500.0) is None
    assert split((10, 90), [50.0, 450.0], None) is None
    assert share(25.0, 100.0) == 25.0 and share(None, 100.0) is None and share(1.0, 0.0) is None


def test_around_a_moment_the_settled_seconds_on_each_side() -> None:
    rows = [second(t, 500) for t in range(0, 8)] + [second(t, 100) for t in range(8, 16)]
    seen = around(rows, 8.0, 1000.0)  # before: from the second second; after: from 2 s past the moment
    assert (seen.before, seen.after) == (pytest.approx(50.0), pytest.approx(10.0))
    assert around(rows, 0.5, 1000.0).before is None  # no settled second before it
    assert around(rows, 15.5, 1000.0).after is None  # nor one 2 s after it
    assert around([], 3.0, 1000.0) == Around(None, None)
    assert shares_after(rows, 14.0, 1000.0) == [10.0, 10.0] and shares_after(rows, 14.0, None) == []


def test_softs_tampering_row_says_what_the_plugins_guard_left_it() -> None:
    tamper = {
        "target": 25,
        "changed": {"CUDA_DEVICE_SM_LIMIT": "100"},
        "honest_share": 24.8,
        "tampered_share": 99.7,
        "guard": {"state": "ready", "writes": ["sm_limit[0] = 25", "limit[0] = 4096 MiB"], "after_s": 5.0},
        "guarded_share": 25.1,
        "gain_points": 0.1,
        "ceiling": None,
        "memory": {"over_mib": 5120, "over_ok": False, "over_error": "cudaErrorMemoryAllocation", "within_mib": 1024}
        | {"within_ok": True},
    }
    assert tampering_row(tamper) == (
        "| tampering: CUDA_DEVICE_SM_LIMIT=100 (beside the plugin's guard: region ready, put back after 5 s) | 25 % | "
        "99.7 % of uncapped until the guard, 25.1 % from 2 s after it (honest 24.8 %); 5120 MiB refused "
        "(cudaErrorMemoryAllocation), 1024 MiB granted | +0.1 points kept (past its limit), no memory |"
    )


def test_the_guard_acts_when_the_plugins_pass_would_at_the_latest() -> None:
    assert PluginSettings.model_fields["live_limits_interval"].default == GUARD_S < TAMPER_S - LIVE_SETTLE_S


def test_a_tenant_run_as_its_container_sees_the_pods_live_limits_directory_and_the_host_gets_none(
    tmp_path: Path,
) -> None:
    (tmp_path / "hami.cache").write_text("the pod's region")
    wrap = bench.in_container(tmp_path)
    if not wrap:  # no unshare or not root: the run is marked as not in a container, never passed off as one
        assert shutil.which("unshare") is None or os.geteuid() != 0
        return
    seen = subprocess.run([*wrap, "cat", f"{LIVE_LIMITS_DIR}/hami.cache"], capture_output=True, text=True, check=False)
    assert (seen.returncode, seen.stdout) == (0, "the pod's region"), seen.stderr
    assert not Path(LIVE_LIMITS_DIR).exists()  # made inside the namespace only


def test_the_switch_row_and_where_it_writes() -> None:
    switched = {"target": 25, "policy": "FORCE", "before_share": 24.6, "after_share": 27.0, "error": None}
    assert switch_row(switched) == (
        "| a 0 written into its region's limiter switch while it runs, compute | 25 % | 24.6 % before; 27.0 % from "
        "2 s after (GPU_CORE_UTILIZATION_POLICY=FORCE) | +2.0 points after |"
    )
    assert "(no policy variable) | +73.0 points after |" in switch_row(switched | {"policy": None, "after_share": 98.0})
    assert switch_row(switched | {"error": "tenant never ready"}).endswith("| failed: tenant never ready | n/a |")
    assert SharedRegion.utilization_switch.offset == bench.SWITCH_OFFSET  # HAMi-core 8f3a89c's layout
    made = plan(400, (M.SOFT, M.HARD), ("switch", "memory"))
    assert [(s.mode, s.scenario, s.targets) for s in made.steps if s.scenario == "switch"] == [
        ("soft", "switch", (SWITCH_CAP,))
    ]
    with pytest.raises(BudgetError, match=r"nothing to measure in hard .*switch HAMi-core's region: soft"):
        plan(400, (M.HARD,), ("switch",))


def test_the_burst_live_and_pod_rows_say_what_happened_or_why_not() -> None:
    burst = {"target": 25, "idle_s": 20.0, "before_share": 24.9, "after_shares": [98.0, 61.0, 30.0, 25.5, 25.0]}
    assert burst_row(burst | {"worst_points": 73.0, "error": None}) == (
        "| after 20 s idle, one tenant, compute | 25 % | 24.9 % before the pause; 98.0 / 61.0 / 30.0 / 25.5 % in the "
        "first seconds after it | +73.0 points at most |"
    )
    assert burst_row(burst | {"error": "no resume row"}).endswith("| 25 % | failed: no resume row | n/a |")
    live = {"targets": [50, 10], "before_share": 49.5, "after_share": 10.4, "error": None}
    assert live_row(live | {"region": {"state": "ready", "writes": ["sm_limit[0] = 10"]}}) == (
        "| limit lowered while running (region rewritten), compute | 50 → 10 % | 49.5 % before; 10.4 % from 2 s "
        "after (region ready, 1 write(s)) | +0.4 points after |"
    )
    never = live | {"after_share": None, "region": {"state": "tenant never ready"}}
    assert "region tenant never ready, 0 write(s)) | n/a points after |" in live_row(never)
    pod = {"target": 25, "processes": 2, "seconds_together": 8.9, "shares": [24.0, 25.5], "total": 49.5}
    assert pod_row(pod | {"points": 24.5}) == (
        "| one pod, 2 busy compute processes | 25 % | 24.0 + 25.5 = 49.5 % over 8.9 s together | +24.5 points |"
    )
    apart = pod | {"seconds_together": 0.0, "shares": [], "total": None, "points": None}
    assert pod_row(apart) == "| one pod, 2 busy compute processes | 25 % | n/a (no common second) | n/a |"


# tenants' environments -----------------------------------------------------------------------------------


@pytest.fixture
def paths(tmp_path: Path) -> EnforcementPaths:
    lib = tmp_path / "hami" / "libvgpu.so"
    preload = tmp_path / "ld.so.preload"
    preload.write_text(f"{lib}\n")
    return EnforcementPaths(hami_library=str(lib), hami_preload=str(preload), mps_pipe_host=str(tmp_path / "pipe"))


def env_of(mode: IsolationMode, paths: EnforcementPaths, live: Path, percent: int | None = 25) -> dict[str, str]:
    return tenant_env(mode, H100, percent=percent, vram_limit=4 * GIB, paths=paths, live_dir=live)


def test_the_soft_tenant_gets_hami_core_s_variables_with_host_paths(paths: EnforcementPaths, tmp_path: Path) -> None:
    live = tmp_path / "live"
    envs = env_of(M.SOFT, paths, live)
    assert envs[Env.HAMI_SM_LIMIT] == envs[f"{Env.HAMI_SM_LIMIT}_0"] == "25"
    assert envs[f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0"] == "4096m"
    assert envs[Env.HAMI_SHARED_REGION] == f"{live}/hami.cache"  # the live-limits mount, seen from the host
    assert envs[Env.TF_LIVE_LIMITS] == f"{live}/limits.json"
    assert envs["LD_PRELOAD"] == paths.hami_library  # what /etc/ld.so.preload holds in the container
    assert envs["CUDA_VISIBLE_DEVICES"] == envs[Env.NVIDIA_VISIBLE_DEVICES] == UUID
    assert not any(k.startswith("CUDA_MPS_") for k in envs)
    assert env_of(M.SOFT, paths, live, None)[Env.HAMI_SM_LIMIT] == "100"
    assert env_of(M.SOFT, paths, live, 10)[Env.HAMI_SM_LIMIT] == "10"


def test_the_hard_tenant_gets_mps_variables_and_the_benchmark_s_pipe(paths: EnforcementPaths, tmp_path: Path) -> None:
    envs = env_of(M.HARD, paths, tmp_path / "live", 30)
    assert envs[Env.MPS_ACTIVE_THREAD_PERCENTAGE] == "30"
    assert envs[Env.MPS_PINNED_MEM_LIMIT] == "0=4096M"
    assert envs[Env.MPS_PIPE_DIRECTORY] == paths.mps_pipe_host
    assert "LD_PRELOAD" not in envs and Env.HAMI_SM_LIMIT not in envs


@pytest.mark.parametrize("mode", [M.SHARED, M.PARTITIONED])
def test_shared_and_partitioned_tenants_have_no_limiter(
    mode: IsolationMode, paths: EnforcementPaths, tmp_path: Path
) -> None:
    envs = env_of(mode, paths, tmp_path / "live")
    assert json.loads(envs[Env.TF_UP_LIMIT]) == {UUID: 25}
    assert json.loads(envs[Env.TF_MEM_LIMIT]) == {UUID: 4 * GIB}
    assert not any(k.startswith(("CUDA_DEVICE_", "CUDA_MPS_", "LD_PRELOAD")) for k in envs)


def test_every_tenant_env_is_the_plugin_s_answer(
    paths: EnforcementPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []

    def fake(*args: Any) -> ContainerGrant:
        calls.append(args)
        return ContainerGrant(
            envs={Env.NVIDIA_VISIBLE_DEVICES: "GPU-x", "NEW_KNOB": "/in/container/f"},
            mounts=(MountSpec("/in/container", "/on/host", False),),
        )

    monkeypatch.setattr(tenants, "build", fake)
    envs = env_of(M.HARD, paths, tmp_path / "live", 50)
    assert envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-x", "NEW_KNOB": "/on/host/f", "CUDA_VISIBLE_DEVICES": "GPU-x"}
    alloc, target, backend, given_paths, live = calls[0]
    assert backend is EnforcementBackend.MPS and given_paths is paths and live.host_dir == str(tmp_path / "live")
    (grant,) = alloc.gpus
    assert (grant.uuid, grant.gpu_tflops, grant.tflops_limit, grant.vram_limit) == (UUID, 989_000, 494_500, 4 * GIB)
    assert target.namespace == "isolation-bench"
    assert plugin_build.__module__ == "device_plugin.enforcement.envs"


def test_tampering_raises_each_limit_the_mode_puts_in_the_environment(paths: EnforcementPaths, tmp_path: Path) -> None:
    soft = env_of(M.SOFT, paths, tmp_path / "a")
    raised, changed = tampered(soft, H100)
    assert changed == {
        Env.HAMI_SM_LIMIT: "100",
        f"{Env.HAMI_SM_LIMIT}_0": "100",
        f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0": "81559m",
    }
    assert raised == {**soft, **changed}
    hard = env_of(M.HARD, paths, tmp_path / "b")
    assert tampered(hard, H100)[1] == {Env.MPS_ACTIVE_THREAD_PERCENTAGE: "100", Env.MPS_PINNED_MEM_LIMIT: "0=81559M"}
    shared = env_of(M.SHARED, paths, tmp_path / "c")
    assert tampered(shared, H100) == (shared, {})


def test_gpu_facts_from_nvidia_smi_s_document() -> None:
    from benchmarks.gpu_check import smi

    xml = f"""<nvidia_smi_log><driver_version>580.159.04</driver_version><cuda_version>13.0</cuda_version>
      <gpu><product_name>NVIDIA H100 80GB HBM3</product_name><uuid>{UUID}</uuid>
      <mig_mode><current_mig>Disabled</current_mig></mig_mode><compute_mode>Default</compute_mode>
      <fb_memory_usage><total>81559 MiB</total></fb_memory_usage></gpu>
      <gpu><product_name>Mystery Accelerator</product_name><uuid>GPU-2</uuid></gpu></nvidia_smi_log>"""
    assert gpu_facts(smi.parse(xml)) == H100
    other = gpu_facts(smi.parse(xml), 1)
    assert (other.tflops, other.in_catalog, other.compute_mode) == (tenants.UNKNOWN_TFLOPS, False, "Default")
    with pytest.raises(RuntimeError, match="nvidia-smi lists 2 GPUs; GPU 2 is not there"):
        gpu_facts(smi.parse(xml), 2)


# prerequisites, with fake commands on PATH ---------------------------------------------------------------


def fake_bin(folder: Path, **programs: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, script in programs.items():
        (folder / name).write_text(f"#!/bin/sh\n{script}\n")
        (folder / name).chmod(0o755)
    return folder


def hami_source(tmp_path: Path) -> Path:
    return hami_tree(tmp_path / "hami")


def test_with_every_command_there_every_whole_gpu_mode_can_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fake_bin(
        tmp_path / "bin",
        **{
            "nvidia-smi": 'echo "NVIDIA H100 80GB HBM3, Disabled, Default"',
            "nvcc": "true",
            "cmake": "true",
            "nvidia-cuda-mps-control": "true",
        },
    )
    monkeypatch.setenv("PATH", str(folder))
    needs = check(ALL, hami_source(tmp_path), euid=lambda: 0)
    assert [m for m in ALL if not blocked(needs, m)] == [M.SHARED, M.SOFT, M.HARD]
    assert blocked(needs, M.PARTITIONED) == [
        "MIG instances to measure: MIG mode Disabled: enabling it needs a GPU reset, which this benchmark never does"
    ]
    assert needs[1].line() == (
        "ok       a GPU answering nvidia-smi: NVIDIA H100 80GB HBM3 (needed by: shared, soft, hard, partitioned)"
    )


def test_missing_pieces_skip_only_the_modes_that_need_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fake_bin(
        tmp_path / "bin", **{"nvidia-smi": 'echo "NVIDIA H100 80GB HBM3, Disabled, Default"', "nvcc": "true"}
    )
    monkeypatch.setenv("PATH", str(folder))
    needs = check((M.SHARED, M.SOFT, M.HARD), tmp_path / "nowhere", euid=lambda: 1000)
    assert blocked(needs, M.SHARED) == []
    assert blocked(needs, M.SOFT) == [
        f"HAMi-core source: no {tmp_path}/nowhere/src/libvgpu.c: export it there (benchmarks/gpu_check docstring)",
        "cmake or gcc (builds HAMi-core): neither",
    ]
    assert blocked(needs, M.HARD) == [
        "nvidia-cuda-mps-control (the MPS control daemon): not on PATH",
        "root (sets the compute mode): uid 1000",
    ]
    assert not any("MPS" in n.what for n in check((M.SHARED,), tmp_path, euid=lambda: 1000))


def test_no_nvidia_smi_or_no_answer_blocks_every_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_bin(tmp_path / "empty")))
    needs = check(ALL, tmp_path, euid=lambda: 0)
    assert all(blocked(needs, m)[0] == "nvidia-smi (the GPU's facts, the compute mode): not on PATH" for m in ALL)
    folder = fake_bin(tmp_path / "bin", **{"nvidia-smi": "echo 'No devices were found' >&2; exit 6", "nvcc": "true"})
    monkeypatch.setenv("PATH", str(folder))
    needs = check((M.SHARED,), tmp_path, euid=lambda: 0)
    assert blocked(needs, M.SHARED) == ["a GPU answering nvidia-smi: rc 6: No devices were found"]


def test_mig_enabled_blocks_the_whole_gpu_modes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fake_bin(
        tmp_path / "bin", **{"nvidia-smi": 'echo "NVIDIA H100 80GB HBM3, Enabled, Exclusive_Process"', "nvcc": "true"}
    )
    monkeypatch.setenv("PATH", str(folder))
    needs = check(ALL, hami_source(tmp_path), euid=lambda: 0)
    assert blocked(needs, M.SHARED) == [
        "MIG disabled (the whole GPU reachable): MIG mode Enabled",
        "compute mode Default (tenants side by side): Exclusive_Process: put it back with nvidia-smi -i 0 -c DEFAULT",
    ]
    assert blocked(needs, M.PARTITIONED) == [
        "MIG instances to measure: MIG is enabled, but this version measures no MIG instance"
    ]


def test_run_all_without_a_gpu_reports_every_mode_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(fake_bin(tmp_path / "empty")))
    monkeypatch.setattr(bench, "WORK", tmp_path / "work")
    monkeypatch.setattr(bench, "HAMI_LOG", tmp_path / "vgpulog")
    monkeypatch.setenv("FAKE_HAMI_LOG", str(tmp_path / "vgpulog"))
    (tmp_path / "vgpulog").write_text("an earlier run's line\n")
    monkeypatch.setattr(run, "measure", lambda *a: pytest.fail("measured without a GPU"))
    monkeypatch.setattr(gpu_report, "SUMMARY", [])
    kept = procs.DEADLINE[0]
    try:
        assert run.run_all(tmp_path / "out", tmp_path, 480.0, (M.SOFT, M.SHARED)) == 1
    finally:
        procs.DEADLINE[0] = kept
    written = json.loads((tmp_path / "out" / "isolation.json").read_text())
    assert list(written["modes"]) == ["shared", "soft"]
    assert {m["status"] for m in written["modes"].values()} == {"not measured"}
    out = capsys.readouterr().out
    assert "MISSING  nvidia-smi (the GPU's facts, the compute mode): not on PATH" in out
    assert "## soft (enforcement backend hami-core): not measured" in out


# the MPS daemon, with a fake runner ----------------------------------------------------------------------


class FakeRunner:
    """Records each command (with the pipe folder it was given and its stdin) and answers from ``fail``."""

    def __init__(self, mode: str = "Default", fail: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, str | None, str | None]] = []
        self.mode, self.fail = mode, fail

    def __call__(
        self, cmd: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        line = " ".join(cmd)
        self.calls.append((line, (env or {}).get(Env.MPS_PIPE_DIRECTORY), stdin))
        rc = 1 if any(line.endswith(f) for f in self.fail) else 0
        return subprocess.CompletedProcess(cmd, rc, f"{self.mode}\n" if "--query-gpu" in line else "", "nope")


def test_the_daemon_is_started_private_and_everything_put_back(tmp_path: Path) -> None:
    runner, log = FakeRunner("Default"), []
    with mps_daemon(0, tmp_path / "mps", log, runner) as pipe:
        assert pipe == tmp_path / "mps" / "pipe" and pipe.is_dir() and (tmp_path / "mps" / "log").is_dir()
        assert len(runner.calls) == 3
    assert runner.calls == [
        ("nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader", None, None),
        ("nvidia-smi -i 0 -c EXCLUSIVE_PROCESS", None, None),
        ("nvidia-cuda-mps-control -d", str(pipe), None),
        ("nvidia-cuda-mps-control", str(pipe), "quit\n"),
        ("nvidia-smi -i 0 -c DEFAULT", None, None),
    ]
    assert log[0] == "compute mode found: DEFAULT" and log[-1] == "$ nvidia-smi -i 0 -c DEFAULT: rc 0"


def test_an_error_inside_still_quits_the_daemon_and_restores_the_mode(tmp_path: Path) -> None:
    runner = FakeRunner("Prohibited")
    with pytest.raises(RuntimeError, match="a tenant crashed"), mps_daemon(1, tmp_path, [], runner):
        raise RuntimeError("a tenant crashed")
    assert [c[0] for c in runner.calls[-2:]] == ["nvidia-cuda-mps-control", "nvidia-smi -i 1 -c PROHIBITED"]
    assert runner.calls[-2][2] == "quit\n"


def test_a_daemon_that_does_not_start_leaves_the_mode_restored(tmp_path: Path) -> None:
    runner, log = FakeRunner(fail=("-d",)), []
    with pytest.raises(MpsError, match="nvidia-cuda-mps-control -d failed"), mps_daemon(0, tmp_path, log, runner):
        pytest.fail("ran without a daemon")
    assert [c[0] for c in runner.calls][-2:] == ["nvidia-cuda-mps-control -d", "nvidia-smi -i 0 -c DEFAULT"]


def test_a_refused_compute_mode_starts_nothing(tmp_path: Path) -> None:
    runner = FakeRunner(fail=("EXCLUSIVE_PROCESS",))
    with pytest.raises(MpsError, match="cannot set GPU 0 to EXCLUSIVE_PROCESS"), mps_daemon(0, tmp_path, [], runner):
        pytest.fail("ran without the compute mode")
    assert [c[0] for c in runner.calls] == [
        "nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader",
        "nvidia-smi -i 0 -c EXCLUSIVE_PROCESS",
    ]


def test_a_failed_restore_says_how_to_do_it_by_hand(tmp_path: Path) -> None:
    log: list[str] = []
    with mps_daemon(0, tmp_path, log, FakeRunner(fail=("-c DEFAULT",))):
        pass
    assert log[-1] == "COMPUTE MODE NOT RESTORED: set it back by hand: nvidia-smi -i 0 -c DEFAULT"


# the report ----------------------------------------------------------------------------------------------


def test_the_report_renders_a_canned_result(tmp_path: Path) -> None:
    result = json.loads(FIXTURE.read_text())
    markdown = write_report(tmp_path, result)
    assert (tmp_path / "isolation.md").read_text() == markdown == render_markdown(result)
    assert json.loads((tmp_path / "isolation.json").read_text()) == result
    lines = markdown.splitlines()
    versions = "NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.0"
    assert f"## shared (enforcement backend none) — {versions}" in lines
    assert f"## soft (enforcement backend hami-core) — {versions}" in lines
    assert "| compute, one tenant | 10 % | 12.0 % of uncapped (60.0 kernels/s) | +2.0 points |" in lines
    assert "| memory, one tenant | 10 % | failed: cudaErrorLaunchFailure | n/a |" in lines
    assert (
        "| two saturating tenants, compute | 30 / 70 % | 48.0 / 50.0 % over 21.0 s together | "
        "+18.0 / -20.0 points; together 98 % of one uncapped tenant |"
    ) in lines
    assert "| two saturating tenants, compute | 10 / 90 % | n/a (no common second) | n/a |" in lines
    assert (
        "| latency stream, p99 | 50 % beside a 50 % neighbour | 4200 µs (p50 2000); alone 40 µs (p50 30) | ×105.0 |"
    ) in lines
    assert (
        lines.count("| memory | 4096 MiB | 5120 MiB granted, 1024 MiB granted; device seen 81079 MiB | NOT held |") == 1
    )
    assert (
        "| memory | 4096 MiB | 5120 MiB refused (cudaErrorMemoryAllocation), 1024 MiB granted; device seen 4096 MiB "
        "| held |"
    ) in lines
    assert lines[lines.index("| compute | 500.0 kernels/s |") - 4] == "## uncapped, alone (what every share is of)"
    tamper = next(line for line in lines if line.startswith("| tampering"))
    assert "CUDA_DEVICE_SM_LIMIT=100" in tamper and "97.5 % of uncapped (honest 28.0 %)" in tamper
    assert tamper.endswith("| +69.5 points, more memory |")
    assert "FAILED: graph 10 %: RuntimeError: boom" in lines and "Not run, out of budget: graph 50 %" in lines
    assert lines[lines.index("## hard (enforcement backend mps): not measured") + 2] == (
        "- nvidia-cuda-mps-control (the MPS control daemon): not on PATH"
    )
    assert "- note: two-tenant splits scaled down to 24 s each" in markdown
    graph = {"kernel": "graph", "target": 25, "rate": 150.0, "unit": "TFLOP/s", "share": 30.0, "error": None}
    result["modes"]["soft"]["single"].append(graph | {"graph_charging": {"charged_graphs": 1, "uncharged_warnings": 2}})
    assert (
        "| graph (graph launches charged: 1 graph(s), some launches NOT charged), one tenant | 25 % | 30.0 % of "
        "uncapped (150.0 TFLOP/s) | +5.0 points |"
    ) in render_markdown(result).splitlines()


def test_a_result_that_never_reached_the_gpu_still_renders() -> None:
    markdown = render_markdown({"budget_s": 480, "modes": {}, "error": "Traceback ...\nRuntimeError: nvcc failed"})
    assert "GPU: not reached" in markdown and markdown.endswith("RuntimeError: nvcc failed\n```\n")


# the programs --------------------------------------------------------------------------------------------


def test_the_tenant_load_has_every_load_the_benchmark_runs() -> None:
    source = (bench.HERE / "tenant_load.cu").read_text()
    usage = next(line for line in source.splitlines() if "usage: %s" in line)
    for kernel in (*KERNELS, "latency", "alloc"):
        assert kernel in usage
        assert f"//   tenant_load {kernel} " in source


# a whole run against fake GPU commands -------------------------------------------------------------------

FAKE_LOAD = """#!{python}
# tenant_load as a fake GPU would run it: a compute limit holds only where its limiter is really there
# (HAMi-core preloaded from the file LD_PRELOAD names, or the MPS pipe folder the daemon made)
import json, os, sys, time
from pathlib import Path

def limit(key, default):
    return float(os.environ[key].split("=")[-1].rstrip("mM")) if key in os.environ else default

hami = os.path.isfile(os.environ.get("LD_PRELOAD", "/nonexistent"))
mps = os.path.isdir(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent"))
off = os.environ.get("GPU_CORE_UTILIZATION_POLICY", "").lower() == "disable"  # HAMi-core's limiter switched off
pct = 100 if hami and off else limit("CUDA_DEVICE_SM_LIMIT", 100) if hami else limit("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", 100) if mps else 100
mib = limit("CUDA_DEVICE_MEMORY_LIMIT_0", 1e9) if hami else limit("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", 1e9) if mps else 1e9
held = os.path.join(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent"), "ceiling")
for line in open(held).read().splitlines() if mps and os.path.isfile(held) else ():  # MPS: env only lowers it
    words = line.split()
    if words[:1] == ["set_default_active_thread_percentage"]:
        pct = min(pct, float(words[1]))
    if words[:2] == ["set_default_device_pinned_mem_limit", "0"]:
        mib = min(mib, float(words[2].rstrip("M")))
if hami and sys.argv[1] == "graph" and "graph-launch" in open(os.environ["LD_PRELOAD"]).read():
    print("[HAMI-core Info(1:2:graph.c:3)]: graph exec 0x1: each launch charged 16 blocks", file=sys.stderr)
if hami and os.environ.get("LIBCUDA_LOG_LEVEL") == "3":  # HAMi-core's watcher, at info level
    with open(os.environ["FAKE_HAMI_LOG"], "a") as log:
        log.write(f"device 0: userutil=50 limit={{int(pct)}} {{sys.argv[1]}}\\n")
emit = lambda **row: print(json.dumps(row), flush=True)
kind, t0 = sys.argv[1], time.time()
region = os.environ.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "")
sys.path.insert(0, "{repo}")
from tests.device_plugin.hami_layout import SharedRegion, initialised, write_region
if kind == "fill":  # 64 MiB at a time until the limit refuses, or the most asked is held
    chunk, most = int(sys.argv[2]), int(sys.argv[3])
    got = min(most, int(mib) // chunk * chunk)
    emit(step="filled", mib=got, pid=os.getpid(), stopped="most" if got == most else "cudaErrorMemoryAllocation")
    sys.exit(0)
if kind == "alloc":
    if hami and os.path.isfile(region):  # a region made before: HAMi-core takes its limit, not the environment's
        mib = SharedRegion.from_buffer_copy(Path(region).read_bytes()).limit[0] >> 20
    emit(step="mem_get_info", total_mib=int(min(mib, 81559)))
    for step, want in (("within", sys.argv[2]), ("over", sys.argv[3])):
        ok = int(want) <= mib
        emit(step=step, mib=int(want), ok=ok, error="" if ok else "cudaErrorMemoryAllocation")
    sys.exit(0)
seconds = int(float(sys.argv[2]))
# The live and switch scenarios, and soft's tampering beside the plugin's guard: HAMi-core's region, made at start
# from the environment (its limiter switch on); its past half already run when the benchmark writes the region
if hami and ("-live/" in region or "-switch/" in region or ("-tamperer/" in region and "/own-" not in region)):
    made = initialised([(int(mib) << 20, int(pct))])
    made.utilization_switch = 1
    write_region(Path(region), made)
    t0 -= seconds // 2
    emit(step="ready", kernel=kind, pid=os.getpid(), wall=t0, unit="kernels/s")
    for i in range(seconds // 2):
        emit(step="second", **{{"from": t0 + i, "to": t0 + i + 1, "rate": 10 * pct}})
    seen = lambda: SharedRegion.from_buffer_copy(Path(region).read_bytes())
    while (seen().sm_limit[0], seen().utilization_switch) == (pct, 1) and time.time() < t0 + seconds // 2 + 10:
        time.sleep(0.02)  # until the benchmark writes it
    if seen().utilization_switch == 0 and os.environ.get("GPU_CORE_UTILIZATION_POLICY") != "FORCE":
        pct = 100  # the region's switch off, and the environment does not force the limiter on
    elif "live-sm-limit" in open(os.environ["LD_PRELOAD"]).read() and not off:  # read at every tick
        pct = seen().sm_limit[0]
    t1 = time.time()
    for i in range(seconds - seconds // 2):
        emit(step="second", **{{"from": t1 + i, "to": t1 + i + 1, "rate": 10 * pct}})
    emit(step="done", kernel=kind, wall=t1 + seconds // 2, rate=10 * pct)
    sys.exit(0)
emit(step="ready", kernel=kind, pid=os.getpid(), wall=t0, unit="us" if kind == "latency" else "kernels/s")
idle_at, idle = (int(float(sys.argv[3])), float(sys.argv[4])) if len(sys.argv) > 4 else (seconds, 0.0)
for i in range(seconds):
    if i == idle_at:  # a pause: HAMi-core's refill grows meanwhile (but with idle-hold), so it first runs uncapped
        emit(step="idle", wall=t0 + i, seconds=idle)
        t0 += idle
        emit(step="resume", wall=t0 + i)
    windup = hami and "idle-hold" not in open(os.environ["LD_PRELOAD"]).read()
    # A pod's two processes: HAMi-core holds their sum (its watcher sums the region's processes); MPS each one.
    each = 10 * pct / 2 if hami and "-pod/" in region else 10 * pct
    rate = 1000 if windup and idle and i == idle_at else each
    emit(step="second", **{{"from": t0 + i, "to": t0 + i + 1, "rate": rate}})
emit(step="done", kernel=kind, wall=t0 + seconds, p50_us=30.0, p99_us=100.0 - pct / 2)
"""

FAKE_SMI = f"""
echo "nvidia-smi $*" >> "$FAKE_LOG"
case "$*" in
  *mig.mode.current*) echo "NVIDIA H100 80GB HBM3, Disabled, Default" ;;
  "-q -x") echo '<nvidia_smi_log><driver_version>580.159.04</driver_version><cuda_version>13.0</cuda_version>
    <gpu><product_name>NVIDIA H100 80GB HBM3</product_name><uuid>{UUID}</uuid><compute_mode>Default</compute_mode>
    <mig_mode><current_mig>Disabled</current_mig></mig_mode><fb_memory_usage><total>81559 MiB</total>
    </fb_memory_usage></gpu></nvidia_smi_log>' ;;
  *compute_mode*) cat "$FAKE_MODE" ;;
  *" -c "*) echo "$4" > "$FAKE_MODE" ;;
esac
"""


@pytest.mark.parametrize("changes", [(), CHANGES])
def test_a_whole_run_on_fake_gpu_commands(
    changes: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lib = tmp_path / "libvgpu.so"
    lib.write_text(" ".join(changes))  # what the fake load reads to act as that build
    (tmp_path / "load.py").write_text(FAKE_LOAD.format(python=sys.executable, repo=ROOT))
    folder = fake_bin(
        tmp_path / "bin",
        **{
            "nvidia-smi": FAKE_SMI,
            "nvcc": f'eval out=\\${{$#}}; for a; do [ "$prev" = -o ] && out=$a; prev=$a; done; '
            f'cp {tmp_path}/load.py "$out"; chmod +x "$out"; echo "nvcc $*" >> "$FAKE_LOG"',
            # The daemon as the plugin relies on it: a server (PID 77) listed, a ceiling kept for new clients.
            "nvidia-cuda-mps-control": 'in=$(cat); echo "mps $* pipe=$CUDA_MPS_PIPE_DIRECTORY stdin=$in" '
            '| tr "\\n" ";" >> "$FAKE_LOG"; echo >> "$FAKE_LOG"; [ "$1" = -d ] && mkdir -p "$CUDA_MPS_PIPE_DIRECTORY"; '
            'case "$in" in get_server_list) echo 77 ;; set_default*) echo "$in" > "$CUDA_MPS_PIPE_DIRECTORY/ceiling" ;; '
            "esac; true",
            "cmake": "true",
        },
    )
    (tmp_path / "mode").write_text("Default\n")
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv("FAKE_MODE", str(tmp_path / "mode"))
    monkeypatch.setattr(bench, "WORK", tmp_path / "work")
    monkeypatch.setattr(bench, "HAMI_LOG", tmp_path / "vgpulog")
    monkeypatch.setenv("FAKE_HAMI_LOG", str(tmp_path / "vgpulog"))
    (tmp_path / "vgpulog").write_text("an earlier run's line\n")
    source = hami_source(tmp_path)
    built = tmp_path / "work" / "hami-core-changed" if changes else source  # soft's HAMi-core: a copy if changed
    monkeypatch.setattr(machines, "build_hami", lambda src, out: lib if src == built else None)
    monkeypatch.setattr(
        run, "check", lambda modes, src, changes, **kw: check(modes, src, changes, euid=lambda: 0, **kw)
    )
    monkeypatch.setattr(gpu_report, "SUMMARY", [])
    asked: list[tuple[str, int]] = []

    def counted(uuid: str, pid: int, env: dict[str, str]) -> dict[str, Any]:  # the driver's count: 4396 MiB
        asked.append((uuid, pid))
        return {"driver_mib": 4396, "matched": "pid"}

    monkeypatch.setattr(bench, "counted", counted)
    read_sm: list[tuple[int, float]] = []

    def sm_share(uuid: str, pid: int, env: dict[str, str], seconds: float) -> dict[str, Any]:  # the driver: 26 %
        read_sm.append((pid, seconds))
        return {"driver_sm": 26, "matched": "pid"}

    monkeypatch.setattr(bench, "sm_share", sm_share)
    kept = procs.DEADLINE[0]
    try:
        monkeypatch.setattr(bench.Bench, "pause", staticmethod(lambda _: None))
        assert run.run_all(tmp_path / "out", source, 2000.0, ALL, changes, SCENARIOS) == 0
    finally:
        procs.DEADLINE[0] = kept
    result = json.loads((tmp_path / "out" / "isolation.json").read_text())
    modes = result["modes"]
    assert [m["status"] for m in modes.values()] == ["measured", "measured", "measured", "not measured"]
    assert result["hami_build"] == describe(changes)
    assert (source / WATCHER).read_text() == STOCK_WATCHER  # the export is never changed
    if changes:
        assert "int64_t increment = (int64_t)g_sm_num[device_id] * rest;" in (built / WATCHER).read_text()
        assert "cached_sm_limit[dev] = get_current_device_sm_limit(dev);" in (built / WATCHER).read_text()
        assert (built / GRAPH).read_text().endswith(GRAPH_CHARGE.read_text())
    assert [s["rate"] for s in result["baseline"]["single"]] == [1000.0] * 3
    for mode in ("soft", "hard"):
        assert [(s["kernel"], s["target"], s["share"]) for s in modes[mode]["single"]] == [
            (k, c, pytest.approx(c)) for k in KERNELS for c in CAPS
        ]
        assert [p["points"] for p in modes[mode]["pairs"]] == [pytest.approx([0, 0])] * 2
        assert [p["total"] for p in modes[mode]["pairs"]] == [pytest.approx(100)] * 2
        assert (modes[mode]["memory"]["within_ok"], modes[mode]["memory"]["over_ok"]) == (True, False)
        assert modes[mode]["latency"]["alone"]["p99_us"] == 75.0
    # What the graph-launch build logged reaches the soft graph rows (and only there).
    charged = {"charged_graphs": 1, "uncharged_warnings": 0} if changes else None
    assert [s["graph_charging"] for s in modes["soft"]["single"]] == [
        charged if k == "graph" else None for k in KERNELS for _ in CAPS
    ]
    assert {s["graph_charging"] for s in modes["hard"]["single"]} == {None}
    # Soft: raising its own limits gains the whole GPU. Hard: under the plugin's ceiling (the tamperer's own
    # grant, alone on the GPU), its raised variables gain nothing.
    # Soft, beside the plugin's guard: the region its process made with the raised limits is put back, which a
    # running process follows only in a build that reads it at every tick; a later allocation finds it put back.
    soft = modes["soft"]["tampering"]
    assert soft["guard"] == {"state": "ready", "writes": soft["guard"]["writes"], "after_s": GUARD_S}
    assert len(soft["guard"]["writes"]) == 2  # the SM limit and the VRAM limit
    assert soft["tampered_share"] == pytest.approx(100)
    assert soft["gain_points"] == pytest.approx(0 if "live-sm-limit" in changes else 75)
    assert soft["memory"]["over_ok"] is False and soft["ceiling"] is None
    # With the limiter switched off and a region of its own, which no guard watches: compute and memory.
    assert soft["own_region"]["share"] == pytest.approx(100) and soft["own_region"]["gain_points"] == pytest.approx(75)
    assert soft["own_region"]["memory"]["over_ok"] is True
    assert soft["own_region"]["mount_namespace"] is bool(bench.in_container(tmp_path))
    assert modes["hard"]["tampering"]["own_region"] is None
    assert modes["hard"]["tampering"]["gain_points"] == pytest.approx(0)
    assert modes["hard"]["tampering"]["memory"]["over_ok"] is False
    assert modes["hard"]["tampering"]["ceiling"] == [
        "set_default_active_thread_percentage 25",
        "set_default_device_pinned_mem_limit 0 4096M",
        "set_active_thread_percentage 77 25",
        "set_device_pinned_mem_limit 77 0 4096M",
    ]
    # Held at its limit: a limiter stops the fill at the limit, nothing stops shared's before twice it; the driver's
    # count of each filled tenant, asked by its PID, is what the VRAM guard judges.
    at_limit = {mode: modes[mode]["memory"]["at_limit"] for mode in ("shared", "soft", "hard")}
    assert {m: (a["filled_mib"], a["stopped"], a["past_limit_mib"]) for m, a in at_limit.items()} == {
        "shared": (8192, "most", 300),
        "soft": (4096, "cudaErrorMemoryAllocation", 300),
        "hard": (4096, "cudaErrorMemoryAllocation", 300),
    }
    assert len(asked) == 3 and {uuid for uuid, _ in asked} == {UUID} and all(pid > 0 for _, pid in asked)
    assert [p["shares"] for p in modes["shared"]["pairs"]] == [[100.0, 100.0]] * 2
    assert modes["shared"]["memory"]["over_ok"] is True and "tampering" not in modes["shared"]
    assert result["pair_s"] == 60.0 and modes["shared"]["pairs"][0]["seconds_together"] == pytest.approx(59, abs=0.5)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    pipe = tmp_path / "work" / "mps" / "pipe"
    assert [c for c in calls if c.startswith(("mps", "nvidia-smi -i"))] == [
        "nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader",
        "nvidia-smi -i 0 -c EXCLUSIVE_PROCESS",
        f"mps -d pipe={pipe} stdin=;",
        f"mps  pipe={pipe} stdin=get_server_list;",
        f"mps  pipe={pipe} stdin=" + "".join(f"{c};" for c in modes["hard"]["tampering"]["ceiling"]),
        f"mps  pipe={pipe} stdin=quit;",
        "nvidia-smi -i 0 -c DEFAULT",
    ]
    assert (tmp_path / "mode").read_text() == "DEFAULT\n"
    assert modes["hard"]["mps"][-1] == "$ nvidia-smi -i 0 -c DEFAULT: rc 0"
    out = capsys.readouterr().out
    assert (
        "| compute, one tenant | 25 % | 25.0 % of uncapped (250.0 kernels/s); the driver counts 26 % of the SMs over "
        "2 s | +0.0 points |"
    ) in out
    # Read while each compute tenant ran (the baseline's and each mode's caps), over its seconds after the first
    # and the reading child's start; never for the other kernels.
    computes = [s for m in ("soft", "hard", "shared") for s in modes[m].get("single", []) if s["kernel"] == "compute"]
    assert {s["driver"]["driver_sm"] for s in computes} == {26} and all(pid > 0 for pid, _ in read_sm)
    assert len(read_sm) == len(computes) + 1 and {seconds for _, seconds in read_sm} == {2.0}
    assert {s["driver"] for m in ("soft", "hard") for s in modes[m]["single"] if s["kernel"] != "compute"} == {None}
    assert (
        "| memory | 4096 MiB | 5120 MiB granted, 1024 MiB granted; device seen 81559 MiB; filled 8192 MiB (most), "
        "the driver counts 4396 MiB: +300 MiB past the limit | NOT held |"
    ) in out
    assert "started PID" in (tmp_path / "out" / "runs.log").read_text()
    # HAMi-core's watcher lines, of this run's soft tenants only (the tampering tenant raised its limit to 100).
    watcher = (tmp_path / "out" / "hami-watcher.log").read_text().splitlines()
    # 9 single runs, 2 pairs of 2, latency (alone 1, beside 2), the allocation and the fill, tampering (compute,
    # allocation), the same in a region of its own (compute, allocation), burst, live, a pod's two processes, switch
    assert len(watcher) == 9 + 4 + 3 + 2 + 2 + 2 + 1 + 1 + 2 + 1 and all(
        line.startswith("device 0: userutil=50") for line in watcher
    )
    # A pause: soft's first second after it ran uncapped (held with idle-hold), hard's held its cap; shared has no
    # cap to pause under.
    first = BURST_CAP if "idle-hold" in changes else 100
    assert modes["soft"]["burst"] | {"after_shares": modes["soft"]["burst"]["after_shares"][:3]} == {
        "target": BURST_CAP,
        "idle_s": BURST_IDLE_S,
        "before_share": pytest.approx(BURST_CAP),
        "after_shares": [pytest.approx(first), pytest.approx(BURST_CAP), pytest.approx(BURST_CAP)],
        "worst_points": pytest.approx(first - BURST_CAP),
        "error": None,
    }
    assert modes["hard"]["burst"]["worst_points"] == pytest.approx(0) and "burst" not in modes["shared"]
    # A limit lowered live through the plugin's region writer: it reaches the running process only in a build
    # that reads the region at every tick.
    live = modes["soft"]["live"]
    assert live["region"]["state"] == "ready" and len(live["region"]["writes"]) == 1
    assert live["before_share"] == pytest.approx(LIVE_CAPS[0])
    assert live["after_share"] == pytest.approx(LIVE_CAPS[1] if "live-sm-limit" in changes else LIVE_CAPS[0])
    assert "live" not in modes["hard"] and "live" not in modes["shared"]
    assert "| limit lowered while running (region rewritten), compute | 50 → 10 % |" in out
    # A pod of two busy processes: soft holds their sum to the pod's limit, hard (MPS: a limit per client) each.
    for mode, each in (("soft", POD_CAP / 2), ("hard", POD_CAP)):
        pod = modes[mode]["pod"]
        assert pod["shares"] == [pytest.approx(each)] * POD_PROCS and pod["processes"] == POD_PROCS
        assert pod["points"] == pytest.approx(POD_PROCS * each - POD_CAP) and pod["seconds_together"] > 5
    assert "pod" not in modes["shared"]
    assert "| one pod, 2 busy compute processes | 25 % | 12.5 + 12.5 = 25.0 % over" in out
    # The region's limiter switch written 0: the plugin's FORCE keeps soft's limiter on.
    assert modes["soft"]["switch"] == {
        "target": SWITCH_CAP,
        "policy": "FORCE",
        "before_share": pytest.approx(SWITCH_CAP),
        "after_share": pytest.approx(SWITCH_CAP),
        "error": None,
    }
    assert "switch" not in modes["hard"] and "switch" not in modes["shared"]
    assert "| tampering: the same, with HAMi-core's switch off (`GPU_CORE_UTILIZATION_POLICY=disable`) and a" in out


def test_a_compute_row_says_the_drivers_sm_share_of_the_tenant_or_why_it_was_not_read() -> None:
    row = {"kernel": "compute", "target": 25, "share": 26.5, "rate": 26.2, "unit": "TFLOP/s"}
    read = {"driver_sm": 31, "matched": "pid", "seconds": 2.0}
    assert single_row(row | {"driver": read}) == (
        "| compute, one tenant | 25 % | 26.5 % of uncapped (26.2 TFLOP/s); the driver counts 31 % of the SMs over "
        "2 s | +1.5 points |"
    )
    unread = {"driver_sm": None, "matched": "PID 7 not among those listed ([1, 2])", "seconds": 2.0}
    assert "; the driver's SM share not read: PID 7 not among those listed ([1, 2]) |" in single_row(
        row | {"driver": unread}
    )
    assert single_row(row | {"driver": None}).endswith("(26.2 TFLOP/s) | +1.5 points |")


def test_the_memory_row_says_the_drivers_count_of_a_tenant_held_at_its_limit_or_why_it_was_not_read() -> None:
    probe = {"limit_mib": 4096, "within_mib": 1024, "within_ok": True, "over_mib": 5120, "over_ok": False}
    probe |= {"over_error": "cudaErrorMemoryAllocation", "device_mib_seen": 4096}
    read = {"filled_mib": 4032, "stopped": "cudaErrorMemoryAllocation", "driver_mib": 4550, "matched": "pid"}
    assert memory_row(probe | {"at_limit": read | {"past_limit_mib": 454}}) == (
        "| memory | 4096 MiB | 5120 MiB refused (cudaErrorMemoryAllocation), 1024 MiB granted; device seen 4096 MiB; "
        "filled 4032 MiB (cudaErrorMemoryAllocation), the driver counts 4550 MiB: +454 MiB past the limit | held |"
    )
    unread = read | {"driver_mib": None, "past_limit_mib": None, "matched": "PID 7 not among those listed ([1, 2])"}
    assert memory_row(probe | {"at_limit": unread}).endswith(
        "; filled 4032 MiB, the driver's count not read (PID 7 not among those listed ([1, 2])) | held |"
    )
