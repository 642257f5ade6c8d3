"""A tenant cannot lift its own limits through the live-limits directory (docs/security.md, "Tampering with live
limits"): every vector a container could use on its ``limits.json`` or HAMi-core's region is put back by the
plugin's next look, or reset and reported where it cannot be; HAMi-core's own legitimate states are left alone;
change notifications make a replaced ``limits.json`` come back well under a second.

The tenant writes as it could from inside the container: the region through a shared mapping (as HAMi-core does,
which raises no change notification) or ``write(2)``, ``limits.json`` by replacing, rewriting, linking."""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import stat
import struct
import time
from pathlib import Path

import pytest

from device_plugin.enforcement import hami_region
from device_plugin.enforcement.envs import Target
from device_plugin.enforcement.hami_region import MAGIC, REGION_SIZE, Action, Kind, Look, Seen, decide
from device_plugin.enforcement.live_files import LiveLimits
from device_plugin.enforcement.live_limits import GpuLimit, Tamper, Wanted, document
from device_plugin.enforcement.live_watch import DirWatch
from device_plugin.gpus.slices import slice_id
from device_plugin.metrics import PluginMetrics
from tests.device_plugin.fakes import GIB, GPU0, FakeKube, allocation, gpu_file, grant, make_pod, uid_of
from tests.device_plugin.hami_layout import SharedRegion, initialised, write_region
from tests.device_plugin.harness import plugin, run, until
from vgpu.contract.allocation import decode
from vgpu.names import HAMI_REGION_FILE, LIVE_LIMITS_FILE, EnforcementBackend, SystemAnnotation

UID = "00000000-0000-4000-8000-00000000beef"
TARGET = Target(namespace="default", pod="p", container="main")
LIMIT = GpuLimit(GPU0, 31_200, 10, 2 * GIB)
WANT = Wanted("default", "p", (LIMIT,))
SLOT = (2 * GIB, 10)  # what the region must hold for WANT
KEY = (UID, "main")
STAMP = "2026-11-22T04:00:00Z"
LIFTED = 64 * GIB


def keeper(root: Path, metrics: PluginMetrics | None = None, **kw: object) -> LiveLimits:
    return LiveLimits(
        root, EnforcementBackend.HAMI_CORE, metrics or PluginMetrics(), clock=lambda: STAMP, watch=False, **kw
    )  # type: ignore[arg-type]


def prepared(tmp_path: Path, metrics: PluginMetrics | None = None, **kw: object) -> tuple[LiveLimits, Path]:
    """A container prepared at Allocate whose first CUDA call initialised its region, seen by one pass."""
    live = keeper(tmp_path / "limits", metrics, **kw)
    live.prepare(TARGET, UID, decode(allocation(UID, gpus=[grant(GPU0, tflops=31_200, vram=2 * GIB)])))
    home = tmp_path / "limits" / UID / "main"
    write_region(home / HAMI_REGION_FILE, initialised([SLOT]))
    assert live.sync({KEY: WANT}, frozenset({UID})) == []
    return live, home


def tamper_counted(metrics: PluginMetrics) -> float:
    sample = metrics.registry.get_sample_value("tf_device_plugin_errors_total", {"where": "live_limits_tamper"})
    return sample or 0.0


def store(path: Path, offset: int, fmt: str, value: int) -> None:
    """One store through a shared mapping, as a process of the container writes the region (the close of the
    file, not the store, raises a change notification; only the passes use it here)."""
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, REGION_SIZE, mmap.MAP_SHARED) as mapped:
            struct.pack_into(fmt, mapped, offset, value)
    finally:
        os.close(fd)


def region(path: Path) -> SharedRegion:
    return SharedRegion.from_buffer_copy(path.read_bytes())


def header_and_slot(path: Path) -> tuple[int, int, int, int, int]:
    r = region(path)
    return r.initialized_flag, r.major_version, r.minor_version, r.limit[0], r.sm_limit[0]


