"""The edits to HAMi-core's utilisation watcher (``src/multiprocess/multiprocess_utilization_watcher.c``), the
compute limiter: linear-step, live-sm-limit, and the candidates idle-hold and share-model (``share_model.c``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from device_plugin.hami_build.edit import Edit

WATCHER: Final = Path("src/multiprocess/multiprocess_utilization_watcher.c")
SHARE_MODEL_C: Final = Path(__file__).resolve().parent / "share_model.c"

# The step's two sm_num factors, as delta() writes them: "(int64_t)g_sm_num[device_id] * (int64_t)g_sm_num[device_id] *"
_SQUARED = re.compile(r"\(int64_t\)\s*g_sm_num\[device_id\]\s*\*\s*\(int64_t\)\s*g_sm_num\[device_id\]\s*\*")
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


def _replaced(what: str, anchor: str, becomes: str, *, line_start: bool = False) -> Edit:
    """``anchor``, a literal text of the watcher (at a line's start with ``line_start``), made ``becomes``."""
    return Edit(WATCHER, what, re.compile(("^" if line_start else "") + re.escape(anchor), re.M), becomes)


LINEAR_STEP_EDITS: Final = (
    Edit(WATCHER, "delta()'s correction step with sm_num twice", _SQUARED, "(int64_t)g_sm_num[device_id] *"),
)
LIVE_SM_LIMIT_EDITS: Final = (
    _replaced(
        "utilization_watcher()'s skip of a device without a cap",
        _UNCAPPED_SKIP,
        _LIVE_READ + _UNCAPPED_SKIP,
        line_start=True,
    ),
)
IDLE_HOLD_EDITS: Final = (
    _replaced("g_total_cuda_cores's declaration", _TOTAL_DECLARED, _TOTAL_DECLARED + _HOLD_DECLARED, line_start=True),
    _replaced("rate_limiter()'s wait for tokens", _WAIT, "        tf_waited[device_id] = 1;\n" + _WAIT),
    _replaced(
        "change_token()'s cap at the whole pool",
        _CAPPED,
        _CAPPED.replace("g_total_cuda_cores[device_id]", "tf_bucket(delta, device_id)"),
    ),
    _replaced("the watcher's refill update", _RAISED, _RAISED_WHEN_WAITED),
)
SHARE_MODEL_EDITS: Final = (
    _replaced(
        "idle-hold's bucket (apply idle-hold first)",
        _HOLD_DECLARED,
        _HOLD_DECLARED + SHARE_MODEL_C.read_text() + "static tf_window_t tf_windows[CUDA_DEVICE_MAX_COUNT];\n",
    ),
    _replaced("idle-hold's refill update (apply idle-hold first)", _RAISED_WHEN_WAITED, _MODEL_CALL),
)
