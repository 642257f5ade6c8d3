"""Table tests of the pure parts: health machine, env builder, slices, pod records, lookup rules."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from device_plugin.cluster.pods import from_json
from device_plugin.enforcement.envs import EnforcementPaths, Target, build, sm_percent
from device_plugin.enforcement.live_limits import limits_of
from device_plugin.gpus.health import HEALTHY, GpuHealth, HealthBoard, HealthPolicy, on_check, on_xid
from device_plugin.gpus.slices import SliceIdError, gpu_of, preferred, slice_id, slices
from device_plugin.kubelet.lookup import AllocateError, Match, choose, validate
from device_plugin.kubelet.proof import Answer, Holder, Outcome, Settled, refusal, settle
from tests.device_plugin.fakes import A100_TFLOPS, A100_VRAM, GIB, GPU0, GPU1, allocation, grant, make_pod
from vgpu.contract.allocation import Handoff, decode, encode_handoff
from vgpu.contract.inventory import GpuInfo, Health
from vgpu.names import EnforcementBackend, Env, IsolationMode

POLICY = HealthPolicy(recovery_s=10)
SICK = GpuHealth(healthy=False, reason="XID 79", last_fault=100.0)


@pytest.mark.parametrize(
    ("state", "xid", "expected"),
    [
        (HEALTHY, 79, GpuHealth(False, "XID 79", 5.0)),
        (HEALTHY, 13, HEALTHY),  # application error: ignored by default
        (HEALTHY, 109, HEALTHY),
        (SICK, 48, GpuHealth(False, "XID 48", 5.0)),  # a new fault restarts the clock
    ],
)
def test_xid_transitions(state: GpuHealth, xid: int, expected: GpuHealth) -> None:
    assert on_xid(state, xid, 5.0, POLICY) == expected


@pytest.mark.parametrize(
    ("state", "problem", "now", "healthy"),
    [
        (SICK, None, 105.0, False),  # quiet, but not long enough
        (SICK, None, 110.0, True),  # quiet for the recovery interval: healthy again
        (SICK, "lost", 120.0, False),
        (HEALTHY, "lost", 1.0, False),
        (HEALTHY, None, 1.0, True),
    ],
)
def test_check_transitions(state: GpuHealth, problem: str | None, now: float, healthy: bool) -> None:
    assert on_check(state, problem, now, POLICY).healthy is healthy


def test_ignored_xids_are_configurable_and_board_reports_flips() -> None:
    board = HealthBoard.fresh([GPU0, GPU1], HealthPolicy(ignored_xids=frozenset({79}), recovery_s=1))
    board, flipped = board.xid(GPU0, 79, 0.0)
    assert flipped == frozenset()
    board, flipped = board.xid(GPU0, 13, 0.0)
    assert flipped == {GPU0}
    board, flipped = board.checked({GPU0: None, GPU1: None}, 0.5)
    assert flipped == frozenset()
    board, flipped = board.checked({GPU0: None, GPU1: None}, 1.0)
    assert flipped == {GPU0} and board.healthy(GPU0)
    _, flipped = board.xid("", 48, 2.0)  # the driver could not tell which GPU: all of them
    assert flipped == {GPU0, GPU1}


@pytest.mark.parametrize(
    ("limit", "capacity", "percent"),
    [(10_000, 312_000, 4), (312_000, 312_000, 100), (400_000, 312_000, 100), (1, 312_000, 1), (0, 312_000, 1)],
)
def test_sm_percent_is_ceil_clamped(limit: int, capacity: int, percent: int) -> None:
    assert sm_percent(limit, capacity) == percent


TARGET = Target(namespace="ns", pod="p", container="c")
TWO = decode(allocation("u", gpus=[grant(GPU0, tflops=31_200, vram=4 * GIB), grant(GPU1, index=1, vram=GIB + 1)]))
SPLIT_GPUS = [grant(GPU0, tflops=31_200, vram=4 * GIB), grant(GPU1, index=1, vram=GIB + 1)]
# container-gpu-count {"pre": 1, "c": 1}: the pod's two GPUs, one each.
SPLIT = decode(
    allocation("u", containers=("pre", "c"), gpus=SPLIT_GPUS, container_gpus=(("pre", (GPU1,)), ("c", (GPU0,))))
)


def test_common_env_for_every_backend() -> None:
    for backend in EnforcementBackend:
        env = build(TWO, TARGET, backend, EnforcementPaths()).envs
        assert env[Env.NVIDIA_VISIBLE_DEVICES] == f"{GPU0},{GPU1}"
        assert json.loads(env[Env.TF_MEM_LIMIT]) == {GPU0: 4 * GIB, GPU1: GIB + 1}
        assert json.loads(env[Env.TF_UP_LIMIT]) == {GPU0: 10, GPU1: 4}
        assert json.loads(env[Env.TF_UP_LIMIT_TFLOPS]) == {GPU0: 31.2, GPU1: 10}
        assert (env[Env.TF_POD_NAMESPACE], env[Env.TF_POD_NAME], env[Env.TF_CONTAINER_NAME]) == ("ns", "p", "c")


@pytest.mark.parametrize(
    ("backend", "extra", "mounts"),
    [
        (EnforcementBackend.NONE, {}, []),
        (
            EnforcementBackend.HAMI_CORE,
            {
                "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
                "CUDA_DEVICE_MEMORY_LIMIT_1": "1024m",
                "CUDA_DEVICE_SM_LIMIT_0": "10",
                "CUDA_DEVICE_SM_LIMIT_1": "4",
                "CUDA_DEVICE_SM_LIMIT": "10",
            },
            [("/opt/hami/libvgpu.so", "/opt/hami/libvgpu.so", True), ("/etc/ld.so.preload", "/opt/hami/preload", True)],
        ),
        (
            EnforcementBackend.MPS,
            {
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M,1=1024M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10",
                "CUDA_MPS_PIPE_DIRECTORY": "/mps/pipe",
            },
            [("/mps/pipe", "/host/mps", False), ("/dev/shm", "/host/mps-shm", False)],
        ),
    ],
)
def test_backend_specific_env_and_mounts(
    backend: EnforcementBackend, extra: dict[str, str], mounts: list[tuple[str, str, bool]]
) -> None:
    paths = EnforcementPaths(
        hami_library="/opt/hami/libvgpu.so",
        hami_preload="/opt/hami/preload",
        mps_pipe_host="/host/mps",
        mps_pipe_container="/mps/pipe",
        mps_shm_host="/host/mps-shm",
    )
    grant_ = build(TWO, TARGET, backend, paths)
    backend_keys = {k for k in grant_.envs if k.startswith(("CUDA_DEVICE", "CUDA_MPS"))}
    assert {k: grant_.envs[k] for k in backend_keys} == extra
    assert [(m.container_path, m.host_path, m.read_only) for m in grant_.mounts] == mounts


def test_a_container_of_a_split_grant_gets_its_own_gpus_and_their_limits_only() -> None:
    for container, uuid, tflops, mib, percent in (("c", GPU0, 31.2, 4096, 10), ("pre", GPU1, 10, 1024, 4)):
        env = build(SPLIT, replace(TARGET, container=container), EnforcementBackend.HAMI_CORE, EnforcementPaths()).envs
        assert env[Env.NVIDIA_VISIBLE_DEVICES] == uuid
        assert json.loads(env[Env.TF_UP_LIMIT_TFLOPS]) == {uuid: tflops}
        assert json.loads(env[Env.TF_UP_LIMIT]) == {uuid: percent}
        assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == (f"{mib}m", str(percent))
        assert "CUDA_DEVICE_MEMORY_LIMIT_1" not in env
        assert [g.uuid for g in limits_of(SPLIT, container)] == [uuid]
    assert [g.uuid for g in limits_of(TWO, "c")] == [GPU0, GPU1]  # no split: every container every GPU


def test_each_gpu_gets_its_own_sm_limit_and_the_shared_ones_the_largest() -> None:
    # The smaller limit comes first, so "the first GPU's percent" and "the largest" differ.
    uneven = decode(allocation("u", gpus=[grant(GPU0, tflops=12_480), grant(GPU1, index=1, tflops=156_000)]))
    hami = build(uneven, TARGET, EnforcementBackend.HAMI_CORE, EnforcementPaths()).envs
    assert json.loads(hami[Env.TF_UP_LIMIT]) == {GPU0: 4, GPU1: 50}
    assert (hami["CUDA_DEVICE_SM_LIMIT_0"], hami["CUDA_DEVICE_SM_LIMIT_1"]) == ("4", "50")
    assert hami[Env.HAMI_SM_LIMIT] == "50"  # HAMi-core's fallback, for a device without its own key
    mps = build(uneven, TARGET, EnforcementBackend.MPS, EnforcementPaths()).envs
    assert mps[Env.MPS_ACTIVE_THREAD_PERCENTAGE] == "50"


def test_slice_ids_round_trip_and_stay_short() -> None:
    assert gpu_of(slice_id(GPU0, 15)) == GPU0
    with pytest.raises(SliceIdError):
        slice_id("MIG-" + "x" * 60, 1)
    with pytest.raises(SliceIdError):
        gpu_of("vgpu-3")
    gpus = [
        GpuInfo(uuid=GPU1, index=1, model="m", tflops=1, vram=1, numa=1, health=Health.UNHEALTHY),
        GpuInfo(uuid=GPU0, index=0, model="m", tflops=1, vram=1, numa=0),
    ]
    got = [(s.id, s.healthy, s.numa) for s in slices(gpus, 2)]
    assert got == [
        (slice_id(GPU0, 0), True, 0),
        (slice_id(GPU0, 1), True, 0),
        (slice_id(GPU1, 0), False, 1),
        (slice_id(GPU1, 1), False, 1),
    ]


def test_preferred_allocation_favours_the_granted_gpus_then_packs() -> None:
    available = [slice_id(GPU0, 0), slice_id(GPU1, 0), slice_id(GPU1, 1), slice_id(GPU0, 1), slice_id(GPU1, 2)]
    assert preferred(available, [], 1, favour=[GPU0]) == [slice_id(GPU0, 0)]
    assert preferred(available, [], 2) == [slice_id(GPU1, 0), slice_id(GPU1, 1)]  # GPU1 has most free slices
    assert preferred(available, [], 2, favour=[GPU0, GPU1]) == [slice_id(GPU0, 0), slice_id(GPU1, 0)]
    assert preferred(available, [slice_id(GPU0, 1)], 2, favour=[GPU0]) == [slice_id(GPU0, 1), slice_id(GPU0, 0)]


def test_pod_record_orders_init_containers_first_and_skips_non_gpu_ones() -> None:
    pod = from_json(make_pod("p", init=[("init", 1)], containers=[("a", 1), ("side", 0), ("b", 2)]))
    assert pod.vgpu_containers == (("init", 1), ("a", 1), ("b", 2))
    assert pod.active and pod.allocation is None


GPUS = {GPU0: GpuInfo(uuid=GPU0, index=0, model="A100", tflops=A100_TFLOPS, vram=A100_VRAM)}


def test_choose_serves_the_next_unserved_container_and_rejects_ambiguity() -> None:
    a = from_json(make_pod("a", alloc="{}", containers=[("x", 1), ("y", 1)]))
    b = from_json(make_pod("b", alloc="{}", containers=[("z", 2)]))
    assert choose([a, b], "node-a", ("d1",), {}) == Match(a, "x", again=False)
    assert choose([a, b], "node-a", ("d1",), {a.uid: {"x"}}) == Match(a, "y", again=False)
    assert isinstance(choose([a, b], "node-a", ("d1",), {a.uid: {"x", "y"}}), AllocateError)
    assert choose([a, b], "node-a", ("d1", "d2"), {}) == Match(b, "z", again=False)
    twin = from_json(make_pod("twin", alloc="{}"))
    result = choose([a, twin], "node-a", ("d1",), {})
    assert isinstance(result, AllocateError) and not result.waitable and "a" in str(result) and "twin" in str(result)


def test_choose_serves_containers_of_unequal_counts_in_the_kubelets_order() -> None:
    """container-gpu-count {"pre": 1, "inf": 2}: the kubelet's Allocates carry 1 then 2 device IDs; a 3-GPU pod
    beside it (sizes disjoint: both may be in hand-off) takes only the 3."""
    split = from_json(make_pod("split", alloc="{}", containers=[("pre", 1), ("inf", 2)]))
    three = from_json(make_pod("three", alloc="{}", containers=[("main", 3)]))
    pods = [split, three]
    assert isinstance(choose(pods, "node-a", ("d1", "d2"), {}), AllocateError)  # pre comes first
    assert choose(pods, "node-a", ("d1",), {}) == Match(split, "pre", again=False)
    assert choose(pods, "node-a", ("d1", "d2"), {split.uid: {"pre"}}) == Match(split, "inf", again=False)
    assert choose(pods, "node-a", ("d1", "d2", "d3"), {split.uid: {"pre"}}) == Match(three, "main", again=False)


def test_choose_serves_a_recorded_container_again_only_with_the_same_ids() -> None:
    uid = "00000000-0000-4000-8000-0000000000aa"
    receipt = encode_handoff(Handoff(pod_uid=uid, node="node-a", devices=(("main", ("d1", "d2")),), at="t"))
    done = from_json(make_pod("done", uid=uid, alloc="{}", handoff=receipt, containers=[("main", 2)]))
    assert choose([done], "node-a", ("d2", "d1"), {}) == Match(done, "main", again=True)
    missing = choose([done], "node-a", ("d1", "d3"), {})
    assert isinstance(missing, AllocateError) and missing.waitable


@pytest.mark.parametrize(
    ("alloc", "containers", "message"),
    [
        ("not json", [("main", 1)], "allocation annotation is invalid"),
        (allocation("U", containers=("other",)), [("main", 1)], "allocation is for containers ['other']"),
        (
            allocation("U"),
            [("main", 2)],
            "container main requests 2 tensor-fusion.ai/vgpu but the allocation grants it 1",
        ),
        (
            allocation("U", containers=("a", "b"), gpus=SPLIT_GPUS, container_gpus=(("a", (GPU0,)), ("b", (GPU1,)))),
            [("a", 1), ("b", 2)],
            "container b requests 2 tensor-fusion.ai/vgpu but the allocation grants it 1",
        ),
        (
            allocation("U", gpus=[grant(GPU0, tflops_request=20_000)]),
            [("main", 1)],
            "TFLOPS request 20 exceeds its limit 10",
        ),
        (
            allocation("U", gpus=[grant(GPU0, vram=100 * GIB)]),
            [("main", 1)],
            "vram limit 100Gi exceeds the GPU's capacity",
        ),
        (allocation("U", gpus=[grant(GPU0), grant(GPU0)]), [("main", 2)], "lists a GPU twice"),
    ],
)
def test_validate_names_the_broken_rule(alloc: str, containers: list[tuple[str, int]], message: str) -> None:
    pod = from_json(make_pod("p", uid="U", alloc=alloc, containers=containers))
    with pytest.raises(AllocateError) as err:
        validate(pod, "node-a", GPUS, EnforcementBackend.HAMI_CORE)
    assert message in str(err.value)


def test_validate_rejects_an_unhealthy_gpu_and_accepts_a_sound_allocation() -> None:
    pod = from_json(make_pod("p", uid="U", alloc=allocation("U")))
    assert validate(pod, "node-a", GPUS, EnforcementBackend.HAMI_CORE).gpus[0].uuid == GPU0
    sick = {GPU0: GpuInfo(uuid=GPU0, index=0, model="A100", tflops=1, vram=1, health=Health.UNHEALTHY)}
    with pytest.raises(AllocateError, match="unhealthy on node node-a"):
        validate(pod, "node-a", sick, EnforcementBackend.HAMI_CORE)
    mig = {GPU0: GpuInfo(uuid=GPU0, index=0, model="A100", tflops=A100_TFLOPS, vram=A100_VRAM, mig=True)}
    with pytest.raises(AllocateError, match="in MIG mode on node node-a: its UUID gives a container no usable"):
        validate(pod, "node-a", mig, EnforcementBackend.HAMI_CORE)


def test_validate_holds_each_container_to_its_own_share_of_a_split_grant() -> None:
    gpus = {**GPUS, GPU1: GpuInfo(uuid=GPU1, index=1, model="A100", tflops=A100_TFLOPS, vram=A100_VRAM)}
    split = allocation("U", containers=("a", "b"), gpus=SPLIT_GPUS, container_gpus=(("a", (GPU0,)), ("b", (GPU1,))))
    pod = from_json(make_pod("p", uid="U", alloc=split, containers=[("a", 1), ("b", 1)]))
    assert validate(pod, "node-a", gpus, EnforcementBackend.HAMI_CORE).gpus_of("b") == (SPLIT_GPUS[1],)
    # The same grant without the split gives each container both GPUs: a container asking for 1 is refused.
    unsplit = allocation("U", containers=("a", "b"), gpus=SPLIT_GPUS)
    whole = from_json(make_pod("p", uid="U", alloc=unsplit, containers=[("a", 1), ("b", 1)]))
    with pytest.raises(AllocateError) as err:
        validate(whole, "node-a", gpus, EnforcementBackend.HAMI_CORE)
    assert "container a requests 1 tensor-fusion.ai/vgpu but the allocation grants it 2" in str(err.value)


def test_a_named_isolation_mode_is_checked_against_the_node_and_shared_is_uncapped() -> None:
    """hard on a HAMi-core node is refused, naming what the GPU serves; shared there passes and its answer caps
    no compute (every percent 100) while its VRAM stays limited; soft gets the TFLOPS limit's share."""
    pod = from_json(make_pod("p", uid="U", alloc=allocation("U", isolation=IsolationMode.HARD)))
    with pytest.raises(AllocateError, match=f"isolation hard on GPU {GPU0}, which serves shared, soft on node node-a"):
        validate(pod, "node-a", GPUS, EnforcementBackend.HAMI_CORE)
    assert validate(pod, "node-a", GPUS, EnforcementBackend.MPS).isolation is IsolationMode.HARD
    answers = {}
    for mode in (IsolationMode.SHARED, IsolationMode.SOFT):
        pod = from_json(make_pod("p", uid="U", alloc=allocation("U", isolation=mode)))
        alloc = validate(pod, "node-a", GPUS, EnforcementBackend.HAMI_CORE)
        answers[mode] = build(alloc, TARGET, EnforcementBackend.HAMI_CORE, EnforcementPaths()).envs
    shared, soft = answers[IsolationMode.SHARED], answers[IsolationMode.SOFT]
    assert (shared[Env.HAMI_SM_LIMIT], shared[f"{Env.HAMI_SM_LIMIT}_0"], shared[Env.TF_UP_LIMIT]) == (
        "100",
        "100",
        f'{{"{GPU0}":100}}',
    )
    assert soft[Env.HAMI_SM_LIMIT] == "4"  # 10 of 312 TFLOPS, rounded up
    assert shared[f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0"] == soft[f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0"] == "4096m"
    # Live limits (limits.json, HAMi-core's region) follow the same rule when the grant changes in place.
    assert [g.sm_percent for g in limits_of(decode(allocation("U", isolation=IsolationMode.SHARED)), "main")] == [100]