FLAG, MINOR = SharedRegion.initialized_flag.offset, SharedRegion.minor_version.offset
LIMIT0 = SharedRegion.limit.offset


# --- HAMi-core's region: restored whatever its header says, once initialised ----------------------------------


@pytest.mark.parametrize(
    ("header", "kind"),
    [
        ((), "slots"),
        (((FLAG, "=i", 0),), "flag"),  # cleared: the plugin before this change never wrote it again
        (((MINOR, "=I", 1),), "version"),  # 1.1: likewise
    ],
    ids=["slot-only", "slot-and-cleared-flag", "slot-and-version-1.1"],
)
def test_a_lifted_limit_is_restored_with_the_header_it_was_written_with(
    tmp_path: Path, header: tuple[tuple[int, str, int], ...], kind: str
) -> None:
    metrics = PluginMetrics()
    live, home = prepared(tmp_path, metrics)
    path = home / HAMI_REGION_FILE
    before = path.read_bytes()
    inode = path.stat().st_ino
    store(path, LIMIT0, "=Q", LIFTED)
    for offset, fmt, value in header:
        store(path, offset, fmt, value)
    assert header_and_slot(path)[3] == LIFTED

    (found,) = live.sync({KEY: WANT}, frozenset({UID}))

    assert header_and_slot(path) == (MAGIC, 1, 2, *SLOT)
    assert path.read_bytes() == before and path.stat().st_ino == inode  # every other byte as HAMi-core left it
    assert (found.target, found.kind, found.restored) == (HAMI_REGION_FILE, kind, True)
    assert (found.namespace, found.pod, found.uid, found.container) == ("default", "p", UID, "main")
    assert tamper_counted(metrics) == 1
    assert live.sync({KEY: WANT}, frozenset({UID})) == [] and path.read_bytes() == before  # level: nothing more


def test_a_limit_written_with_write2_is_restored_too_and_a_repeat_is_counted_but_reported_once(tmp_path: Path) -> None:
    metrics = PluginMetrics()
    live, home = prepared(tmp_path, metrics)
    path = home / HAMI_REGION_FILE
    for _ in range(2):
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, struct.pack("=iII", 0, 1, 1) + bytes(4), 0)
        os.pwrite(fd, struct.pack("=Q", LIFTED), LIMIT0)
        os.close(fd)
        found = live.sync({KEY: WANT}, frozenset({UID}))
        assert header_and_slot(path) == (MAGIC, 1, 2, *SLOT)
    assert [t.kind for t in found] == []  # the second time: counted and logged, not reported again
    assert tamper_counted(metrics) == 2


def test_a_truncated_region_is_reported_counted_and_reset_to_an_empty_file_hami_core_initialises_again(
    tmp_path: Path,
) -> None:
    metrics = PluginMetrics()
    live, home = prepared(tmp_path, metrics)
    path = home / HAMI_REGION_FILE
    inode = path.stat().st_ino
    os.truncate(path, 4096)  # what the container's processes map past here is gone: not restorable

    (found,) = live.sync({KEY: WANT}, frozenset({UID}))

    assert (found.kind, found.restored) == ("truncated", False)
    assert "truncated to 4096 bytes" in found.message() and "made it an empty regular file" in found.message()
    assert tamper_counted(metrics) == 1
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_size == 0 and stat.S_IMODE(st.st_mode) == 0o666
    assert st.st_ino == inode  # in place: every process of the container shares what HAMi-core makes of it next
    assert live.sync({KEY: WANT}, frozenset({UID})) == []  # empty: waiting for HAMi-core, as at Allocate
    # The container's next CUDA process initialises it from its (Allocate-time) environment; the plugin then
    # writes the current limits, and nothing is reported: it is a fresh region.
    write_region(path, initialised([(GIB, 5)]))
    assert live.sync({KEY: WANT}, frozenset({UID})) == []
    assert header_and_slot(path) == (MAGIC, 1, 2, *SLOT)


