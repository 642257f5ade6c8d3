"""Live limits: the pure decisions, HAMi-core's region written at the right bytes, the directories on disk,
and the whole loop through the plugin (Allocate mounts the directory; a changed allocation rewrites it;
a deleted pod's directory goes)."""

from __future__ import annotations

import ctypes
import json
import os
import stat
import time
from pathlib import Path

import pytest

from device_plugin.cluster.pods import from_json
from device_plugin.enforcement import hami_region
from device_plugin.enforcement.envs import EnforcementPaths, LiveMount, Target, build
from device_plugin.enforcement.hami_region import State
from device_plugin.enforcement.live_files import LiveLimits
from device_plugin.enforcement.live_limits import (
    GpuLimit,
    SlotWrite,
    Wanted,
    document,
    leftover,
    limits_of,
    parse_document,
    region_values,
    region_writes,
    resident,
    wanted,
)
from device_plugin.gpus.slices import slice_id
from device_plugin.metrics import PluginMetrics
from tests.device_plugin.fakes import (
    A100_TFLOPS,
    GIB,
    GPU0,
    GPU1,
    NODE,
    FakeKube,
    allocation,
    gpu_file,
    grant,
    make_pod,
    uid_of,
)
from tests.device_plugin.hami_layout import (
    CUDA_DEVICE_MAX_COUNT,
    MULTIPROCESS_SHARED_REGION_MAGIC_FLAG,
    ProcSlot,
    SharedRegion,
    initialised,
    noisy_region,
    write_region,
)
from tests.device_plugin.harness import plugin, run, until
from vgpu.contract.allocation import decode
from vgpu.names import HAMI_REGION_FILE, LIVE_LIMITS_DIR, LIVE_LIMITS_FILE, EnforcementBackend, Env, SystemAnnotation
from vgpu.quantity import MIB

ALLOC = SystemAnnotation.ALLOCATION.value
TARGET = Target(namespace="default", pod="p", container="main")
UID = "00000000-0000-4000-8000-00000000beef"


# --- the pure core ------------------------------------------------------------------------------


def record(*, uid: str = UID, node: str = NODE, alloc: str | None = "own", phase: str = "Running", **kw: object):  # type: ignore[no-untyped-def]
    text = allocation(uid, containers=("main", "side"), gpus=[grant(GPU0, tflops=31_200, vram=2 * GIB)])
    pod = make_pod("p", uid=uid, node=node, phase=phase, alloc=text if alloc == "own" else alloc)
    pod["metadata"].update(kw)
    return from_json(pod)


A_GPU = GpuLimit(GPU0, 31_200, 10, 2 * GIB)


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (record(), {(UID, "main"): Wanted("default", "p", (A_GPU,)), (UID, "side"): Wanted("default", "p", (A_GPU,))}),
        (record(deletionTimestamp="2026-01-01T00:00:00Z"), {}),  # being deleted: left as it is
        (record(phase="Succeeded"), {}),
        (record(node="node-b"), {}),
        (record(alloc=allocation(UID, node="node-b")), {}),  # granted on another node
        (record(alloc=allocation("someone-else")), {}),  # a copied annotation
        (record(alloc="{not json"), {}),
        (record(alloc=None), {}),
    ],
    ids=[
        "running",
        "deleting",
        "finished",
        "other-node",
        "granted-elsewhere",
        "other-pod",
        "undecodable",
        "no-allocation",
    ],
)
def test_wanted_limits_per_container_follow_the_current_allocation(pod, expected) -> None:  # type: ignore[no-untyped-def]
    assert wanted([pod], NODE) == expected


def test_each_container_of_a_split_grant_is_limited_on_its_own_gpus_only() -> None:
    gpus = [grant(GPU0, tflops=31_200, vram=2 * GIB), grant(GPU1, index=1, tflops=156_000, vram=GIB)]
    text = allocation(
        UID, containers=("main", "side"), gpus=gpus, container_gpus=(("main", (GPU1,)), ("side", (GPU0,)))
    )
    assert wanted([record(alloc=text)], NODE) == {
        (UID, "main"): Wanted("default", "p", (GpuLimit(GPU1, 156_000, 50, GIB),)),
        (UID, "side"): Wanted("default", "p", (A_GPU,)),
    }


