"""graph_launch.c, compiled against the real cuda.h and a fake driver (hami_graph_harness/): a graph's launch
is charged its kernels' blocks once per launch, every launch still reaches the driver, and what it cannot cost
(an exec it never saw, a full table) is launched uncharged and said once."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from device_plugin.hami_build.graph_edits import CHARGED_LINE, GRAPH_CHARGE, UNCHARGED_LINE, graph_charging

HARNESS = Path(__file__).parent / "hami_graph_harness"
MIXED_BLOCKS = 132 * 4 + 8 * 2 + 5 * 2 + 3  # two kernels, a copy, a child graph's kernel and its grandchild's
SLOTS = 4096
INT_MAX = 2**31 - 1


def cuda_include() -> Path:
    """cuda.h's folder, from the nvidia-cuda-runtime-cu12 wheel (a dev dependency)."""
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    assert spec is not None and spec.submodule_search_locations, "pip install -e '.[dev]' (nvidia-cuda-runtime-cu12)"
    return Path(next(iter(spec.submodule_search_locations))) / "include"


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to compile the harness")
    binary = tmp_path_factory.mktemp("harness") / "harness"
    built = subprocess.run(
        [
            "gcc",
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{HARNESS}",
            f"-I{cuda_include()}",
            str(HARNESS / "harness.c"),
            str(GRAPH_CHARGE),
            "-lpthread",
            "-o",
            str(binary),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return binary


def drive(harness: Path, *commands: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Each command's answer, and the lines logged (INFO and WARN)."""
    done = subprocess.run(
        [str(harness)], input="\n".join(commands) + "\n", capture_output=True, text=True, check=True, timeout=60
    )
    return [json.loads(line) for line in done.stdout.splitlines()], done.stderr.splitlines()


def test_each_launch_is_charged_the_blocks_of_every_kernel_in_the_graph(harness: Path) -> None:
    answers, logged = drive(
        harness,
        *("instantiate mixed", "launch 0", "launch 0"),
        *("instantiate-legacy mixed", "launch 1", "instantiate-params mixed", "launch 2", "launch 0"),
    )
    assert [answers[i] for i in (0, 3, 5)] == [{"rc": 0, "exec": e} for e in (0, 1, 2)]
    launches = [answers[i] for i in (1, 2, 4, 6, 7)]
    assert [a["charged"] for a in launches] == [MIXED_BLOCKS] * 5
    assert [a["driver_launches"] for a in launches] == [1, 2, 3, 4, 5]
    assert sum(f"{CHARGED_LINE} {MIXED_BLOCKS} blocks" in line for line in logged) == 3
    # What the isolation benchmark reads of a tenant's log (the report's graph row says it).
    assert graph_charging("\n".join(logged)) == {"charged_graphs": 3, "uncharged_warnings": 0}


@pytest.mark.parametrize(
    ("graph", "charged"),
    [("copies", None), ("huge", INT_MAX), ("deep", 9)],  # deep: the graph and 8 levels of children, of one block each
)
def test_what_a_launch_is_charged_at_the_edges(harness: Path, graph: str, charged: int | None) -> None:
    answers, _ = drive(harness, f"instantiate {graph}", "launch 0")
    assert answers[1] == {"rc": 0, "charged": charged, "driver_launches": 1}


def test_an_exec_it_never_saw_or_destroyed_is_launched_uncharged_and_said_once(harness: Path) -> None:
    answers, logged = drive(
        harness,
        "launch unknown",
        "launch unknown",
        "instantiate mixed",
        "destroy 0",
        "launch 0",
        "instantiate broken",
    )
    assert [a["charged"] for a in (answers[0], answers[1], answers[4])] == [None] * 3
    assert answers[4]["driver_launches"] == 3  # uncharged, never refused
    assert answers[3] == {"rc": 0}
    assert answers[5] == {"rc": 1, "exec": -1}  # the driver's refusal, passed on
    assert len([line for line in logged if UNCHARGED_LINE in line]) == 1
    assert graph_charging("\n".join(logged)) == {"charged_graphs": 1, "uncharged_warnings": 1}
    assert graph_charging("a build without the change logs neither") is None


def test_outside_a_known_container_nothing_is_charged(harness: Path) -> None:
    answers, _ = drive(harness, "instantiate mixed", "pidfound 0", "launch 0", "pidfound 1", "launch 0")
    assert answers[2]["charged"] is None and answers[4]["charged"] == MIXED_BLOCKS


def test_a_full_table_says_so_and_a_destroyed_exec_frees_its_slot(harness: Path) -> None:
    commands = ["instantiate mixed", *["instantiate copies"] * (SLOTS - 1), "instantiate mixed"]  # execs 0..SLOTS
    commands += ["launch 0", f"launch {SLOTS}", "destroy 0", "instantiate mixed", f"launch {SLOTS + 1}"]
    answers, logged = drive(harness, *commands)
    launched = answers[SLOTS + 1 :]
    assert launched[0]["charged"] == MIXED_BLOCKS  # the first still remembered when the table is full
    assert launched[1]["charged"] is None  # the one past the table: launched, uncharged, said
    assert sum(f"{SLOTS} graph execs already remembered" in line for line in logged) == 1
    assert launched[4] == {"rc": 0, "charged": MIXED_BLOCKS, "driver_launches": 3}  # in the slot exec 0 left