@pytest.mark.parametrize("planted", ["symlink", "directory", "fifo", "removed", "replaced"])
def test_a_region_removed_or_replaced_is_reported_and_reset_to_an_empty_regular_file(
    tmp_path: Path, planted: str
) -> None:
    live, home = prepared(tmp_path)
    path = home / HAMI_REGION_FILE
    victim = tmp_path / "elsewhere"
    victim_bytes = write_region(victim, initialised([(LIFTED, 100)]))
    held = os.open(path, os.O_RDONLY)  # a process of the container still maps the old file: its inode stays taken
    path.unlink()
    if planted == "symlink":
        path.symlink_to(victim)
    elif planted == "directory":
        path.mkdir()
        (path / "inside").write_text("x")
    elif planted == "fifo":
        os.mkfifo(path)
    elif planted == "replaced":
        write_region(path, initialised([(LIFTED, 100)]))  # a new file, HAMi-core's header, lifted limits

    (found,) = live.sync({KEY: WANT}, frozenset({UID}))

    kind = {"removed": "removed", "replaced": "replaced"}.get(planted, "not-regular")
    assert (found.kind, found.restored) == (kind, False)
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_size == 0 and stat.S_IMODE(st.st_mode) == 0o666
    assert victim.read_bytes() == victim_bytes  # a link is never followed
    if planted == "directory":  # moved out of the container's reach, into the pod's directory
        (aside,) = [p for p in (home.parent).iterdir() if p.name.startswith(".main.hami.cache.")]
        assert (aside / "inside").read_text() == "x"
    os.close(held)


def test_a_link_planted_before_any_cuda_call_is_replaced_too(tmp_path: Path) -> None:
    """HAMi-core in the container would follow it to a file of the tenant's, out of the plugin's reach."""
    live = keeper(tmp_path / "limits")
    live.prepare(TARGET, UID, decode(allocation(UID, gpus=[grant(GPU0, tflops=31_200, vram=2 * GIB)])))
    path = tmp_path / "limits" / UID / "main" / HAMI_REGION_FILE
    path.unlink()
    path.symlink_to("/tmp/mine")
    (found,) = live.sync({KEY: WANT}, frozenset({UID}))
    assert (found.kind, found.restored) == ("not-regular", False)
    assert stat.S_ISREG(path.lstat().st_mode)


# --- HAMi-core's own states are left alone -------------------------------------------------------------------


def test_before_the_first_cuda_call_the_empty_region_is_left_for_hami_core(tmp_path: Path) -> None:
    live = keeper(tmp_path / "limits")
    live.prepare(TARGET, UID, decode(allocation(UID, gpus=[grant(GPU0, tflops=31_200, vram=2 * GIB)])))
    path = tmp_path / "limits" / UID / "main" / HAMI_REGION_FILE
    for content in (b"", b"\x4e\xfc\x2f\x01", bytes(4096)):  # empty, a few bytes, short
        path.write_bytes(content)
        assert live.sync({KEY: WANT}, frozenset({UID})) == []
        assert path.read_bytes() == content
    path.unlink()  # absent before it was ever initialised: HAMi-core creates it
    assert live.sync({KEY: WANT}, frozenset({UID})) == []
    assert not path.exists()


def test_hami_cores_initialisation_is_not_taken_for_tampering(tmp_path: Path) -> None:
    """HAMi-core makes the file full-size, then stores its header (the flag last) under its lock: a full-size
    file without the header is left alone for the grace, and is ours once the header is there."""
    live = keeper(tmp_path / "limits", init_grace_s=30.0)
    live.prepare(TARGET, UID, decode(allocation(UID, gpus=[grant(GPU0, tflops=31_200, vram=2 * GIB)])))
    path = tmp_path / "limits" / UID / "main" / HAMI_REGION_FILE
    fd = os.open(path, os.O_WRONLY)
    os.pwrite(fd, b"\0", REGION_SIZE)  # try_create_shrreg: one byte past the struct
    os.close(fd)
    assert live.sync({KEY: WANT}, frozenset({UID})) == []
    assert path.read_bytes() == bytes(REGION_SIZE + 1)  # untouched mid-initialisation
    write_region(path, initialised([(GIB, 5)]))  # initialised from the environment (older limits)
    assert live.sync({KEY: WANT}, frozenset({UID})) == []  # new limits written, not a tampering
    assert header_and_slot(path) == (MAGIC, 1, 2, *SLOT)


