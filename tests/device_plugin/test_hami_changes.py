"""HAMi-core's source changed for the plugin image (the limiter's step linear in SMs, graph launches charged): made
on a copy, refused where an anchor is not there once, and ``python -m device_plugin.hami_build`` as the image's
build stage runs it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import device_plugin.hami_build.__main__ as entry
from device_plugin.hami_build.changes import (
    CHANGES,
    DESCRIBED,
    GRAPH_LAUNCH,
    IDLE_HOLD,
    IMAGE_CHANGES,
    LINEAR_STEP,
    LIVE_SM_LIMIT,
    PINNED_REGION,
    SHARE_MODEL,
    STOCK_BUILD,
    WRITTEN_FOR,
    changed_files,
    check_source,
    describe,
    in_order,
    with_changes,
)
from device_plugin.hami_build.edit import ChangeError
from device_plugin.hami_build.graph_edits import DLSYM, ENTRIES, GRAPH, GRAPH_CHARGE, HOOK, VERSIONED
from device_plugin.hami_build.region_edits import REGION_C
from device_plugin.hami_build.watcher_edits import SHARE_MODEL_C, WATCHER
from vgpu.names import HAMI_REGION_FILE, LIVE_LIMITS_DIR

# The step as delta() writes it (two sm_num factors, then the rest of the product), spacing varied as C allows.
SQUARED_STEP = "(int64_t)g_sm_num[device_id] * (int64_t)g_sm_num[device_id] * rest"
# utilization_watcher()'s skip of an uncapped device, indented as HAMi-core has it.
UNCAPPED_SKIP = (
    "            if (cached_sm_limit[dev] <= 0 || cached_sm_limit[dev] >= 100) {\n                continue;\n"
)
# idle-hold's four places: the pool's declaration, rate_limiter's wait, change_token's cap, the refill's update.
HOLD_ANCHORS = (
    "static volatile int64_t g_total_cuda_cores[CUDA_DEVICE_MAX_COUNT] = {0};\n"
    "        nanosleep(&g_cycle, NULL);\n        goto CHECK;\n"
    "    if (cuda_cores_after > g_total_cuda_cores[device_id]) {\n      cuda_cores_after = g_total_cuda_cores[device_id];\n"
    "              share[dev] = delta(cached_sm_limit[dev], userutil[dev], share[dev], dev);\n"
)
STOCK_WATCHER = f"{HOLD_ANCHORS}int64_t increment = {SQUARED_STEP};\n{UNCAPPED_SKIP}"
LINEAR_WATCHER = f"{HOLD_ANCHORS}int64_t increment = (int64_t)g_sm_num[device_id] * rest;\n{UNCAPPED_SKIP}"
PASS_THROUGH = 'CUresult {name}({args}) {{\n\tLOG_DEBUG("{name}");\n\treturn CUDA_OVERRIDE_CALL(x,{name},y);\n}}\n\n'
GRAPH_TEXT = "".join(
    PASS_THROUGH.format(name=name, args=args)
    for name, args in (
        ("cuGraphDestroyNode", "CUgraphNode hNode"),
        ("cuGraphInstantiate", "CUgraphExec *e, CUgraph g, CUgraphNode *n, char *l, size_t s"),
        ("cuGraphInstantiateWithFlags", "CUgraphExec *e, CUgraph g, unsigned long long f"),
        ("cuGraphUpload", "CUgraphExec e, CUstream s"),
        ("cuGraphLaunch", "CUgraphExec e, CUstream s"),
        ("cuGraphExecDestroy", "CUgraphExec e"),
        ("cuGraphDestroy", "CUgraph g"),
    )
)
HOOK_TEXT = (
    'cuda_entry_t cuda_library_entry[] = {\n    {.name = "cuGraphInstantiateWithFlags"},\n    {.name = "cuGraphUpload"},\n};\n'
    "void *find_symbols_in_table(const char *symbol) {\n"
    '    if (strncmp(symbol, "cuGraph", 7) == 0) {\n        return NULL;\n    }\n    return lookup(symbol);\n}\n'
)
VERSIONED_TEXT = (
    "static CudaFuncMapEntry g_func_map[] = {\n"
    '    {"cuGraphKernelNodeSetParams", 12000, 99999, "cuGraphKernelNodeSetParams_v2"}\n};\n'
)


REGION_TEXT = (  # try_create_shrreg() and set_env_utilization_switch() as HAMi-core 8f3a89c writes them
    '    utilization_env = getenv("GPU_CORE_UTILIZATION_POLICY");\n    if (utilization_env!=NULL){\n'
    '        if ((strcmp(utilization_env,"FORCE") ==0 ) || (strcmp(utilization_env,"force") ==0))\n'
    "            return 1;\n"
    '        if ((strcmp(utilization_env,"DISABLE") ==0 ) || (strcmp(utilization_env,"disable") ==0 ))\n'
    "            return 2;\n    }\n"
    "    char* shr_reg_file = getenv(MULTIPROCESS_SHARED_REGION_CACHE_ENV);\n    if (shr_reg_file == NULL) {\n"
)


def hami_tree(root: Path, watcher_text: str | None = STOCK_WATCHER) -> Path:
    """An exported source shaped as HAMi-core's where the changes edit it (no watcher with None)."""
    files = {
        DLSYM: "    DLSYM_HOOK_FUNC(cuGraphInstantiateWithFlags);\n    DLSYM_HOOK_FUNC(cuGraphUpload);\n",
        ENTRIES: "    CUDA_OVERRIDE_ENUM(cuGraphInstantiateWithFlags),\n    CUDA_OVERRIDE_ENUM(cuGraphUpload),\n",
        GRAPH: GRAPH_TEXT,
        HOOK: HOOK_TEXT,
        VERSIONED: VERSIONED_TEXT,
        REGION_C: REGION_TEXT,
    }
    if watcher_text is not None:
        files[WATCHER] = watcher_text
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


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
def test_linear_step_drops_one_sm_num_factor_and_keeps_the_rest(tmp_path: Path, step: str, linear: str) -> None:
    src = hami_tree(tmp_path, f"int64_t increment =\n      {step} / 2560;\nint other = g_sm_num[device_id] * 2;\n")
    assert changed_files(src, [LINEAR_STEP]) == {
        WATCHER: f"int64_t increment =\n      {linear} / 2560;\nint other = g_sm_num[device_id] * 2;\n"
    }