def test_a_mig_instance_is_granted_by_its_own_uuid_and_the_parent_has_no_slices() -> None:
    unit = "MIG-9f2d0c1e-0000-0000-0000-000000000000"
    gpus = {
        GPU0: GpuInfo(uuid=GPU0, index=0, model="A100", tflops=A100_TFLOPS, vram=A100_VRAM, mig=True),
        unit: GpuInfo(uuid=unit, index=0, model="A100 MIG 1g.10gb", tflops=44_571, vram=9728 * 1024**2, parent=GPU0),
    }
    whole = grant(unit, tflops=44_571, vram=9728 * 1024**2, gpu_tflops=44_571)
    pod = from_json(make_pod("p", uid="U", alloc=allocation("U", gpus=[whole])))
    alloc = validate(pod, "node-a", gpus, EnforcementBackend.HAMI_CORE)
    env = build(alloc, TARGET, EnforcementBackend.HAMI_CORE, EnforcementPaths()).envs
    assert env[Env.NVIDIA_VISIBLE_DEVICES] == unit
    assert {s.uuid for s in slices(gpus.values(), 4)} == {unit}


# --- proof: the kubelet's record settles answers, and only proven grants start ---

ANSWER = Answer("uid-p", "ns-a", "p", "main", ("d1",))


