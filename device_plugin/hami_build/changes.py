"""The changes the plugin image makes to HAMi-core's source before building it, so that `soft` holds its compute
cap (docs/isolation.md); the isolation benchmark measures a build with or without them.

- ``linear-step``: HAMi-core's utilisation watcher (``delta()``) refills a token pool that grows with the SM count
  by a step that grows with its square, so on a GPU of many SMs the limiter swings between no limit and a stall.
  One SM factor dropped: the change proposed upstream (HAMi-core PR #317).
- ``graph-launch``: a CUDA Graph replay launches its kernels inside the driver, where the limiter never sees
  them, and cuGetProcAddress hands out no ``cuGraph*`` hook. Each graph's kernel blocks are summed when it is
  instantiated and charged at each launch (``graph_launch.c``).
- ``live-sm-limit``: a process reads its SM limit from the shared region once, at its start, so the plugin's
  rewrite of the region (a live limit change, or a tampered value put back) reached only processes started
  later; a process started in the instant a tenant had raised it kept the raised cap for its life. The
  watcher now reads the region's limit at each tick (120 ms).
- ``idle-hold`` (a candidate, not in the image until measured): the watcher raised a process's refill in every
  tick its utilisation was under the cap, idle ones too, and its bucket filled to the whole GPU's worth of
  blocks, so a tenant resuming after a pause could run past its cap for seconds. The refill is now raised only
  in a tick where the process waited for tokens, and the bucket holds at most two ticks of it.
- ``share-model`` (a candidate, after ``idle-hold``): a block costs the same whatever it does, so a load of
  short blocks needs many times the refill of one of long blocks for the same share, and the watcher's fixed
  step took tens of seconds to get there. The refill is set from what the last second's refills gave
  (``share_model.c``); a simulation that reproduces the H200's figures of the fixed step settles every load
  within two seconds with it (tests/device_plugin/test_hami_share_model.py).

``IMAGE_CHANGES`` are the ones Dockerfile.plugin makes: those measured to hold, and ``live-sm-limit``, which
changes nothing in steady state.

Each edit must find its anchor exactly once, or the change is refused with the place it did not find: a
HAMi-core whose code moved is not patched blind. The source given is never changed; a copy is.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

HERE = Path(__file__).resolve().parent
LINEAR_STEP: Final = "linear-step"
GRAPH_LAUNCH: Final = "graph-launch"
LIVE_SM_LIMIT: Final = "live-sm-limit"
IDLE_HOLD: Final = "idle-hold"
SHARE_MODEL: Final = "share-model"
WATCHER: Final = Path("src/multiprocess/multiprocess_utilization_watcher.c")
GRAPH: Final = Path("src/cuda/graph.c")
HOOK: Final = Path("src/cuda/hook.c")
VERSIONED: Final = Path("src/include/multi_func_hook.h")
ENTRIES: Final = Path("src/include/libcuda_hook.h")
DLSYM: Final = Path("src/libvgpu.c")
GRAPH_CHARGE: Final = HERE / "graph_launch.c"
SHARE_MODEL_C: Final = HERE / "share_model.c"
CHARGED: Final = ("cuGraphInstantiate", "cuGraphInstantiateWithFlags", "cuGraphLaunch", "cuGraphExecDestroy")
ADDED: Final = "cuGraphInstantiateWithParams"  # not hooked by HAMi-core: an entry in each of its three lists
HANDED_OUT: Final = (*CHARGED[1:], ADDED)  # by cuGetProcAddress: the hooks whose signature never changed
STOCK_BUILD: Final = "stock (the exported source as it is)"
WRITTEN_FOR: Final = (
    "8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811"  # the HAMi-core commit the changes were written and measured on
)


class ChangeError(ValueError):
    """The source is not the one a change was written for: the message says what was found."""


@dataclass(frozen=True, slots=True)
class Edit:
    """One replacement in one file of the source: ``pattern`` must match exactly once."""

    path: Path
    what: str  # what the anchor is, for the message when it is not found once
    pattern: re.Pattern[str]
    replacement: str

    def apply(self, text: str, change: str) -> str:
        found = len(self.pattern.findall(text))
        if found != 1:
            raise ChangeError(
                f"{self.path}: expected {self.what} exactly once, found it {found} times; this HAMi-core is not the "
                f"one the change {change} was written for (leave that change out)"
            )
        return self.pattern.sub(lambda _: self.replacement, text)


def _definition(name: str) -> re.Pattern[str]:
    """A function's whole definition in HAMi-core's style: its signature at a line's start, its closing brace
    alone at another's."""
    return re.compile(rf"^CUresult {name}\(.*?^\}}\n", re.S | re.M)