def test_live_sm_limit_reads_the_region_at_every_tick_before_the_uncapped_skip(tmp_path: Path) -> None:
    read = "            cached_sm_limit[dev] = get_current_device_sm_limit(dev);\n"
    both = changed_files(hami_tree(tmp_path), [LINEAR_STEP, LIVE_SM_LIMIT])[WATCHER]
    assert both.startswith(f"{HOLD_ANCHORS}int64_t increment = (int64_t)g_sm_num[device_id] * rest;\n            /*")
    assert both.endswith(f"{read}{UNCAPPED_SKIP}")
    # rate_limiter()'s own test of the cache is written otherwise, and a source without the skip is refused.
    rate_limiter = "  if (cached_sm_limit[device_id] >= 100 || cached_sm_limit[device_id] == 0) {\n"
    assert "found it 0 times" in (check_source(hami_tree(tmp_path / "r", rate_limiter), [LIVE_SM_LIMIT]) or "")
    twice = hami_tree(tmp_path / "t", UNCAPPED_SKIP * 2)
    assert "found it 2 times" in (check_source(twice, [LIVE_SM_LIMIT]) or "")


def test_share_model_replaces_idle_holds_update_with_the_model_and_needs_it(tmp_path: Path) -> None:
    both = changed_files(hami_tree(tmp_path), [IDLE_HOLD, SHARE_MODEL])[WATCHER]
    model = SHARE_MODEL_C.read_text()
    assert f"  return most < g_total_cuda_cores[device_id] ? most : g_total_cuda_cores[device_id];\n}}\n{model}" in both
    assert f"{model}static tf_window_t tf_windows[CUDA_DEVICE_MAX_COUNT];\n" in both
    assert (
        "              share[dev] = tf_next_refill(&tf_windows[dev], share[dev], cached_sm_limit[dev], userutil[dev],\n"
        "                                          __sync_lock_test_and_set(&tf_waited[dev], 0),\n"
    ) in both
    assert "share[dev] = delta(" not in both
    assert "idle-hold's bucket (apply idle-hold first) exactly once, found it 0 times" in (
        check_source(hami_tree(tmp_path / "alone"), [SHARE_MODEL]) or ""
    )
    assert in_order([SHARE_MODEL, LINEAR_STEP, IDLE_HOLD, SHARE_MODEL]) == (LINEAR_STEP, IDLE_HOLD, SHARE_MODEL)