def test_limits_carry_tflops_sm_percent_and_vram_per_gpu_in_device_order() -> None:
    text = allocation(UID, gpus=[grant(GPU1, index=1, tflops=156_000, vram=GIB), grant(GPU0, tflops=1, vram=5)])
    assert limits_of(decode(text), "main") == (GpuLimit(GPU1, 156_000, 50, GIB), GpuLimit(GPU0, 1, 1, 5))


def test_resident_pods_are_those_not_finished_even_while_being_deleted() -> None:
    pods = [
        record(uid="a"),
        record(uid="b", deletionTimestamp="2026-01-01T00:00:00Z"),
        record(uid="c", phase="Failed"),
        record(uid="d", phase="Succeeded"),
        record(uid="e", phase="Pending"),
    ]
    assert resident(pods) == {"a", "b", "e"}


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ([GpuLimit(GPU0, 1, 10, 4 * GIB)], ((4 * GIB, 10),)),
        ([GpuLimit(GPU0, 1, 10, 4 * GIB + MIB - 1)], ((4 * GIB, 10),)),  # whole MiB, as the env var says
        ([GpuLimit(GPU0, 1, 100, 100)], ((MIB, 100),)),  # never 0: HAMi-core reads 0 as "no limit"
        ([GpuLimit(GPU0, 1, 5, GIB), GpuLimit(GPU1, 1, 7, 2 * GIB)], ((GIB, 5), (2 * GIB, 7))),
    ],
)
def test_region_values_are_what_hami_core_derives_from_our_environment(gpus, expected) -> None:  # type: ignore[no-untyped-def]
    assert region_values(gpus) == expected
    # ...which is exactly what the Allocate answer's environment variables say.
    alloc = decode(allocation(UID, gpus=[grant(g.uuid, index=i, vram=g.vram_bytes) for i, g in enumerate(gpus)]))
    envs = build(alloc, TARGET, EnforcementBackend.HAMI_CORE, EnforcementPaths()).envs
    assert [int(envs[f"{Env.HAMI_MEMORY_LIMIT_PREFIX}{i}"].rstrip("m")) * MIB for i in range(len(gpus))] == [
        limit for limit, _ in expected
    ]


@pytest.mark.parametrize(
    ("want", "have", "expected"),
    [
        (((GIB, 10),), ((GIB, 10),), ()),
        (((2 * GIB, 10),), ((GIB, 10),), (SlotWrite("limit", 0, 2 * GIB),)),
        (((GIB, 20),), ((GIB, 10),), (SlotWrite("sm_limit", 0, 20),)),
        (
            ((GIB, 10), (3 * GIB, 30)),
            ((GIB, 10), (GIB, 10)),
            (SlotWrite("limit", 1, 3 * GIB), SlotWrite("sm_limit", 1, 30)),
        ),
    ],
    ids=["same", "memory", "sm", "second-device"],
)
def test_region_writes_only_the_slots_that_differ(want, have, expected) -> None:  # type: ignore[no-untyped-def]
    assert region_writes(want, have) == expected


@pytest.mark.parametrize(
    ("dirs", "resident_uids", "grace", "expected"),
    [
        ({"a": 0.0, "b": 0.0}, {"a"}, 30.0, ["b"]),  # b's pod is gone
        ({"a": 95.0}, set(), 30.0, []),  # made 5 s ago by an Allocate the watch has not shown yet
        ({"a": 70.0}, set(), 30.0, ["a"]),
        ({"a": 100.0}, set(), 0.0, ["a"]),
    ],
)
def test_leftover_directories_are_those_of_pods_gone_past_the_grace(dirs, resident_uids, grace, expected) -> None:  # type: ignore[no-untyped-def]
    assert leftover(dirs, frozenset(resident_uids), now=100.0, grace_s=grace) == expected


def test_the_document_round_trips_and_anything_else_is_not_ours() -> None:
    gpus = (GpuLimit(GPU1, 156_000, 50, GIB), GpuLimit(GPU0, 31_200, 10, 2 * GIB))
    text = document((UID, "main"), Wanted("ns", "p", gpus), backend="hami-core", generation=3, updated_at="T")
    body = json.loads(text)
    assert body["gpus"][GPU1] == {
        "index": 0,
        "tflopsLimit": "156",
        "milliTflopsLimit": 156_000,
        "smPercent": 50,
        "vramLimitBytes": GIB,
    }
    assert (body["pod"], body["container"], body["generation"]) == (
        {"namespace": "ns", "name": "p", "uid": UID},
        "main",
        3,
    )
    assert parse_document(text) == (gpus, 3)
    for other in ("", "[]", '{"version": "v2"}', text.replace('"generation": 3', '"generation": "x"')):
        assert parse_document(other) is None