@pytest.mark.parametrize(
    ("truth", "expected"),
    [
        ({}, Settled(Outcome.PENDING)),
        ({("ns-a", "p"): {"main": ("d1",)}}, Settled(Outcome.CONFIRMED, Holder("ns-a", "p", "main"))),
        # Another container of the pod got the IDs answered for main: it would run on main's GPUs, which a pod
        # asking for GPUs per container does not share; never confirmed, so that container never starts.
        ({("ns-a", "p"): {"side": ("d1",)}}, Settled(Outcome.PENDING)),
        ({("ns-b", "p"): {"main": ("d1",)}}, Settled(Outcome.STOLEN, Holder("ns-b", "p", "main"))),
        ({("ns-a", "t"): {"main": ("d1",)}}, Settled(Outcome.STOLEN, Holder("ns-a", "t", "main"))),
        ({("ns-a", "p"): {"main": ("d1", "d2")}}, Settled(Outcome.PENDING)),  # not these IDs exactly
    ],
    ids=["unrecorded", "confirmed", "same-pod-other-container", "same-name-other-namespace", "thief", "superset"],
)
def test_settle_reads_the_kubelets_record(
    truth: dict[tuple[str, str], dict[str, tuple[str, ...]]], expected: Settled
) -> None:
    assert settle(ANSWER, truth) == expected