def test_idle_hold_raises_the_refill_only_after_a_wait_and_bounds_the_bucket(tmp_path: Path) -> None:
    held = changed_files(hami_tree(tmp_path), [IDLE_HOLD])[WATCHER]
    assert held.startswith(
        "static volatile int64_t g_total_cuda_cores[CUDA_DEVICE_MAX_COUNT] = {0};\n"
        "static volatile int tf_waited[CUDA_DEVICE_MAX_COUNT] = {0};"
    )
    assert "  int64_t most = refill * TF_BUCKET_TICKS;\n" in held
    assert "        tf_waited[device_id] = 1;\n        nanosleep(&g_cycle, NULL);\n        goto CHECK;\n" in held
    assert (
        "    if (cuda_cores_after > tf_bucket(delta, device_id)) {\n      cuda_cores_after = tf_bucket(delta, device_id);\n"
    ) in held
    assert (
        "              if (__sync_lock_test_and_set(&tf_waited[dev], 0) || userutil[dev] > cached_sm_limit[dev])\n"
        "                  share[dev] = delta(cached_sm_limit[dev], userutil[dev], share[dev], dev);\n"
    ) in held
    assert "cuda_cores_after = g_total_cuda_cores" not in held
    # Each place must be there once: a watcher without rate_limiter's wait is refused, naming it.
    moved = hami_tree(tmp_path / "moved", STOCK_WATCHER.replace("nanosleep(&g_cycle", "usleep(&g_cycle"))
    assert "rate_limiter()'s wait for tokens exactly once, found it 0 times" in (check_source(moved, [IDLE_HOLD]) or "")
    assert check_source(moved, [LINEAR_STEP, LIVE_SM_LIMIT]) is None


@pytest.mark.parametrize(
    ("text", "found"), [("increment = sm * sm * threads;", 0), (f"{SQUARED_STEP}; {SQUARED_STEP};", 2)]
)
def test_a_limiter_written_otherwise_is_not_patched_blind(tmp_path: Path, text: str, found: int) -> None:
    with pytest.raises(ChangeError, match=f"{WATCHER}: .* found it {found} times.*the change linear-step"):
        changed_files(hami_tree(tmp_path, text), [LINEAR_STEP])


