"""The isolation benchmark's --hami-change: soft's HAMi-core built with the plugin image's changes (or stock), a
change the exported source cannot take blocking soft alone before any GPU time, the flag reaching the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import benchmarks.isolation.__main__ as entry
from benchmarks.isolation.prereqs import blocked, check
from device_plugin.hami_build.changes import GRAPH_LAUNCH, LINEAR_STEP
from tests.device_plugin.test_hami_changes import hami_tree
from vgpu.names import IsolationMode


def test_changes_a_source_cannot_take_block_soft_only(tmp_path: Path) -> None:
    src = hami_tree(tmp_path / "moved", "x = y;")
    needs = check(tuple(IsolationMode), src, [LINEAR_STEP], which=lambda _: "/bin/x", euid=lambda: 0)
    soft = blocked(needs, IsolationMode.SOFT)
    assert any(
        r.startswith("HAMi-core changes (--hami-change linear-step): ") and "found it 0 times" in r for r in soft
    )
    assert not any("--hami-change" in r for m in (IsolationMode.SHARED, IsolationMode.HARD) for r in blocked(needs, m))
    stock = check(tuple(IsolationMode), src, (), which=lambda _: "/bin/x", euid=lambda: 0)
    assert not any("--hami-change" in n.what for n in stock)
    fine = check(tuple(IsolationMode), hami_tree(tmp_path / "ok"), [GRAPH_LAUNCH], which=lambda _: "/x", euid=lambda: 0)
    assert [n.line() for n in fine if "--hami-change" in n.what] == [
        "ok       HAMi-core changes (--hami-change graph-launch): they apply (needed by: soft)"
    ]


def test_the_flag_reaches_the_run_and_a_bad_value_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(entry, "run_all", lambda *a: seen.append(a) or 0)
    argv = ["--modes", "soft", "--budget", "400", "--hami-change", "share-model", "--hami-change", "graph-launch"]
    assert entry.main([*argv, "--hami-change", "idle-hold", "--hami-change", "graph-launch"]) == 0
    assert seen[-1][4] == ("graph-launch", "idle-hold", "share-model")  # each once, in the order they build on
    assert entry.main(["--modes", "soft", "--budget", "400"]) == 0
    assert seen[-1][4] == ()
    with pytest.raises(SystemExit) as stopped:
        entry.main(["--hami-change", "quadratic"])
    assert stopped.value.code == 2
    assert "invalid choice: 'quadratic'" in capsys.readouterr().err