def test_refusal_starts_only_containers_whose_grant_is_proven_their_own() -> None:
    p = from_json(make_pod("p", uid="uid-p", alloc="{}"))
    t = from_json(make_pod("t", uid="uid-t"))
    receipt = encode_handoff(Handoff(pod_uid="uid-p", node="node-a", devices=(("main", ("d9",)),), at="x"))
    restarted = from_json(make_pod("r", uid="uid-r", alloc="{}", handoff=receipt.replace("uid-p", "uid-r")))
    pods = {(x.namespace, x.name): x for x in (p, t, restarted)}
    truth = {
        ("default", "p"): {"main": ("d1",)},
        ("default", "t"): {"main": ("d2",)},
        ("default", "r"): {"main": ("d9",)},
    }
    confirmed = {"uid-p": {"main": frozenset({"d1"})}}
    stolen = {frozenset({"d2"}): Answer("uid-p", "default", "p", "main", ("d2",))}
    assert refusal(("d1",), truth, pods, confirmed, stolen, "node-a") is None
    assert refusal(("d9",), truth, pods, confirmed, stolen, "node-a") is None  # proven by its receipt
    thief = refusal(("d2",), truth, pods, confirmed, stolen, "node-a")
    assert thief is not None and "answered with pod default/p's GPU grant" in thief
    assert "no tensor-fusion grant is proven for pod default/t" in str(
        refusal(("d2",), truth, pods, confirmed, {}, "node-a")
    )
    assert "shows no container holding devices ['d7']" in str(
        refusal(("d7",), truth, pods, confirmed, stolen, "node-a")
    )
    # A grant confirmed for p proves nothing for another pod holding the same name later (new UID).
    successor = from_json(make_pod("p", uid="uid-q", alloc="{}"))
    assert refusal(("d1",), truth, {("default", "p"): successor}, confirmed, {}, "node-a") is not None
    # A pod that ended proves nothing, even with a receipt.
    ended = from_json(make_pod("r", uid="uid-r", alloc="{}", handoff=receipt.replace("uid-p", "uid-r"), phase="Failed"))
    assert refusal(("d9",), truth, {("default", "r"): ended}, {}, {}, "node-a") is not None