# The watcher's skip of a device without a cap, as utilization_watcher() writes it (rate_limiter's own test differs).
_UNCAPPED_SKIP = "            if (cached_sm_limit[dev] <= 0 || cached_sm_limit[dev] >= 100) {"
_LIVE_READ = (
    "            /* The region's limit, at every tick: the device plugin rewrites it (the change live-sm-limit). */\n"
    "            cached_sm_limit[dev] = get_current_device_sm_limit(dev);\n"
)
# idle-hold's anchors in the watcher, as HAMi-core writes them, and what each becomes.
_TOTAL_DECLARED = "static volatile int64_t g_total_cuda_cores[CUDA_DEVICE_MAX_COUNT] = {0};\n"
_HOLD_DECLARED = (
    "static volatile int tf_waited[CUDA_DEVICE_MAX_COUNT] = {0}; /* waited for tokens since the last tick */\n"
    "#define TF_BUCKET_TICKS 2 /* the most a process holds: two ticks of its refill */\n"
    "static int64_t tf_bucket(int64_t refill, int device_id) {\n"
    "  int64_t most = refill * TF_BUCKET_TICKS;\n"
    "  return most < g_total_cuda_cores[device_id] ? most : g_total_cuda_cores[device_id];\n"
    "}\n"
)
_WAIT = "        nanosleep(&g_cycle, NULL);\n        goto CHECK;\n"
_CAPPED = (
    "    if (cuda_cores_after > g_total_cuda_cores[device_id]) {\n"
    "      cuda_cores_after = g_total_cuda_cores[device_id];\n"
)
_RAISED = "              share[dev] = delta(cached_sm_limit[dev], userutil[dev], share[dev], dev);\n"
_RAISED_WHEN_WAITED = (
    "              /* Raised only in a tick where the process waited for tokens: no windup while it idles. */\n"
    "              if (__sync_lock_test_and_set(&tf_waited[dev], 0) || userutil[dev] > cached_sm_limit[dev])\n"
    "                  share[dev] = delta(cached_sm_limit[dev], userutil[dev], share[dev], dev);\n"
)
_MODEL_CALL = (
    "              /* The refill from what the last second's refills gave (share-model). */\n"
    "              share[dev] = tf_next_refill(&tf_windows[dev], share[dev], cached_sm_limit[dev], userutil[dev],\n"
    "                                          __sync_lock_test_and_set(&tf_waited[dev], 0),\n"
    "                                          (int64_t)g_sm_num[dev] * g_max_thread_per_sm[dev] * 5 / 2560,\n"
    "                                          g_total_cuda_cores[dev]);\n"
)
_IDLE_HOLD = (
    Edit(
        WATCHER,
        "g_total_cuda_cores's declaration",
        re.compile(f"^{re.escape(_TOTAL_DECLARED)}", re.M),
        _TOTAL_DECLARED + _HOLD_DECLARED,
    ),
    Edit(
        WATCHER,
        "rate_limiter()'s wait for tokens",
        re.compile(re.escape(_WAIT)),
        "        tf_waited[device_id] = 1;\n" + _WAIT,
    ),
    Edit(
        WATCHER,
        "change_token()'s cap at the whole pool",
        re.compile(re.escape(_CAPPED)),
        _CAPPED.replace("g_total_cuda_cores[device_id]", "tf_bucket(delta, device_id)"),
    ),
    Edit(WATCHER, "the watcher's refill update", re.compile(re.escape(_RAISED)), _RAISED_WHEN_WAITED),
)

