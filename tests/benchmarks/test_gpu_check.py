"""The GPU check's parts that need no GPU: reading ``nvidia-smi -q -x``, the probe's field checks, the
report and its sections, the flags, the child-output helpers, HAMi-core's configured header and the
container environment, the figures said from fixed results, and the programs found where the code runs them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import benchmarks.gpu_check.__main__ as entry
from benchmarks.gpu_check import procs, report, smi
from benchmarks.gpu_check.__main__ import main, parser
from benchmarks.gpu_check.constants import GIB, HERE, ROOT, SM_PERCENT, VRAM_LIMIT
from benchmarks.gpu_check.hami_build import FEATURES, static_config
from benchmarks.gpu_check.hami_limits import memory_line, rate
from benchmarks.gpu_check.hami_runs import LOAD as HAMI_LOAD
from benchmarks.gpu_check.hami_runs import container_env, hami_lines
from benchmarks.gpu_check.probe_check import all_match, field_checks
from benchmarks.gpu_check.sampling import LOAD as SAMPLING_LOAD
from benchmarks.gpu_check.sampling import phase_figures, phase_window, timed
from device_plugin.gpus.probe import GpuDevice

UUID = "GPU-11111111-2222-3333-4444-555555555555"
SMI_XML = f"""<?xml version="1.0" ?>
<nvidia_smi_log>
  <driver_version>580.159.04</driver_version>
  <cuda_version>13.0</cuda_version>
  <gpu id="00000000:19:00.0">
    <product_name>NVIDIA H100 80GB HBM3</product_name>
    <uuid>{UUID}</uuid>
    <pci><pci_bus_id>00000000:19:00.0</pci_bus_id></pci>
    <mig_mode><current_mig>Disabled</current_mig></mig_mode>
    <fb_memory_usage><total>81559 MiB</total><used>0 MiB</used></fb_memory_usage>
  </gpu>
  <gpu id="00000000:2A:00.0">
    <product_name>NVIDIA A100-SXM4-40GB</product_name>
    <mig_mode><current_mig> Enabled </current_mig></mig_mode>
  </gpu>
</nvidia_smi_log>
"""


def h100(**changes: Any) -> GpuDevice:
    fields: dict[str, Any] = {"uuid": UUID, "index": 0, "name": "NVIDIA H100 80GB HBM3", "memory": 81559 * 2**20}
    return GpuDevice(**{**fields, "numa": 0, **changes})


# nvidia-smi -q -x ---------------------------------------------------------------------------------------


def test_smi_fields_are_read_from_each_gpu_with_defaults_for_missing_ones() -> None:
    first, second = smi.parse(SMI_XML).findall("gpu")
    assert (smi.memory_mib(first), smi.mig_mode(first), smi.bus_id(first)) == (81559, "Disabled", "0000:19:00.0")
    assert (smi.memory_mib(second), smi.mig_mode(second), smi.bus_id(second)) == (0, "Enabled", "")


def test_sysfs_numa_reads_the_node_and_is_none_without_the_file(tmp_path: Path) -> None:
    (tmp_path / "0000:19:00.0").mkdir()
    (tmp_path / "0000:19:00.0" / "numa_node").write_text("1\n")
    assert smi.sysfs_numa("0000:19:00.0", tmp_path) == 1
    assert smi.sysfs_numa("0000:2a:00.0", tmp_path) is None


def test_smi_xml_fails_naming_nvidia_smi_when_it_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match=r"nvidia-smi -q -x: rc 127: \[gpu-check\] cannot run nvidia-smi"):
        smi.smi_xml()


# the probe's checks --------------------------------------------------------------------------------------


def test_field_checks_match_a_probe_that_agrees_with_nvidia_smi() -> None:
    gpu = smi.parse(SMI_XML).find("gpu")
    assert gpu is not None
    checks = field_checks(h100(), gpu, 0)
    assert checks == {
        "name": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", True),
        "uuid": (UUID, UUID, True),
        "memory MiB": (81559, 81559, True),
        "MIG": (False, "Disabled", True),
        "NUMA (vs sysfs numa_node)": (0, 0, True),
    }
    rows = [{"checks": {k: {"match": v[2]} for k, v in checks.items()}}]
    assert all_match(rows, 0)
    assert not all_match(rows, 1)  # the --probe command failing fails the section's verdict


def test_field_checks_flag_each_disagreement() -> None:
    gpu = smi.parse(SMI_XML).find("gpu")
    assert gpu is not None
    checks = field_checks(h100(memory=80 * GIB, mig=True, numa=1, name="H100"), gpu, 0)
    assert {k for k, v in checks.items() if not v[2]} == {"name", "memory MiB", "MIG", "NUMA (vs sysfs numa_node)"}
    rows = [{"checks": {k: {"match": v[2]} for k, v in checks.items()}}]
    assert not all_match(rows, 0)


def test_sysfs_minus_one_means_no_numa_node() -> None:
    gpu = smi.parse(SMI_XML).find("gpu")
    assert gpu is not None
    assert field_checks(h100(numa=None), gpu, -1)["NUMA (vs sysfs numa_node)"] == (None, -1, True)
    assert field_checks(h100(numa=0), gpu, -1)["NUMA (vs sysfs numa_node)"][2] is False


# the report ----------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_report() -> Iterator[tuple[dict[str, Any], list[str]]]:
    """The run's report and summary, emptied for the test (every module holds the same two objects)."""
    kept = dict(report.REPORT), list(report.SUMMARY)
    report.REPORT.clear()
    report.SUMMARY.clear()
    yield report.REPORT, report.SUMMARY
    report.REPORT.clear()
    report.REPORT.update(kept[0])
    report.SUMMARY[:] = kept[1]


