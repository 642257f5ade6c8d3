"""HAMi-core with its compute limiter's correction step linear in the GPU's SM count: `soft`'s candidate fix.

HAMi-core's utilisation watcher (``delta()`` in ``src/multiprocess/multiprocess_utilization_watcher.c``) refills a
token pool that grows with the SM count by a step that grows with its square, so on a GPU of many SMs the limiter
swings between no limit and a stall instead of settling at the cap. ``--hami-step linear`` builds `soft` from a
copy of the exported source with one SM factor dropped (the change proposed upstream, HAMi-core PR #317), so one
command measures it beside the stock build's figures (benchmarks/README.md, "soft with HAMi-core's limiter fixed").
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Final

STOCK: Final = "stock"
LINEAR: Final = "linear"
STEPS: Final = (STOCK, LINEAR)
WATCHER: Final = Path("src/multiprocess/multiprocess_utilization_watcher.c")
DESCRIBED: Final = {
    STOCK: "stock (the exported source as it is)",
    LINEAR: "correction step linear in the SM count (HAMi-core PR #317's change, applied by the benchmark)",
}

# The step's two sm_num factors, as delta() writes them: "(int64_t)g_sm_num[device_id] * (int64_t)g_sm_num[device_id] *"
_SQUARED = re.compile(r"\(int64_t\)\s*g_sm_num\[device_id\]\s*\*\s*\(int64_t\)\s*g_sm_num\[device_id\]\s*\*")
_LINEAR = "(int64_t)g_sm_num[device_id] *"


class StepError(ValueError):
    """The source is not the one the change was written for: the message says what was found."""


def linear_step(text: str) -> str:
    """The watcher's source with one ``sm_num`` factor dropped from its correction step; the step must be there
    exactly once (else :class:`StepError`: a HAMi-core whose limiter changed is not patched blind)."""
    found = len(_SQUARED.findall(text))
    if found != 1:
        raise StepError(
            f"{WATCHER}: expected delta()'s correction step with sm_num twice exactly once, found it {found} times; "
            "this HAMi-core's limiter is not the one --hami-step linear changes (run it with --hami-step stock)"
        )
    return _SQUARED.sub(_LINEAR, text)


def check_source(src: Path) -> str | None:
    """Why ``--hami-step linear`` cannot change this exported source, or None when it can."""
    watcher = src / WATCHER
    if not watcher.exists():
        return f"no {watcher}"
    try:
        linear_step(watcher.read_text())
    except StepError as exc:
        return str(exc)
    return None


def with_linear_step(src: Path, into: Path) -> Path:
    """A copy of the exported source at ``into`` (replaced if there) with the linear step; ``into`` returned."""
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(src, into, symlinks=True)
    watcher = into / WATCHER
    watcher.write_text(linear_step(watcher.read_text()))
    return into