def test_graph_launch_swaps_the_four_pass_throughs_for_the_charging_hooks(tmp_path: Path) -> None:
    texts = changed_files(hami_tree(tmp_path), [GRAPH_LAUNCH])
    graph = texts[GRAPH]
    kept, added = graph.split(GRAPH_CHARGE.read_text().splitlines()[0])
    # The pass-throughs it replaces are gone; the others are kept, in order.
    assert [line.split("(")[0] for line in kept.splitlines() if line.startswith("CUresult")] == [
        "CUresult cuGraphDestroyNode",
        "CUresult cuGraphUpload",
        "CUresult cuGraphDestroy",
    ]
    assert graph.endswith(GRAPH_CHARGE.read_text())
    assert "CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {" in added
    # cuGetProcAddress hands out the three hooks whose signature never changed, and "cuGraphInstantiate" by version.
    assert texts[HOOK].index("static int tf_graph_charged") < texts[HOOK].index("void *find_symbols_in_table")
    assert 'if (strncmp(symbol, "cuGraph", 7) == 0 && !tf_graph_charged(symbol)) {' in texts[HOOK]
    for name in ("cuGraphInstantiateWithFlags", "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphInstantiateWithParams"):
        assert f'if (strcmp(symbol, "{name}") == 0) return 1;' in texts[HOOK]
    # cuGraphInstantiateWithParams joins HAMi-core's hooks: its index, its name at that index, what dlsym finds.
    assert texts[ENTRIES] == (
        "    CUDA_OVERRIDE_ENUM(cuGraphInstantiateWithFlags),\n    CUDA_OVERRIDE_ENUM(cuGraphInstantiateWithParams),\n"
        "    CUDA_OVERRIDE_ENUM(cuGraphUpload),\n"
    )
    assert texts[HOOK].startswith(
        'cuda_entry_t cuda_library_entry[] = {\n    {.name = "cuGraphInstantiateWithFlags"},\n'
        '    {.name = "cuGraphInstantiateWithParams"},\n    {.name = "cuGraphUpload"},\n};\n'
    )
    assert texts[DLSYM] == (
        "    DLSYM_HOOK_FUNC(cuGraphInstantiateWithFlags);\n    DLSYM_HOOK_FUNC(cuGraphInstantiateWithParams);\n"
        "    DLSYM_HOOK_FUNC(cuGraphUpload);\n"
    )
    assert 'strcmp(symbol, "cuGraphInstantiate")' not in texts[HOOK]
    assert texts[VERSIONED] == (
        "static CudaFuncMapEntry g_func_map[] = {\n"
        '    {"cuGraphKernelNodeSetParams", 12000, 99999, "cuGraphKernelNodeSetParams_v2"},\n'
        '    {"cuGraphInstantiate", 10000, 11999, "cuGraphInstantiate"},\n'
        '    {"cuGraphInstantiate", 12000, 99999, "cuGraphInstantiateWithFlags"}\n};\n'
    )


@pytest.mark.parametrize(
    ("path", "text", "said"),
    [
        (
            GRAPH,
            GRAPH_TEXT.replace("cuGraphLaunch(", "cuGraphLaunchX("),
            "the pass-through cuGraphLaunch() exactly once",
        ),
        (HOOK, HOOK_TEXT.replace('"cuGraph", 7', '"cuGraph", 8'), "skip of every cuGraph* symbol exactly once"),
        (VERSIONED, "static CudaFuncMapEntry g_func_map[] = {};\n", "g_func_map's last entry"),
        (ENTRIES, "", "'    CUDA_OVERRIDE_ENUM(cuGraphInstantiateWithFlags),' exactly once"),
    ],
)
def test_graph_launch_on_code_that_moved_says_where(tmp_path: Path, path: Path, text: str, said: str) -> None:
    src = hami_tree(tmp_path)
    (src / path).write_text(text)
    assert said in (check_source(src, [GRAPH_LAUNCH]) or "")
    assert check_source(src, [LINEAR_STEP]) is None  # the other change does not need that file


def test_pinned_region_takes_the_plugins_region_where_it_is_mounted_and_drops_the_off_switch(tmp_path: Path) -> None:
    text = (with_changes(hami_tree(tmp_path / "export"), tmp_path / "changed", [PINNED_REGION]) / REGION_C).read_text()
    assert text.count("getenv(MULTIPROCESS_SHARED_REGION_CACHE_ENV)") == 1  # only where the directory is not there
    assert f'stat("{LIVE_LIMITS_DIR}", &tf_limits_dir) == 0 && S_ISDIR(tf_limits_dir.st_mode)' in text
    assert f'? "{LIVE_LIMITS_DIR}/{HAMI_REGION_FILE}"' in text
    assert '"DISABLE"' not in text and "return 2;" not in text and '"FORCE"' in text and "return 1;" in text
    moved = hami_tree(tmp_path / "moved")
    (moved / REGION_C).write_text(REGION_TEXT.replace("shr_reg_file = getenv", "shr_reg_file = secure_getenv"))
    assert "try_create_shrreg()'s region path from the environment exactly once, found it 0 times" in (
        check_source(moved, [PINNED_REGION]) or ""
    )