def test_a_full_size_region_without_the_header_past_the_grace_is_restored(tmp_path: Path) -> None:
    """A plugin restarted after the tenant cleared the flag, or a tenant growing the file before any CUDA call:
    never seen initialised, full-size, no header for longer than HAMi-core ever takes."""
    _live, home = prepared(tmp_path)
    path = home / HAMI_REGION_FILE
    store(path, FLAG, "=i", 0)
    store(path, LIMIT0, "=Q", LIFTED)
    restarted = keeper(tmp_path / "limits", init_grace_s=0.05)
    assert restarted.sync({KEY: WANT}, frozenset({UID})) == []  # could be HAMi-core initialising
    assert header_and_slot(path)[0] == 0
    time.sleep(0.06)
    (found,) = restarted.sync({KEY: WANT}, frozenset({UID}))
    assert (found.kind, found.restored) == ("flag", True)
    assert header_and_slot(path) == (MAGIC, 1, 2, *SLOT)


def test_a_restarted_plugin_takes_a_full_size_region_with_the_header_as_initialised(tmp_path: Path) -> None:
    _live, home = prepared(tmp_path)
    path = home / HAMI_REGION_FILE
    restarted = keeper(tmp_path / "limits")
    assert restarted.sync({KEY: WANT}, frozenset({UID})) == []
    store(path, LIMIT0, "=Q", LIFTED)
    store(path, FLAG, "=i", 0)
    (found,) = restarted.sync({KEY: WANT}, frozenset({UID}))  # no grace: seen initialised since the restart
    assert found.kind == "flag" and header_and_slot(path) == (MAGIC, 1, 2, *SLOT)


FULL = Look(Kind.FILE, (1, 7), REGION_SIZE + 1, (MAGIC, 1, 2), (SLOT,))


@pytest.mark.parametrize(
    ("found", "seen", "action", "kind"),
    [
        (Look(Kind.ABSENT), None, Action.NONE, ""),
        (Look(Kind.ABSENT), Seen((1, 7), True, slots=(SLOT,)), Action.RESET, "removed"),
        (Look(Kind.OTHER, what="a FIFO"), None, Action.RESET, "not-regular"),
        (Look(Kind.FILE, (1, 7), 0), None, Action.NONE, ""),
        (Look(Kind.FILE, (1, 7), 0), Seen((1, 7), False, since=99.0), Action.NONE, ""),
        (Look(Kind.FILE, (1, 7), 4096, (MAGIC, 1, 2)), Seen((1, 7), True, slots=(SLOT,)), Action.RESET, "truncated"),
        (FULL, None, Action.NONE, ""),
        (FULL, Seen((1, 8), True, slots=(SLOT,)), Action.RESET, "replaced"),
        (Look(Kind.FILE, (1, 7), REGION_SIZE, (MAGIC, 1, 2), ((GIB, 5),)), None, Action.WRITE, ""),
        (
            Look(Kind.FILE, (1, 7), REGION_SIZE, (MAGIC, 1, 2), ((GIB, 5),)),
            Seen((1, 7), True, slots=((GIB, 5),)),
            Action.WRITE,
            "",  # the plugin's own previous limits: a change, not a tampering
        ),
        (
            Look(Kind.FILE, (1, 7), REGION_SIZE, (MAGIC, 1, 2), ((LIFTED, 5),)),
            Seen((1, 7), True, slots=(SLOT,)),
            Action.WRITE,
            "slots",
        ),
        (Look(Kind.FILE, (1, 7), REGION_SIZE, (0, 0, 0), (SLOT,)), None, Action.NONE, ""),  # HAMi-core initialising
        (Look(Kind.FILE, (1, 7), REGION_SIZE, (0, 0, 0), (SLOT,)), Seen((1, 7), False, since=99.5), Action.NONE, ""),
        (
            Look(Kind.FILE, (1, 7), REGION_SIZE, (0, 0, 0), (SLOT,)),
            Seen((1, 7), False, since=98.0),
            Action.RESTORE,
            "flag",
        ),
        (
            Look(Kind.FILE, (1, 7), REGION_SIZE, (0, 1, 2), (SLOT,)),
            Seen((1, 7), True, slots=(SLOT,)),
            Action.RESTORE,
            "flag",
        ),
        (
            Look(Kind.FILE, (1, 7), REGION_SIZE, (MAGIC, 1, 1), (SLOT,)),
            Seen((1, 7), True, slots=(SLOT,)),
            Action.RESTORE,
            "version",
        ),
    ],
)
def test_the_region_rules(found: Look, seen: Seen | None, action: Action, kind: str) -> None:
    verdict = decide(found, seen, [SLOT], now=100.0, grace_s=1.0)
    assert (verdict.action, verdict.kind) == (action, kind)
    if action in (Action.WRITE, Action.RESTORE):
        assert verdict.seen == Seen(found.identity, True, slots=(SLOT,))
    if action is Action.RESET:
        assert verdict.seen is None