def test_allocate_answer_mounts_the_live_directory_and_names_it_and_hami_cores_region() -> None:
    alloc = decode(allocation(UID))
    live = LiveMount("/host/limits/uid/main")
    for backend in EnforcementBackend:
        grant_ = build(alloc, TARGET, backend, EnforcementPaths(), live)
        assert grant_.mounts[-1].container_path == LIVE_LIMITS_DIR
        assert (grant_.mounts[-1].host_path, grant_.mounts[-1].read_only) == ("/host/limits/uid/main", False)
        assert grant_.envs[Env.TF_LIVE_LIMITS] == f"{LIVE_LIMITS_DIR}/{LIVE_LIMITS_FILE}"
        hami = grant_.envs.get(Env.HAMI_SHARED_REGION)
        assert hami == (f"{LIVE_LIMITS_DIR}/{HAMI_REGION_FILE}" if backend is EnforcementBackend.HAMI_CORE else None)
        without = build(alloc, TARGET, backend, EnforcementPaths())
        assert Env.TF_LIVE_LIMITS not in without.envs and Env.HAMI_SHARED_REGION not in without.envs
        assert grant_.mounts[:-1] == without.mounts


# --- HAMi-core's region -------------------------------------------------------------------------


def test_the_plugins_offsets_are_hami_cores_layout() -> None:
    assert ctypes.sizeof(ProcSlot) == 1960
    assert ctypes.sizeof(SharedRegion) == hami_region.REGION_SIZE == 2_008_952
    assert SharedRegion.limit.offset == hami_region.LIMIT_OFFSET == 1600
    assert SharedRegion.sm_limit.offset == hami_region.SM_LIMIT_OFFSET == 1728
    assert SharedRegion.procs.offset == 1856
    assert (hami_region.MAGIC, hami_region.MAX_DEVICES) == (
        MULTIPROCESS_SHARED_REGION_MAGIC_FLAG,
        CUDA_DEVICE_MAX_COUNT,
    )


def changed_bytes(before: bytes, after: bytes) -> list[int]:
    assert len(before) == len(after)
    return [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]


def test_a_new_limit_is_written_exactly_at_limit_i_and_sm_limit_i_and_nowhere_else(tmp_path: Path) -> None:
    path = tmp_path / "hami.cache"
    before = write_region(path, initialised([(GIB, 10), (GIB, 10)]))
    synced = hami_region.sync(path, [(3 * GIB, 10), (GIB, 40)])
    assert synced.writes == (SlotWrite("limit", 0, 3 * GIB), SlotWrite("sm_limit", 1, 40))
    assert synced.region == hami_region.Region(State.READY, ((3 * GIB, 10), (GIB, 40)))
    after = path.read_bytes()
    limit0, sm1 = SharedRegion.limit.offset, SharedRegion.sm_limit.offset + 8
    assert set(changed_bytes(before, after)) <= set(range(limit0, limit0 + 8)) | set(range(sm1, sm1 + 8))
    region = SharedRegion.from_buffer_copy(after)
    assert (region.limit[0], region.limit[1], region.sm_limit[0], region.sm_limit[1]) == (3 * GIB, GIB, 10, 40)
    assert region.limit[2] == noisy_region().limit[2]  # other devices' slots: untouched
    assert hami_region.sync(path, [(3 * GIB, 10), (GIB, 40)]).writes == ()  # level: nothing more to do
    assert path.read_bytes() == after