def test_the_copy_has_the_changes_and_the_export_is_untouched(tmp_path: Path) -> None:
    src = hami_tree(tmp_path / "export")
    before = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    copy = with_changes(src, tmp_path / "work" / "changed", [LINEAR_STEP, GRAPH_LAUNCH])
    assert (copy / WATCHER).read_text() == LINEAR_WATCHER
    assert (copy / GRAPH).read_text().endswith(GRAPH_CHARGE.read_text())
    assert (copy / "src" / "libvgpu.c").exists()
    assert {p: p.read_bytes() for p in src.rglob("*") if p.is_file()} == before
    # A second run replaces the copy, it does not change it twice.
    assert with_changes(src, copy, [LINEAR_STEP, GRAPH_LAUNCH]) == copy
    assert (copy / GRAPH).read_text().count("tf_graph_blocks(CUgraph graph, int depth) {") == 1


def test_check_source_says_why_it_cannot_change_it(tmp_path: Path) -> None:
    assert check_source(hami_tree(tmp_path / "a"), [LINEAR_STEP, GRAPH_LAUNCH]) is None
    assert f"no {tmp_path / 'b' / WATCHER}" in (check_source(hami_tree(tmp_path / "b", None), [LINEAR_STEP]) or "")
    assert "found it 0 times" in (check_source(hami_tree(tmp_path / "c", "x = y;"), [LINEAR_STEP]) or "")


def test_the_report_names_the_build() -> None:
    assert describe(()) == STOCK_BUILD
    assert describe((LINEAR_STEP, GRAPH_LAUNCH)) == (
        "changed: the limiter's correction step linear in the SM count (HAMi-core PR #317's change); CUDA Graph "
        "launches charged to the limiter (device_plugin/hami_build/graph_launch.c)"
    )


def test_the_build_stage_command_makes_the_changed_copy_and_refuses_what_it_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = hami_tree(tmp_path / "export")
    into = tmp_path / "changed"
    assert entry.main([str(src), str(into), "graph-launch", "linear-step", "linear-step"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{c}: {DESCRIBED[c]}" for c in (LINEAR_STEP, GRAPH_LAUNCH)]
    assert (into / WATCHER).read_text() == LINEAR_WATCHER
    assert (into / GRAPH).read_text().endswith(GRAPH_CHARGE.read_text())
    assert entry.main([str(src), str(tmp_path / "stock")]) == 0  # no change named: a stock copy
    assert (tmp_path / "stock" / WATCHER).read_text() == (src / WATCHER).read_text()
    moved = hami_tree(tmp_path / "moved", "x = y;")
    for argv, said in (
        ([str(src), str(into), "quadratic"], "unknown change quadratic: the changes are linear-step, graph-launch"),
        ([str(tmp_path / "none"), str(into)], "is not a directory: give HAMi-core's exported source"),
        ([str(moved), str(tmp_path / "m"), "linear-step"], "found it 0 times; this HAMi-core is not the one"),
    ):
        with pytest.raises(SystemExit) as stopped:
            entry.main(argv)
        assert stopped.value.code == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "m").exists()  # nothing half-made where a change was refused


def test_the_plugin_image_builds_hami_core_with_every_change_at_the_source_they_were_written_for() -> None:
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile.plugin").read_text()
    args = dict(re.findall(r"^ARG (\w+)=\"?([^\"\n]*)\"?$", dockerfile, re.M))
    assert args["HAMI_CHANGES"].split() == list(IMAGE_CHANGES)
    assert IDLE_HOLD in CHANGES and IDLE_HOLD not in IMAGE_CHANGES  # a candidate until measured
    assert args["HAMI_CORE_REF"] == WRITTEN_FOR
    assert "python -m device_plugin.hami_build /hami-core /hami-core-changed ${HAMI_CHANGES}" in dockerfile