# --- limits.json: read back every look, rewritten unless it is exactly the plugin's document --------------------


def replace_with(path: Path, text: str) -> None:
    staged = path.with_name(".tenant")
    staged.write_text(text)
    staged.replace(path)


OTHER_LIMITS = document(
    KEY,
    Wanted("default", "p", (GpuLimit(GPU0, 312_000, 100, 80 * GIB),)),
    backend="hami-core",
    generation=9,
    updated_at=STAMP,
)


def test_the_tamper_count_is_exported_at_zero_before_any_tampering(tmp_path: Path) -> None:
    """The alert on its increase (TensorFusionLiveLimitsTampered) sees a node's first tampering only if the series
    was scraped before it, at 0."""
    metrics = PluginMetrics()
    assert metrics.registry.get_sample_value("tf_device_plugin_errors_total", {"where": "live_limits_tamper"}) == 0.0
    live, home = prepared(tmp_path, metrics)
    assert live.sync({KEY: WANT}, frozenset({UID})) == []
    assert tamper_counted(metrics) == 0.0
    replace_with(home / LIVE_LIMITS_FILE, "{not json")
    assert len(live.sync({KEY: WANT}, frozenset({UID}))) == 1
    assert tamper_counted(metrics) == 1.0


@pytest.mark.parametrize(
    ("vector", "kind"),
    [
        ("other-limits", "limits"),
        ("garbage", "garbage"),
        ("huge", "garbage"),
        ("symlink", "not-regular"),
        ("directory", "not-regular"),
        ("removed", "removed"),
        ("edited", "edited"),
        ("chmod", "mode"),
    ],
)
def test_a_tampered_limits_json_is_rewritten_to_exactly_the_document_the_plugin_keeps(
    tmp_path: Path, vector: str, kind: str
) -> None:
    metrics = PluginMetrics()
    live, home = prepared(tmp_path, metrics)
    path = home / LIVE_LIMITS_FILE
    kept = path.read_text()
    victim = tmp_path / "other.json"
    victim.write_text(OTHER_LIMITS)
    if vector == "other-limits":
        replace_with(path, OTHER_LIMITS)
    elif vector == "garbage":
        replace_with(path, "{not json")
    elif vector == "huge":
        replace_with(path, kept + " " * (1 << 17))
    elif vector == "symlink":
        path.unlink()
        path.symlink_to(victim)
    elif vector == "directory":
        path.unlink()
        path.mkdir()
    elif vector == "removed":
        path.unlink()
    elif vector == "edited":
        path.write_text(kept.replace('"name": "p"', '"name": "q"'))
    elif vector == "chmod":
        path.chmod(0o666)

    (found,) = live.sync({KEY: WANT}, frozenset({UID}))

    assert (found.target, found.kind, found.restored) == (LIVE_LIMITS_FILE, kind, True)
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
    assert path.read_text() == kept  # the same document: same generation, same time
    assert json.loads(kept)["generation"] == 1
    assert victim.read_text() == OTHER_LIMITS  # a link is never followed
    assert tamper_counted(metrics) == 1
    assert live.sync({KEY: WANT}, frozenset({UID})) == []