@pytest.mark.parametrize(
    ("make", "state"),
    [
        (lambda p: write_region(p, initialised([(GIB, 10)], minor=1)), State.REFUSED),  # 1.1: two layouts
        (lambda p: write_region(p, initialised([(GIB, 10)], major=2, minor=0)), State.REFUSED),
        (lambda p: write_region(p, noisy_region()), State.UNINITIALISED),  # no magic: not initialised yet
        (lambda p: p.write_bytes(bytes(initialised([(GIB, 10)]))[:4096]), State.REFUSED),  # magic, too short
        (lambda p: p.write_bytes(b""), State.UNINITIALISED),  # the empty file prepared at Allocate
        (lambda p: p.write_bytes(b"\x4e\xfc\x2f\x01"), State.UNINITIALISED),  # a few bytes, no full header
    ],
    ids=["version-1.1", "version-2.0", "no-magic", "short", "empty", "tiny"],
)
def test_a_region_whose_header_is_not_one_we_know_is_left_untouched(tmp_path: Path, make, state) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "hami.cache"
    make(path)
    before = path.read_bytes()
    synced = hami_region.sync(path, [(3 * GIB, 40)])
    assert (synced.region.state, synced.writes) == (state, ())
    assert path.read_bytes() == before


def test_a_link_or_a_non_file_planted_as_the_region_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "other-containers-region"
    before = write_region(victim, initialised([(GIB, 10)]))
    link = tmp_path / "hami.cache"
    link.symlink_to(victim)
    assert hami_region.sync(link, [(3 * GIB, 40)]).region.state is State.REFUSED
    assert victim.read_bytes() == before
    fifo = tmp_path / "fifo.cache"
    os.mkfifo(fifo)
    assert hami_region.sync(fifo, [(3 * GIB, 40)]).region.state is State.REFUSED
    assert hami_region.sync(tmp_path / "absent", [(GIB, 1)]).region.state is State.ABSENT


# --- the directories ----------------------------------------------------------------------------


def counted(metrics: PluginMetrics, target: str) -> float:
    return metrics.registry.get_sample_value("tf_device_plugin_live_limit_writes_total", {"target": target}) or 0.0


def test_prepare_then_sync_rewrites_the_document_and_the_region_only_when_limits_change(tmp_path: Path) -> None:
    metrics = PluginMetrics()
    live = LiveLimits(tmp_path / "limits", EnforcementBackend.HAMI_CORE, metrics, clock=lambda: "2026-11-22T04:00:00Z")
    mount = live.prepare(TARGET, UID, decode(allocation(UID, gpus=[grant(GPU0, tflops=31_200, vram=2 * GIB)])))
    home = tmp_path / "limits" / UID / "main"
    assert mount == LiveMount(str(home))
    assert stat.S_IMODE(home.stat().st_mode) == 0o755
    assert (home / HAMI_REGION_FILE).stat().st_size == 0 and stat.S_IMODE(
        (home / HAMI_REGION_FILE).stat().st_mode
    ) == 0o666
    first = json.loads((home / LIVE_LIMITS_FILE).read_text())
    assert (first["generation"], first["gpus"][GPU0]["vramLimitBytes"], first["gpus"][GPU0]["smPercent"]) == (
        1,
        2 * GIB,
        10,
    )
    assert counted(metrics, "file") == 1

    # The workload's first CUDA call: HAMi-core initialises the region from the environment.
    write_region(home / HAMI_REGION_FILE, initialised([(2 * GIB, 10)]))
    same = Wanted("default", "p", (GpuLimit(GPU0, 31_200, 10, 2 * GIB),))
    live.sync({(UID, "main"): same}, frozenset({UID}))
    assert json.loads((home / LIVE_LIMITS_FILE).read_text())["generation"] == 1
    assert (counted(metrics, "file"), counted(metrics, "hami_region")) == (1, 0)

    raised = Wanted("default", "p", (GpuLimit(GPU0, 62_400, 20, 6 * GIB),))
    live.sync({(UID, "main"): raised}, frozenset({UID}))
    doc = json.loads((home / LIVE_LIMITS_FILE).read_text())
    assert (doc["generation"], doc["gpus"][GPU0]["milliTflopsLimit"], doc["gpus"][GPU0]["vramLimitBytes"]) == (
        2,
        62_400,
        6 * GIB,
    )
    region = SharedRegion.from_buffer_copy((home / HAMI_REGION_FILE).read_bytes())
    assert (region.limit[0], region.sm_limit[0]) == (6 * GIB, 20)
    assert (counted(metrics, "file"), counted(metrics, "hami_region")) == (2, 2)
    assert sorted(p.name for p in home.iterdir()) == [HAMI_REGION_FILE, LIVE_LIMITS_FILE]  # no temporary left

    # A restarted plugin knows the generation from the file and rewrites nothing unchanged.
    again = LiveLimits(tmp_path / "limits", EnforcementBackend.HAMI_CORE, PluginMetrics())
    again.sync({(UID, "main"): raised}, frozenset({UID}))
    assert json.loads((home / LIVE_LIMITS_FILE).read_text()) == doc