# The step's two sm_num factors, as delta() writes them: "(int64_t)g_sm_num[device_id] * (int64_t)g_sm_num[device_id] *"
_SQUARED = re.compile(r"\(int64_t\)\s*g_sm_num\[device_id\]\s*\*\s*\(int64_t\)\s*g_sm_num\[device_id\]\s*\*")
_GRAPH_SKIP = 'if (strncmp(symbol, "cuGraph", 7) == 0) {'
_FIND = "void *find_symbols_in_table(const char *symbol) {"
# The last entry of g_func_map, HAMi-core's table of names whose signature changed with a CUDA version.
_LAST_VERSIONED = '{"cuGraphKernelNodeSetParams", 12000, 99999, "cuGraphKernelNodeSetParams_v2"}'
# cuGetProcAddress("cuGraphInstantiate") answers by the version asked: the five-argument form before CUDA 12, the
# three-argument cuGraphInstantiateWithFlags from it on (cudaTypedefs.h: PFN_cuGraphInstantiate).
_INSTANTIATE_VERSIONS = (
    ',\n    {"cuGraphInstantiate", 10000, 11999, "cuGraphInstantiate"},\n'
    '    {"cuGraphInstantiate", 12000, 99999, "cuGraphInstantiateWithFlags"}'
)
_HANDED_OUT = "\n".join(
    [
        "/* The graph hooks that charge launches to the compute limiter (the change graph-launch). */",
        "static int tf_graph_charged(const char *symbol) {",
        *[f'    if (strcmp(symbol, "{name}") == 0) return 1;' for name in HANDED_OUT],
        "    return 0;",
        "}",
        "",
        _FIND,
    ]
)


def _listed(path: Path, line: str) -> Edit:
    """cuGraphInstantiateWithParams listed right after cuGraphInstantiateWithFlags in one of HAMi-core's three lists
    of hooks (``line`` with ``{name}`` where each name goes)."""
    anchor = line.format(name=CHARGED[1])
    return Edit(path, repr(anchor), re.compile(re.escape(anchor)), f"{anchor}\n{line.format(name=ADDED)}")


def _graph_edits() -> tuple[Edit, ...]:
    removed = tuple(
        Edit(GRAPH, f"the pass-through {name}()", _definition(name), "") for name in CHARGED
    )  # before the append below: its own definitions would match too
    appended = Edit(GRAPH, "the file's end", re.compile(r"\Z"), "\n" + GRAPH_CHARGE.read_text())
    skip = Edit(
        HOOK,
        "find_symbols_in_table()'s skip of every cuGraph* symbol",
        re.compile(re.escape(_GRAPH_SKIP)),
        'if (strncmp(symbol, "cuGraph", 7) == 0 && !tf_graph_charged(symbol)) {',
    )
    helper = Edit(HOOK, "find_symbols_in_table()'s definition", re.compile(f"^{re.escape(_FIND)}", re.M), _HANDED_OUT)
    versioned = Edit(
        VERSIONED,
        "g_func_map's last entry (cuGraphKernelNodeSetParams from 12000)",
        re.compile(re.escape(_LAST_VERSIONED)),
        _LAST_VERSIONED + _INSTANTIATE_VERSIONS,
    )
    listed = (
        _listed(ENTRIES, "    CUDA_OVERRIDE_ENUM({name}),"),  # the entry's index ...
        _listed(HOOK, '    {{.name = "{name}"}},'),  # ... and its name, at the same place in the table
        _listed(DLSYM, "    DLSYM_HOOK_FUNC({name});"),  # what dlsym finds
    )
    return (*removed, appended, skip, helper, versioned, *listed)