def test_a_failing_section_is_recorded_and_returns_none(
    fresh_report: tuple[dict[str, Any], list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    found, said = fresh_report

    @report.section("broken")
    def broken(value: int) -> int:
        raise ValueError(f"bad {value}")

    @report.section("fine")
    def fine(value: int) -> int:
        return value * 2

    assert broken(3) is None
    assert fine(4) == 8
    assert said[:2] == ["\n## broken", "FAILED: ValueError: bad 3"]
    assert said[2].startswith("(broken: ") and said[2].endswith(" s)")
    assert said[3] == "\n## fine" and said[4].startswith("(fine: ")
    assert list(found["errors"]) == ["broken"]
    assert "Traceback" in found["errors"]["broken"] and "ValueError: bad 3" in found["errors"]["broken"]
    assert capsys.readouterr().out == "".join(line + "\n" for line in said)
    assert report.exit_status(found) == 1
    assert report.exit_status({"probe": {}}) == 0


def test_write_report_renders_both_files(tmp_path: Path) -> None:
    results = {"probe": {"all_match": True, "slots": ((4 * GIB, 20),), "at": tmp_path}}
    report.write_report(tmp_path, results, ["\n## probe", "probe matches: True"])
    assert (tmp_path / "report.md").read_text() == "# gpu-check\n\n## probe\nprobe matches: True\n"
    written = (tmp_path / "report.json").read_text()
    assert json.loads(written) == {"probe": {"all_match": True, "slots": [[4 * GIB, 20]], "at": str(tmp_path)}}
    assert written.startswith('{\n "probe": {\n  "all_match": true')  # indent 1, as the report always had


# flags ---------------------------------------------------------------------------------------------------


def test_flag_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUT", raising=False)
    args = parser().parse_args([])
    assert args.out == Path("gpu-check-out")
    assert args.hami_src == ROOT / ".gpu" / "hami-core"
    assert (ROOT / "pyproject.toml").is_file() and (ROOT / "scripts" / "gpu-check").is_file()
    assert (args.skip_hami, args.budget) == (False, 3600.0)
    monkeypatch.setenv("OUT", "/tmp/elsewhere")
    assert parser().parse_args([]).out == Path("/tmp/elsewhere")
    given = parser().parse_args(["--out", "o", "--hami-src", "h", "--skip-hami", "--budget", "90"])
    assert (given.out, given.hami_src, given.skip_hami, given.budget) == (Path("o"), Path("h"), True, 90.0)


def test_main_runs_the_sections_in_order_writes_the_report_and_exits_1_on_a_failure(
    fresh_report: tuple[dict[str, Any], list[str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    found, said = fresh_report
    called: list[tuple[str, tuple[Any, ...]]] = []
    failing = {"probe"}

    def stand_in(name: str) -> Any:
        @report.section(name)
        def run(*args: Any) -> None:
            called.append((name, args))
            if name in failing:
                raise RuntimeError("no GPU here")

        return run

    monkeypatch.setattr(entry, "WORK", tmp_path / "work")
    monkeypatch.setattr(entry, "environment", stand_in("environment"))
    monkeypatch.setattr(entry, "probe_check", stand_in("probe"))
    monkeypatch.setattr(entry, "sampling", stand_in("per-process sampling"))
    monkeypatch.setattr(entry, "hami", stand_in("HAMi-core limits"))
    monkeypatch.chdir(tmp_path)
    assert main(["--out", "out", "--hami-src", "src", "--budget", "5"]) == 1
    assert called == [
        ("environment", (Path("out"),)),
        ("probe", (Path("out"),)),
        ("per-process sampling", ()),
        ("HAMi-core limits", (Path("out"), (tmp_path / "src").resolve())),
    ]
    assert procs.DEADLINE[0] <= time.time() + 5
    assert (tmp_path / "work").is_dir()
    assert list(json.loads((tmp_path / "out" / "report.json").read_text())["errors"]) == ["probe"]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert markdown.startswith("# gpu-check\n\n## environment\n") and "FAILED: RuntimeError: no GPU here" in markdown

    called.clear()
    found.clear()
    said.clear()
    failing.clear()
    assert main(["--out", "out", "--skip-hami"]) == 0
    assert [name for name, _ in called] == ["environment", "probe", "per-process sampling"]


@pytest.mark.parametrize(
    ("script", "args", "start"),
    [
        ("gpu-check", ["--help"], "usage: gpu-check [-h] [--out OUT] [--hami-src HAMI_SRC] [--skip-hami]"),
        ("isolation-bench", ["--dry-run", "--modes", "soft"], "plan for --budget 480 s, modes soft:\n"),
    ],
)
def test_the_wrappers_run_their_package_from_anywhere(tmp_path: Path, script: str, args: list[str], start: str) -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / script), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(start)


# child processes -----------------------------------------------------------------------------------------


def test_lines_of_keeps_the_json_objects_only() -> None:
    text = 'warming up\n{"step": "held", "ok": true}\n[1, 2]\n{"step": "extra_while_held", "ok": false}\n{oops\n'
    rows = procs.lines_of(text)
    assert rows == [{"step": "held", "ok": True}, {"step": "extra_while_held", "ok": False}]
    assert procs.step(rows, "extra_while_held") == {"step": "extra_while_held", "ok": False}
    assert procs.step(rows, "extra_alone") == {}


def test_run_reports_a_missing_program_as_rc_127() -> None:
    done = procs.run(["/nonexistent/nvcc", "--version"])
    assert done.returncode == 127 and done.stderr.startswith("[gpu-check] cannot run /nonexistent/nvcc:")


def test_waits_are_cut_to_the_budget_but_last_a_few_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs, "DEADLINE", [time.time() + 1000])
    assert procs.bounded(120) == 120
    procs.set_budget(30)
    assert 29 < procs.bounded(120) <= 30
    procs.set_budget(0)
    assert procs.bounded(120) == 3.0


# sampling ------------------------------------------------------------------------------------------------


def test_phase_window_keeps_the_samples_wholly_inside_the_phase() -> None:
    samples = [{"t": 100.0 + i, "gpu_util": 90, "processes": [{"pid": 7, "sm_percent": 10 * i}]} for i in range(8)]
    phases = {"full_start": {"t": 101.6}, "full_end": {"t": 105.5, "busy_percent": 99.0}}
    # the sample at 103 follows one at 102, under half a second into the phase; the one at 104 follows 103:
    # the first counted. The one at 106 ends after the phase.
    assert [s["t"] for s in phase_window(samples, phases, "full")] == [104.0, 105.0]
    assert phase_window(samples, phases, "duty") == []
    figures = phase_figures(samples, phases, "full", 7)
    assert figures == {"load_busy_percent": 99.0, "sampled_sm_percent": [40, 50], "gpu_util": [90, 90]}
    assert phase_figures(samples, phases, "full", 8)["sampled_sm_percent"] == []


def test_timed_counts_calls_and_stops_at_the_cap() -> None:
    calls: list[int] = []
    figures = timed(50, lambda: calls.append(1))
    assert figures["calls"] == len(calls) == 50
    assert set(figures) == {"calls", "wall_mean_us", "wall_p50_us", "wall_p99_us", "cpu_mean_us"}
    slow = timed(1000, lambda: time.sleep(0.002), cap_s=0.01)
    assert slow["calls"] == 20  # at least 20, then stopped by the cap


# HAMi-core -----------------------------------------------------------------------------------------------


def test_static_config_defines_the_four_switches_and_nothing_else() -> None:
    template = "".join(f"#cmakedefine {name}\n" for name in FEATURES)
    template += '#cmakedefine OTHER_SWITCH\n#define GIT_HASH "@GIT_HASH@"\n#define GIT_BRANCH "@GIT_BRANCH@"\n'
    header = static_config(template)
    assert all(f"#define {name}\n" in header for name in FEATURES)
    assert "// #undef OTHER_SWITCH\n" in header
    assert '"x"' in header and "@" not in header and "#cmakedefine" not in header


def test_the_container_environment_limits_memory_to_4_gib_and_sm_to_20_percent() -> None:
    envs = container_env(UUID, 989_000)
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{VRAM_LIMIT >> 20}m"
    assert envs["CUDA_DEVICE_SM_LIMIT_0"] == str(SM_PERCENT)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == UUID


def test_memory_line_says_what_was_granted_and_refused() -> None:
    rows = [
        {"step": "mem_get_info", "total_mib": 4096},
        {"step": "held", "ok": True},
        {"step": "extra_while_held", "ok": False, "error": "cudaErrorMemoryAllocation"},
        {"step": "extra_alone", "ok": True},
    ]
    assert memory_line("hami_check mem", True, rows) == (
        "hami_check mem, HAMi-core 4 GiB limit: mem_get_info total 4096 MiB; 3072 MiB: ok; "
        "+2048 MiB while holding it: refused: cudaErrorMemoryAllocation; 2048 MiB alone: ok"
    )
    assert memory_line("torch mem", False, rows[:3]).endswith(
        "+2048 MiB while holding it: refused: cudaErrorMemoryAllocation"
    )


def test_rate_is_overall_and_after_settling() -> None:
    rows = [{"step": "burn_second", "t": t, "kernels_per_s": k} for t, k in ((1, 900), (5, 300), (7, 200), (8, 100))]
    rows.append({"step": "burn", "kernels_per_s": 400})
    assert rate(rows, "kernels_per_s", "burn", 6) == (400, 150.0)
    assert rate(rows[:2], "kernels_per_s", "burn", 6) == (None, None)


def test_hami_lines_keeps_its_set_up_and_oom_lines() -> None:
    err = "noise\n [HAMI-core Info] SET PID 7 \nuserutil=3\n[HAMI-core Warn] OOM at 4096\ncore utilization limit 20\n"
    assert hami_lines(err) == [
        "[HAMI-core Info] SET PID 7",
        "[HAMI-core Warn] OOM at 4096",
        "core utilization limit 20",
    ]


# the programs the check runs -----------------------------------------------------------------------------


def test_the_programs_are_found_where_the_check_runs_them() -> None:
    assert (HERE / "hami_check.cu").is_file()
    assert SAMPLING_LOAD[:2] == HAMI_LOAD == [sys.executable, str(HERE / "load.py")]
    assert Path(HAMI_LOAD[1]).is_file()


def test_the_load_reports_a_refused_allocation(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """load.py's mem mode against a stand-in torch whose device holds 4 GiB (torch itself is not needed)."""
    used = [0]

    def empty(n: int, **_: Any) -> object:
        if used[0] + n > 4 * GIB:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
        used[0] += n
        return object()

    torch = ModuleType("torch")
    torch.uint8 = "u8"  # type: ignore[attr-defined]
    torch.empty = empty  # type: ignore[attr-defined]
    torch.cuda = SimpleNamespace(  # type: ignore[attr-defined]
        mem_get_info=lambda: (4 * GIB - used[0], 4 * GIB), memory_reserved=lambda: used[0]
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    spec = importlib.util.spec_from_file_location("gpu_check_load", HERE / "load.py")  # as a script runs it
    assert spec is not None and spec.loader is not None
    load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(load)
    monkeypatch.setattr(sys, "argv", ["load.py", "mem", "--held-mib", "3072", "--extra-mib", "2048"])
    load.main()
    rows = procs.lines_of(capsys.readouterr().out)
    assert [(r["step"], r.get("ok")) for r in rows] == [
        ("mem_get_info", None),
        ("held", True),
        ("extra_while_held", False),
    ]
    assert rows[0]["total_mib"] == 4096 and rows[1]["reserved_mib"] == 3072
    assert rows[2]["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
