"""The edits to how HAMi-core finds its region and its limiter's switch (``src/multiprocess/
multiprocess_memory_limit.c``): the candidate pinned-region, which keeps a process of the pod under the pod's
limits whatever environment it was started with.

HAMi-core takes its region's path from ``CUDA_DEVICE_MEMORY_SHARED_CACHE`` and turns its compute limiter off for
``GPU_CORE_UTILIZATION_POLICY=disable``, both read from the process's own environment. The device plugin sets
both and the pod's spec cannot override them (docs/security.md), but a process of the pod can start another
with a region of its own, which the plugin's guard does not watch, and raised limits in it, or with the
limiter off. With this change, wherever the plugin's live-limits directory is mounted, the region is the one
in it, and ``disable`` is not honoured."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from device_plugin.hami_build.edit import Edit
from vgpu.names import HAMI_REGION_FILE, LIVE_LIMITS_DIR

REGION_C: Final = Path("src/multiprocess/multiprocess_memory_limit.c")
PINNED_REGION: Final = f"{LIVE_LIMITS_DIR}/{HAMI_REGION_FILE}"

_PATH_FROM_ENV = "    char* shr_reg_file = getenv(MULTIPROCESS_SHARED_REGION_CACHE_ENV);\n"
_PATH_PINNED = (
    "    /* The device plugin's region wherever its live-limits directory is mounted: a process's environment\n"
    "     * cannot point HAMi-core at a region of its own, which the plugin does not guard (pinned-region). */\n"
    "    struct stat tf_limits_dir;\n"
    f'    char* shr_reg_file = stat("{LIVE_LIMITS_DIR}", &tf_limits_dir) == 0 && S_ISDIR(tf_limits_dir.st_mode)\n'
    f'                             ? "{PINNED_REGION}"\n'
    "                             : getenv(MULTIPROCESS_SHARED_REGION_CACHE_ENV);\n"
)
_OFF_SWITCH = (
    '        if ((strcmp(utilization_env,"DISABLE") ==0 ) || (strcmp(utilization_env,"disable") ==0 ))\n'
    "            return 2;\n"
)
_NO_OFF_SWITCH = (
    "        /* \"disable\" is not honoured: the limiter is the pod's, not its processes' (pinned-region). */\n"
)


def _replaced(what: str, anchor: str, becomes: str) -> Edit:
    return Edit(REGION_C, what, re.compile(re.escape(anchor)), becomes)


PINNED_REGION_EDITS: Final = (
    _replaced("try_create_shrreg()'s region path from the environment", _PATH_FROM_ENV, _PATH_PINNED),
    _replaced("set_env_utilization_switch()'s disable", _OFF_SWITCH, _NO_OFF_SWITCH),
)