def test_a_container_never_prepared_here_gets_no_directory(tmp_path: Path) -> None:
    live = LiveLimits(tmp_path, EnforcementBackend.NONE, PluginMetrics())
    live.sync({(UID, "main"): Wanted("default", "p", (A_GPU,))}, frozenset({UID}))
    assert list(tmp_path.iterdir()) == []


def test_a_pod_gone_from_the_node_loses_its_directory_after_the_grace(tmp_path: Path) -> None:
    live = LiveLimits(tmp_path, EnforcementBackend.MPS, PluginMetrics(), grace_s=30.0)
    alloc = decode(allocation(UID))
    live.prepare(TARGET, UID, alloc)
    live.prepare(TARGET, "other", decode(allocation("other")))
    live.sync({}, frozenset({"other"}))
    assert (tmp_path / UID).is_dir(), "just made: the watch may not show its pod yet"
    old = time.time() - 60
    os.utime(tmp_path / UID, (old, old))
    live.sync({}, frozenset({"other"}))
    assert not (tmp_path / UID).exists()
    assert (tmp_path / "other" / "main" / LIVE_LIMITS_FILE).is_file()


# --- through the plugin -------------------------------------------------------------------------


def test_a_limit_changed_in_place_reaches_the_live_files_and_a_deleted_pods_directory_goes(tmp_path: Path) -> None:
    root = tmp_path / "limits"
    pod = make_pod("p", alloc=allocation("pending"))
    uid = uid_of(pod)
    pod["metadata"]["annotations"][ALLOC] = allocation(uid, gpus=[grant(GPU0, tflops=31_200, vram=2 * GIB)])
    kube = FakeKube([pod])
    home = root / uid / "main"

    async def scenario() -> None:
        overrides = {
            "backend": EnforcementBackend.HAMI_CORE,
            "live_limits_dir": str(root),
            "live_limits_interval": 0.05,
        }
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), live_limits_grace_s=0, **overrides) as (
            _daemon,
            kubelet,
        ):
            answer = (await kubelet.allocate(slice_id(GPU0, 0), pod="p")).container_responses[0]
            envs = dict(answer.envs)
            assert envs[Env.TF_LIVE_LIMITS] == f"{LIVE_LIMITS_DIR}/{LIVE_LIMITS_FILE}"
            assert envs[Env.HAMI_SHARED_REGION] == f"{LIVE_LIMITS_DIR}/{HAMI_REGION_FILE}"
            assert envs[f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0"] == "2048m"
            mounts = [(m.container_path, m.host_path, m.read_only) for m in answer.mounts]
            assert (LIVE_LIMITS_DIR, str(home), False) in mounts
            assert json.loads((home / LIVE_LIMITS_FILE).read_text())["gpus"][GPU0]["vramLimitBytes"] == 2 * GIB
            write_region(home / HAMI_REGION_FILE, initialised([(2 * GIB, 10)]))  # the workload starts

            raised = grant(GPU0, tflops=31_200, vram=2 * GIB, tflops_limit=93_600, vram_limit=5 * GIB)
            kube.annotate(uid, ALLOC, allocation(uid, gpus=[raised]))

            def region() -> tuple[int, int]:
                r = SharedRegion.from_buffer_copy((home / HAMI_REGION_FILE).read_bytes())
                return r.limit[0], r.sm_limit[0]

            await until(lambda: region() == (5 * GIB, 30))
            doc = json.loads((home / LIVE_LIMITS_FILE).read_text())
            assert (doc["generation"], doc["gpus"][GPU0]["milliTflopsLimit"], doc["gpus"][GPU0]["smPercent"]) == (
                2,
                93_600,
                -(-93_600 * 100 // A100_TFLOPS),
            )
            kube.delete(uid)
            await until(lambda: not (root / uid).exists())

    run(scenario())