EDITS: Final[dict[str, tuple[Edit, ...]]] = {
    LINEAR_STEP: (
        Edit(WATCHER, "delta()'s correction step with sm_num twice", _SQUARED, "(int64_t)g_sm_num[device_id] *"),
    ),
    GRAPH_LAUNCH: _graph_edits(),
    LIVE_SM_LIMIT: (
        Edit(
            WATCHER,
            "utilization_watcher()'s skip of a device without a cap",
            re.compile(f"^{re.escape(_UNCAPPED_SKIP)}", re.M),
            _LIVE_READ + _UNCAPPED_SKIP,
        ),
    ),
    IDLE_HOLD: _IDLE_HOLD,
    SHARE_MODEL: (
        Edit(
            WATCHER,
            "idle-hold's bucket (apply idle-hold first)",
            re.compile(re.escape(_HOLD_DECLARED)),
            _HOLD_DECLARED + SHARE_MODEL_C.read_text() + "static tf_window_t tf_windows[CUDA_DEVICE_MAX_COUNT];\n",
        ),
        Edit(
            WATCHER,
            "idle-hold's refill update (apply idle-hold first)",
            re.compile(re.escape(_RAISED_WHEN_WAITED)),
            _MODEL_CALL,
        ),
    ),
}
CHANGES: Final = tuple(EDITS)
IMAGE_CHANGES: Final = (LINEAR_STEP, GRAPH_LAUNCH, LIVE_SM_LIMIT)
DESCRIBED: Final = {
    LINEAR_STEP: "the limiter's correction step linear in the SM count (HAMi-core PR #317's change)",
    GRAPH_LAUNCH: "CUDA Graph launches charged to the limiter (device_plugin/hami_build/graph_launch.c)",
    LIVE_SM_LIMIT: "the SM limit read from the shared region at every watcher tick, not once at start",
    IDLE_HOLD: "the refill raised only while the process waits for tokens, its bucket two ticks of it",
    SHARE_MODEL: "the refill set from what the last second's refills gave (device_plugin/hami_build/share_model.c)",
}


# What graph_launch.c logs (HAMi-core's info and warning lines, on the tenant's stderr).
CHARGED_LINE: Final = "each launch charged"
UNCHARGED_LINE: Final = "was not instantiated through HAMi-core"


def graph_charging(stderr: str) -> dict[str, int] | None:
    """What ``graph-launch`` said in a tenant's log: graphs whose launches it charges, and launches it could not
    (a graph instantiated some other way); None where it said nothing (a build without the change)."""
    charged, uncharged = stderr.count(CHARGED_LINE), stderr.count(UNCHARGED_LINE)
    return {"charged_graphs": charged, "uncharged_warnings": uncharged} if charged or uncharged else None


def in_order(changes: Sequence[str]) -> tuple[str, ...]:
    """Each change named once, in the order they build on each other (share-model edits idle-hold's code)."""
    return tuple(c for c in CHANGES if c in changes)


def describe(changes: Sequence[str]) -> str:
    """The build `soft` runs, as the report names it."""
    if not changes:
        return STOCK_BUILD
    return "changed: " + "; ".join(DESCRIBED[c] for c in changes)


def changed_files(src: Path, changes: Sequence[str]) -> dict[Path, str]:
    """Every file the changes touch, relative to ``src``, with its new text (:class:`ChangeError` when an
    anchor is not there exactly once, a missing file said as such)."""
    texts: dict[Path, str] = {}
    for change in changes:
        for edit in EDITS[change]:
            if edit.path not in texts:
                if not (src / edit.path).exists():
                    raise ChangeError(f"no {src / edit.path}: the change {change} needs it")
                texts[edit.path] = (src / edit.path).read_text()
            texts[edit.path] = edit.apply(texts[edit.path], change)
    return texts


def check_source(src: Path, changes: Sequence[str]) -> str | None:
    """Why ``changes`` cannot be made to this exported source, or None when they can."""
    try:
        changed_files(src, changes)
    except ChangeError as exc:
        return str(exc)
    return None


def with_changes(src: Path, into: Path, changes: Sequence[str]) -> Path:
    """A copy of the exported source at ``into`` (replaced if there) with ``changes`` made; ``into`` returned."""
    texts = changed_files(src, changes)
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(src, into, symlinks=True)
    for path, text in texts.items():
        (into / path).write_text(text)
    return into
