"""--hami-step linear: soft's HAMi-core with one sm_num factor dropped from its limiter's correction step, on a copy
of the exported source, refused before any GPU time where the source is not the one the change was written for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import benchmarks.isolation.__main__ as entry
from benchmarks.isolation.hami_step import WATCHER, StepError, check_source, linear_step, with_linear_step
from benchmarks.isolation.prereqs import blocked, check
from vgpu.names import IsolationMode

# The step as delta() writes it (two sm_num factors, then the rest of the product), spacing varied as C allows.
SQUARED_STEP = "(int64_t)g_sm_num[device_id] * (int64_t)g_sm_num[device_id] * rest"


def source(tmp_path: Path, watcher_text: str | None) -> Path:
    (tmp_path / "hami" / "src").mkdir(parents=True)
    (tmp_path / "hami" / "src" / "libvgpu.c").write_text("")
    if watcher_text is not None:
        (tmp_path / "hami" / WATCHER).parent.mkdir(parents=True)
        (tmp_path / "hami" / WATCHER).write_text(watcher_text)
    return tmp_path / "hami"


@pytest.mark.parametrize(
    ("step", "linear"),
    [
        (SQUARED_STEP, "(int64_t)g_sm_num[device_id] * rest"),
        (
            "(int64_t) g_sm_num[device_id]*\n      (int64_t)g_sm_num[device_id] *\n      rest",
            "(int64_t)g_sm_num[device_id] *\n      rest",
        ),
    ],
)
def test_one_sm_num_factor_is_dropped_and_the_rest_kept(step: str, linear: str) -> None:
    before = f"int64_t increment =\n      {step} / 2560;\nint other = g_sm_num[device_id] * 2;\n"
    after = linear_step(before)
    assert after == f"int64_t increment =\n      {linear} / 2560;\nint other = g_sm_num[device_id] * 2;\n"


@pytest.mark.parametrize(
    ("text", "found"), [("increment = sm * sm * threads;", 0), (f"{SQUARED_STEP}; {SQUARED_STEP};", 2)]
)
def test_a_limiter_written_otherwise_is_not_patched_blind(text: str, found: int) -> None:
    with pytest.raises(StepError, match=f"found it {found} times.*--hami-step stock"):
        linear_step(text)


def test_the_copy_has_the_change_and_the_export_is_untouched(tmp_path: Path) -> None:
    src = source(tmp_path, f"x = {SQUARED_STEP};\n")
    copy = with_linear_step(src, tmp_path / "work" / "linear")
    assert (copy / WATCHER).read_text() == "x = (int64_t)g_sm_num[device_id] * rest;\n"
    assert (copy / "src" / "libvgpu.c").exists()
    assert (src / WATCHER).read_text() == f"x = {SQUARED_STEP};\n"
    assert with_linear_step(src, copy) == copy  # a second run replaces the copy, it does not patch it twice


def test_check_source_says_why_it_cannot_change_it(tmp_path: Path) -> None:
    assert check_source(source(tmp_path / "a", f"x = {SQUARED_STEP};")) is None
    assert "no " in (check_source(source(tmp_path / "b", None)) or "")
    assert "found it 0 times" in (check_source(source(tmp_path / "c", "x = y;")) or "")


def test_linear_on_a_source_it_cannot_change_blocks_soft_only(tmp_path: Path) -> None:
    needs = check(tuple(IsolationMode), source(tmp_path, "x = y;"), "linear", which=lambda _: "/bin/x", euid=lambda: 0)
    soft = blocked(needs, IsolationMode.SOFT)
    assert any(
        r.startswith("HAMi-core's limiter step (--hami-step linear): ") and "found it 0 times" in r for r in soft
    )
    assert not any("limiter step" in r for m in (IsolationMode.SHARED, IsolationMode.HARD) for r in blocked(needs, m))
    stock = check(
        tuple(IsolationMode), source(tmp_path / "s", "x = y;"), "stock", which=lambda _: "/bin/x", euid=lambda: 0
    )
    assert not any("limiter step" in n.what for n in stock)


def test_the_flag_reaches_the_run_and_a_bad_value_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(entry, "run_all", lambda *a: seen.append(a) or 0)
    assert entry.main(["--modes", "soft", "--budget", "400", "--hami-step", "linear"]) == 0
    assert seen[0][-1] == "linear"
    with pytest.raises(SystemExit) as stopped:
        entry.main(["--hami-step", "quadratic"])
    assert stopped.value.code == 2
    assert "invalid choice: 'quadratic'" in capsys.readouterr().err
