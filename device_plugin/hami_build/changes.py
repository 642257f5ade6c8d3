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
- ``pinned-region``: a process of the pod could start another with a region of its own, which the
  plugin's guard does not watch, or with the limiter switched off (``GPU_CORE_UTILIZATION_POLICY=disable``).
  Wherever the plugin's live-limits directory is mounted, the region is now the one in it, and ``disable`` is
  not honoured (``region_edits.py``).

``IMAGE_CHANGES`` are the ones Dockerfile.plugin makes: those measured to hold, and ``live-sm-limit`` and
``pinned-region``, which change nothing in steady state (where the limits and region are the plugin's).

Each edit must find its anchor exactly once, or the change is refused with the place it did not find: a
HAMi-core whose code moved is not patched blind. The source given is never changed; a copy is.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from device_plugin.hami_build.edit import ChangeError, Edit
from device_plugin.hami_build.graph_edits import graph_edits
from device_plugin.hami_build.region_edits import PINNED_REGION_EDITS
from device_plugin.hami_build.watcher_edits import (
    IDLE_HOLD_EDITS,
    LINEAR_STEP_EDITS,
    LIVE_SM_LIMIT_EDITS,
    SHARE_MODEL_EDITS,
)

LINEAR_STEP: Final = "linear-step"
GRAPH_LAUNCH: Final = "graph-launch"
LIVE_SM_LIMIT: Final = "live-sm-limit"
IDLE_HOLD: Final = "idle-hold"
SHARE_MODEL: Final = "share-model"
PINNED_REGION: Final = "pinned-region"
STOCK_BUILD: Final = "stock (the exported source as it is)"
WRITTEN_FOR: Final = (
    "8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811"  # the HAMi-core commit the changes were written and measured on
)
EDITS: Final[dict[str, tuple[Edit, ...]]] = {  # in the order they build on each other
    LINEAR_STEP: LINEAR_STEP_EDITS,
    GRAPH_LAUNCH: graph_edits(),
    LIVE_SM_LIMIT: LIVE_SM_LIMIT_EDITS,
    IDLE_HOLD: IDLE_HOLD_EDITS,
    SHARE_MODEL: SHARE_MODEL_EDITS,
    PINNED_REGION: PINNED_REGION_EDITS,
}
CHANGES: Final = tuple(EDITS)
IMAGE_CHANGES: Final = (LINEAR_STEP, GRAPH_LAUNCH, LIVE_SM_LIMIT, PINNED_REGION)
DESCRIBED: Final = {
    LINEAR_STEP: "the limiter's correction step linear in the SM count (HAMi-core PR #317's change)",
    GRAPH_LAUNCH: "CUDA Graph launches charged to the limiter (device_plugin/hami_build/graph_launch.c)",
    LIVE_SM_LIMIT: "the SM limit read from the shared region at every watcher tick, not once at start",
    IDLE_HOLD: "the refill raised only while the process waits for tokens, its bucket two ticks of it",
    SHARE_MODEL: "the refill set from what the last second's refills gave (device_plugin/hami_build/share_model.c)",
    PINNED_REGION: "the region the plugin's mounted one and the limiter's off switch ignored, whatever the environment",
}


def in_order(changes: Sequence[str]) -> tuple[str, ...]:
    """Each change named once, in the order they build on each other (share-model edits idle-hold's code)."""
    return tuple(c for c in CHANGES if c in changes)


def describe(changes: Sequence[str]) -> str:
    """The build `soft` runs, as the report names it."""
    if not changes:
        return STOCK_BUILD
    return "changed: " + "; ".join(DESCRIBED[c] for c in changes)


def changed_files(src: Path, changes: Sequence[str]) -> dict[Path, str]:
    """Every file the changes touch, relative to ``src``, with its new text, the changes made in the order they
    build on each other (:class:`ChangeError` when an anchor is not there exactly once, a missing file said as
    such)."""
    texts: dict[Path, str] = {}
    for change in in_order(changes):
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