def test_a_restarted_plugin_adopts_its_document_and_still_restores_a_replaced_one(tmp_path: Path) -> None:
    _live, home = prepared(tmp_path)
    path = home / LIVE_LIMITS_FILE
    kept = path.read_text()
    restarted = keeper(tmp_path / "limits")
    restarted._clock = lambda: "2030-01-01T00:00:00Z"  # a later time would show a rewrite
    assert restarted.sync({KEY: WANT}, frozenset({UID})) == [] and path.read_text() == kept
    replace_with(path, OTHER_LIMITS)
    (found,) = restarted.sync({KEY: WANT}, frozenset({UID}))
    assert found.kind == "limits" and path.read_text() == kept


def test_a_real_change_of_limits_is_a_new_generation_not_a_tampering(tmp_path: Path) -> None:
    metrics = PluginMetrics()
    live, home = prepared(tmp_path, metrics)
    raised = Wanted("default", "p", (GpuLimit(GPU0, 62_400, 20, 6 * GIB),))
    assert live.sync({KEY: raised}, frozenset({UID})) == []
    doc = json.loads((home / LIVE_LIMITS_FILE).read_text())
    assert (doc["generation"], doc["gpus"][GPU0]["vramLimitBytes"]) == (2, 6 * GIB)
    assert header_and_slot(home / HAMI_REGION_FILE) == (MAGIC, 1, 2, 6 * GIB, 20)
    assert tamper_counted(metrics) == 0


# --- change notifications --------------------------------------------------------------------------------------


def test_the_directory_watch_names_the_container_whose_files_changed(tmp_path: Path) -> None:
    async def scenario() -> None:
        watch = DirWatch()
        loop = asyncio.get_running_loop()
        watch.attach(loop)
        try:
            (tmp_path / "a").mkdir()
            (tmp_path / "b").mkdir()
            watch.add(("u", "a"), tmp_path / "a")
            watch.add(("u", "b"), tmp_path / "b")
            assert watch.watched() == {("u", "a"), ("u", "b")}
            (tmp_path / "b" / "limits.json").write_text("x")
            await asyncio.wait_for(watch.wait(), 2)
            assert watch.take() == {("u", "b")}
            watch.forget("u")
            assert watch.watched() == frozenset()
        finally:
            watch.detach(loop)
            watch.close()

    run(scenario())


# --- through the plugin: the windows, and the Events ------------------------------------------------------------


def scenario_pod(root: Path) -> tuple[FakeKube, str, Path]:
    pod = make_pod("p", alloc=allocation("pending"))
    uid = uid_of(pod)
    pod["metadata"]["annotations"][SystemAnnotation.ALLOCATION.value] = allocation(
        uid, gpus=[grant(GPU0, tflops=31_200, vram=2 * GIB)]
    )
    return FakeKube([pod]), uid, root / uid / "main"


def test_a_replaced_limits_json_comes_back_within_a_second_on_its_change_notification(tmp_path: Path) -> None:
    """The periodic pass is 30 s away: only the notification can bring it back in time."""
    root = tmp_path / "limits"
    kube, _uid, home = scenario_pod(root)

    async def scenario() -> None:
        overrides = {"backend": EnforcementBackend.HAMI_CORE, "live_limits_dir": str(root), "live_limits_interval": 30}
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), **overrides) as (daemon, kubelet):
            await kubelet.allocate(slice_id(GPU0, 0), pod="p")
            path = home / LIVE_LIMITS_FILE
            kept = path.read_text()
            await asyncio.sleep(0.3)  # the first pass has run and watches the directory
            windows = []
            for text in (OTHER_LIMITS, "{not json"):
                replace_with(path, text)
                began = time.monotonic()
                await until(lambda: path.read_text() == kept, timeout=1.0)
                windows.append(time.monotonic() - began)
            # The region written with write(2) raises a notification too.
            write_region(home / HAMI_REGION_FILE, initialised([SLOT]))
            await asyncio.sleep(0.3)
            fd = os.open(home / HAMI_REGION_FILE, os.O_WRONLY)
            os.pwrite(fd, struct.pack("=Q", LIFTED), LIMIT0)
            os.close(fd)
            await until(lambda: header_and_slot(home / HAMI_REGION_FILE)[3] == SLOT[0], timeout=1.0)
            assert max(windows) < 1.0
            await daemon.node_events.drain()
            reasons = {(e[1], e[3]) for e in kube.pod_events}
            assert reasons == {("p", "LiveLimitsRestored")}
            assert {e[1] for e in kube.node_events} == {"LiveLimitsRestored"}

    run(scenario())


def test_a_truncated_region_is_reported_on_the_pod_and_the_node(tmp_path: Path) -> None:
    root = tmp_path / "limits"
    kube, uid, home = scenario_pod(root)

    async def scenario() -> None:
        overrides = {
            "backend": EnforcementBackend.HAMI_CORE,
            "live_limits_dir": str(root),
            "live_limits_interval": 0.05,
        }
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), **overrides) as (daemon, kubelet):
            await kubelet.allocate(slice_id(GPU0, 0), pod="p")
            path = home / HAMI_REGION_FILE
            write_region(path, initialised([SLOT]))
            await asyncio.sleep(0.3)  # seen initialised
            fd = os.open(path, os.O_RDWR)  # a mapping held open, as a CUDA process holds it: no notification
            with mmap.mmap(fd, REGION_SIZE, mmap.MAP_SHARED) as held:
                struct.pack_into("=Q", held, LIMIT0, LIFTED)
                await until(lambda: header_and_slot(path)[3] == SLOT[0], timeout=2.0)  # the 50-ms pass did
            os.close(fd)
            os.truncate(path, 4096)
            await until(lambda: path.stat().st_size == 0, timeout=2.0)
            await until(lambda: len(kube.pod_events) == 2, timeout=2.0)
            await daemon.node_events.drain()
            assert sorted((e[0], e[1], e[2], e[3], e[5]) for e in kube.pod_events) == [
                ("default", "p", uid, "LiveLimitsReset", True),
                ("default", "p", uid, "LiveLimitsRestored", True),
            ]
            node_reset = [e for e in kube.node_events if e[1] == "LiveLimitsReset"]
            assert len(node_reset) == 1 and node_reset[0][3] is True
            assert "pod default/p" in node_reset[0][2] and "truncated to 4096 bytes" in node_reset[0][2]
            counted = daemon.metrics.registry.get_sample_value(
                "tf_device_plugin_errors_total", {"where": "live_limits_tamper"}
            )
            assert counted == 2

    run(scenario())


def test_the_tamper_report_says_what_was_found_and_what_was_done() -> None:
    restored = Tamper("ns", "p", "u", "main", HAMI_REGION_FILE, "flag", "had its initialised flag at 0", True)
    assert restored.message() == (
        "container main of pod ns/p (uid u): hami.cache had its initialised flag at 0; the device plugin restored "
        "the live limits it keeps"
    )
    reset = Tamper("ns", "p", "u", "main", HAMI_REGION_FILE, "removed", "was removed", False)
    assert "cannot be restored" in reset.message() and "initialises again" in reset.message()
    assert hami_region.sync  # the one-shot form stays for scripts/gpu-check
