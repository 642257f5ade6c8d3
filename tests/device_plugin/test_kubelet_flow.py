"""The plugin as a kubelet sees it: real unix sockets, a test kubelet, the fake GPU file and fake API."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from device_plugin.gpus.slices import gpu_of, slice_id
from tests.device_plugin.fakes import (
    GIB,
    GPU0,
    GPU1,
    CountingKube,
    FakeKube,
    allocation,
    gpu_file,
    grant,
    make_pod,
    toolkit_gpus,
    uid_of,
)
from tests.device_plugin.harness import plugin, run, until
from tests.device_plugin.kubelet import TestKubelet
from vgpu.contract.allocation import Handoff, decode_handoff, encode_handoff
from vgpu.contract.inventory import decode as decode_inventory
from vgpu.names import RESOURCE_VGPU, Env, SystemAnnotation

HANDOFF = SystemAnnotation.HANDOFF.value
ALLOC = SystemAnnotation.ALLOCATION.value


async def receipt(kube: FakeKube, uid: str, timeout: float = 5.0) -> dict[str, tuple[str, ...]]:
    deadline = time.monotonic() + timeout
    while (text := kube.annotation(uid, HANDOFF)) is None:
        assert time.monotonic() < deadline, f"no hand-off receipt on {uid}"
        await asyncio.sleep(0.01)
    return dict(decode_handoff(text).devices)


def test_registers_and_lists_every_slice_with_numa(tmp_path: Path) -> None:
    async def scenario() -> None:
        kube = FakeKube()
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (_daemon, kubelet):
            devices = await kubelet.next_list()
            assert sorted(devices) == sorted((slice_id(g, n), "Healthy") for g in (GPU0, GPU1) for n in range(4))
            assert all(len(d) <= 63 for d, _ in devices)
            assert (tmp_path / "tf-vgpu.sock").exists()
        assert not (tmp_path / "tf-vgpu.sock").exists(), "graceful shutdown removes our socket"

    run(scenario())


@pytest.mark.parametrize("numa", [{GPU0: 1, GPU1: 0}, {GPU0: 0, GPU1: None}], ids=["swapped", "unknown"])
def test_list_and_watch_devices_carry_their_gpus_numa_node(tmp_path: Path, numa: dict[str, int | None]) -> None:
    async def scenario() -> None:
        gpus = gpu_file(tmp_path / "gpus.yaml", numa=numa)
        async with plugin(tmp_path, FakeKube(), gpus) as (_daemon, kubelet):
            devices = await kubelet.next_devices()
            assert len(devices) == 8
            for device in devices:
                node = numa[gpu_of(device.ID)]
                if node is None:  # no topology at all: the Topology Manager treats it as any node
                    assert not device.HasField("topology"), device
                else:
                    assert [n.ID for n in device.topology.nodes] == [node], device

    run(scenario())


def test_preferred_allocation_over_the_socket_follows_the_grant_then_the_freest_gpu(tmp_path: Path) -> None:
    one = make_pod("one")
    two = make_pod("two", containers=[("main", 2)])
    kube = FakeKube([one])
    available = [slice_id(GPU0, n) for n in range(4)] + [slice_id(GPU1, 2), slice_id(GPU1, 3)]

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (daemon, kubelet):
            # Nothing awaits Allocate (within the plugin's lookup wait): slices of the GPU with the most free slices.
            alone = await asyncio.gather(kubelet.preferred(available, [], 1), kubelet.preferred(available, [], 2))
            assert alone == [[slice_id(GPU0, 0)], [slice_id(GPU0, 0), slice_id(GPU0, 1)]]
            # The kubelet asks before the plugin's watch shows the pod granted GPU1: the hint waits for it, and the
            # slice comes from GPU1, though GPU0 has more free.
            asking = asyncio.ensure_future(kubelet.preferred(available, [], 1))
            await asyncio.sleep(0.2)
            kube.annotate(uid_of(one), ALLOC, allocation(uid_of(one), gpus=[grant(GPU1, index=1)]))
            assert await asking == [slice_id(GPU1, 2)]
            assert (p := daemon.cache.get(uid_of(one))) is not None and p.allocation is not None
            await kubelet.allocate(slice_id(GPU1, 2), pod="one")
            await receipt(kube, uid_of(one))
            # A two-GPU pod spans both of its GPUs; a must-include ID stays and comes first.
            both = [grant(GPU0), grant(GPU1, index=1)]
            kube.put(
                {**two, "metadata": {**two["metadata"], "annotations": {ALLOC: allocation(uid_of(two), gpus=both)}}}
            )
            await until(lambda: daemon.cache.get(uid_of(two)) is not None)
            assert await kubelet.preferred(available, [], 2) == [slice_id(GPU0, 0), slice_id(GPU1, 2)]
            assert await kubelet.preferred(available, [slice_id(GPU1, 3)], 2) == [slice_id(GPU1, 3), slice_id(GPU0, 0)]

    run(scenario())


def test_registration_request_matches_the_api(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with plugin(tmp_path, FakeKube(), gpu_file(tmp_path / "gpus.yaml")) as (_, kubelet):
            (request,) = kubelet.requests
            assert request.version == "v1beta1"
            assert request.endpoint == "tf-vgpu.sock"  # a file name relative to the plugin dir
            assert request.resource_name == RESOURCE_VGPU
            assert request.options.get_preferred_allocation_available
            assert request.options.pre_start_required  # where a grant is proven before the container exists

    run(scenario())


def test_list_and_watch_follows_faults_and_recovery_and_inventory_follows(tmp_path: Path) -> None:
    async def scenario() -> None:
        kube = FakeKube()
        gpus = gpu_file(tmp_path / "gpus.yaml")
        async with plugin(tmp_path, kube, gpus, health_recovery=0.3) as (_daemon, kubelet):
            assert all(h == "Healthy" for _, h in await kubelet.next_list())
            gpu_file(gpus, fail={GPU1: "fell off the bus"})
            devices = dict(await kubelet.next_list())
            assert {d for d, h in devices.items() if h == "Unhealthy"} == {slice_id(GPU1, n) for n in range(4)}
            await until(lambda: inventory_health(kube).get(GPU1) == "Unhealthy")
            gpu_file(gpus)  # clean again: healthy after the recovery interval
            devices = dict(await kubelet.next_list())
            assert all(h == "Healthy" for h in devices.values())
            await until(lambda: inventory_health(kube).get(GPU1) == "Healthy")
            gpu_file(gpus, events=[(GPU0, 79)])  # a critical XID
            devices = dict(await kubelet.next_list())
            assert {d for d, h in devices.items() if h == "Unhealthy"} == {slice_id(GPU0, n) for n in range(4)}
            # Each flip is an Event on the node, in order: what `kubectl describe node` shows.
            await until(lambda: len(kube.node_events) == 3)
            assert [(n, r, w) for n, r, _, w in kube.node_events] == [
                ("node-a", "GpuUnhealthy", True),
                ("node-a", "GpuHealthy", False),
                ("node-a", "GpuUnhealthy", True),
            ]
            assert f"GPU {GPU1} is unhealthy (fell off the bus)" in kube.node_events[0][2]
            assert f"GPU {GPU0} is unhealthy (XID 79)" in kube.node_events[2][2]

    run(scenario())


def inventory_health(kube: FakeKube) -> dict[str, str]:
    text = kube.get_node("node-a")["metadata"]["annotations"].get(SystemAnnotation.NODE_INVENTORY.value)
    if text is None:
        return {}
    return {g.uuid: g.health.value for g in decode_inventory(text).gpus}


def test_allocate_serves_pods_in_flight_even_before_their_allocation_arrives(tmp_path: Path) -> None:
    one = make_pod("one")
    two = make_pod("two", containers=[("main", 2)])
    done = make_pod("done", alloc="x", handoff="y")  # already handed off: never a candidate
    failed = make_pod("failed", phase="Failed")
    elsewhere = make_pod("elsewhere", node="node-b")
    kube = FakeKube([one, two, done, failed, elsewhere])
    for pod in (failed, elsewhere):
        kube.annotate(uid_of(pod), ALLOC, allocation(uid_of(pod), node=pod["spec"]["nodeName"]))

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (_daemon, kubelet):
            calls = asyncio.gather(
                kubelet.allocate(slice_id(GPU1, 0), pod="one"),
                kubelet.allocate(slice_id(GPU0, 1), slice_id(GPU1, 1), pod="two"),
            )
            await asyncio.sleep(0.1)  # the extender's annotations reach the watch after Allocate began
            kube.annotate(uid_of(one), ALLOC, allocation(uid_of(one), gpus=[grant(GPU0, tflops=31_200)]))
            both = [grant(GPU0, tflops=156_000, vram=8 * GIB), grant(GPU1, index=1, tflops=156_000, vram=8 * GIB)]
            kube.annotate(uid_of(two), ALLOC, allocation(uid_of(two), gpus=both))
            r_one, r_two = await calls
            env_one = dict(r_one.container_responses[0].envs)
            env_two = dict(r_two.container_responses[0].envs)
            # The physical GPU is the extender's choice, not the slice kubelet picked (GPU1's).
            assert toolkit_gpus(r_one.container_responses[0]) == GPU0
            assert json.loads(env_one[Env.TF_UP_LIMIT]) == {GPU0: 10}
            assert json.loads(env_one[Env.TF_MEM_LIMIT]) == {GPU0: 4 * GIB}
            assert env_one[Env.TF_POD_NAME] == "one"
            assert toolkit_gpus(r_two.container_responses[0]) == f"{GPU0},{GPU1}"
            assert json.loads(env_two[Env.TF_UP_LIMIT]) == {GPU0: 50, GPU1: 50}
            assert await receipt(kube, uid_of(one)) == {"main": (slice_id(GPU1, 0),)}
            assert await receipt(kube, uid_of(two)) == {"main": (slice_id(GPU0, 1), slice_id(GPU1, 1))}

    run(scenario())


def test_init_and_app_containers_are_served_in_kubelet_order(tmp_path: Path) -> None:
    # The capture's vgpu-multi pod: init gets vgpu-3, app a reuses it, app b gets vgpu-0.
    multi = make_pod("vgpu-multi", init=[("init", 1)], containers=[("a", 1), ("b", 1), ("nogpu", 0)])
    multi["metadata"]["annotations"][ALLOC] = allocation(uid_of(multi), containers=("a", "b", "init"))
    kube = FakeKube([multi])

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (_daemon, kubelet):
            names = []
            for container, ids in (
                ("init", [slice_id(GPU0, 3)]),
                ("a", [slice_id(GPU0, 3)]),
                ("b", [slice_id(GPU0, 0)]),
            ):
                response = await kubelet.allocate(*ids, pod="vgpu-multi", container=container)
                names.append(response.container_responses[0].envs[Env.TF_CONTAINER_NAME])
            assert names == ["init", "a", "b"]
            assert await receipt(kube, uid_of(multi)) == {
                "init": (slice_id(GPU0, 3),),
                "a": (slice_id(GPU0, 3),),
                "b": (slice_id(GPU0, 0),),
            }

    run(scenario())


ERROR_CASES = {
    "missing": ([], "no pod on node node-a awaits an allocation of 1"),
    "forged-uid": (
        [make_pod("forged", uid="11111111-0000-4000-8000-000000000001")],
        "is for pod UID 99999999-0000-4000-8000-000000000009 but this pod's UID is",
    ),
    "wrong-node": ([make_pod("moved")], "allocation is for node node-b but this is node node-a"),
    "unknown-gpu": ([make_pod("ghost")], "names GPU GPU-ffffffff, which node node-a does not have"),
    "over-capacity": ([make_pod("greedy")], "TFLOPS limit 400 exceeds the GPU's capacity 312"),
    "ambiguous": ([make_pod("twin-a"), make_pod("twin-b")], "ambiguous: 2 pods on node node-a"),
}


def _allocation_for(case: str, uid: str) -> str:
    if case == "forged-uid":
        return allocation("99999999-0000-4000-8000-000000000009")
    if case == "wrong-node":
        return allocation(uid, node="node-b")
    if case == "unknown-gpu":
        return allocation(uid, gpus=[grant("GPU-ffffffff")])
    if case == "over-capacity":
        return allocation(uid, gpus=[grant(GPU0, tflops=400_000)])
    return allocation(uid)


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_allocate_errors_say_exactly_why(tmp_path: Path, case: str) -> None:
    pods, expected = ERROR_CASES[case]
    pods = copy.deepcopy(pods)
    for pod in pods:
        pod["metadata"]["annotations"][ALLOC] = _allocation_for(case, uid_of(pod))
    kube = FakeKube(pods)

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), lookup_wait=0.1) as (_, kubelet):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.allocate(slice_id(GPU0, 0))
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert expected in (err.value.details() or "")
            assert all(kube.annotation(uid_of(p), HANDOFF) is None for p in pods)

    run(scenario())


def test_kubelet_restart_reregisters_within_two_seconds_and_keeps_allocations(tmp_path: Path) -> None:
    first = make_pod("first")
    first["metadata"]["annotations"][ALLOC] = allocation(uid_of(first))
    second = make_pod("second", containers=[("main", 2)])
    kube = FakeKube([first, second])

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (_daemon, kubelet):
            await kubelet.allocate(slice_id(GPU0, 0), pod="first")
            await receipt(kube, uid_of(first))
            await kubelet.stop()  # deletes every socket, like kubelet's device manager on start
            restarted = TestKubelet(tmp_path)
            began = time.monotonic()
            await restarted.start()
            request = await asyncio.wait_for(restarted.registrations.get(), 2.0)
            assert time.monotonic() - began <= 2.0
            assert request.resource_name == RESOURCE_VGPU and request.endpoint == "tf-vgpu.sock"
            assert len(await restarted.next_list()) == 8
            both = [grant(GPU0), grant(GPU1, index=1)]
            kube.annotate(uid_of(second), ALLOC, allocation(uid_of(second), gpus=both))
            response = await restarted.allocate(slice_id(GPU0, 2), slice_id(GPU1, 2), pod="second")
            assert toolkit_gpus(response.container_responses[0]) == f"{GPU0},{GPU1}"
            assert await receipt(kube, uid_of(first)) == {"main": (slice_id(GPU0, 0),)}
            await restarted.stop()

    run(scenario())


def test_plugin_restart_serves_new_pods_and_reallocation_of_recorded_ones(tmp_path: Path) -> None:
    old = make_pod("old")
    old["metadata"]["annotations"][ALLOC] = allocation(uid_of(old), gpus=[grant(GPU1, index=1)])
    new = make_pod("new")
    kube = FakeKube([old, new])

    async def scenario() -> None:
        kubelet = TestKubelet(tmp_path)
        await kubelet.start()
        gpus = gpu_file(tmp_path / "gpus.yaml")
        async with plugin(tmp_path, kube, gpus, kubelet=kubelet):
            await kubelet.allocate(slice_id(GPU1, 3), pod="old")
            await receipt(kube, uid_of(old))
        assert not (tmp_path / "tf-vgpu.sock").exists()
        async with plugin(tmp_path, kube, gpus, kubelet=kubelet):
            # After a node reboot the kubelet re-allocates the recorded IDs: same pod, same answer.
            again = await kubelet.allocate(slice_id(GPU1, 3))
            assert again.container_responses[0].envs[Env.TF_POD_NAME] == "old"
            kube.annotate(uid_of(new), ALLOC, allocation(uid_of(new)))
            fresh = await kubelet.allocate(slice_id(GPU0, 0), pod="new")
            assert fresh.container_responses[0].envs[Env.TF_POD_NAME] == "new"
            assert await receipt(kube, uid_of(new)) == {"main": (slice_id(GPU0, 0),)}
        await kubelet.stop()

    run(scenario())


# --- a lagging watch (end to end: a namespace of deletions streamed through it while pods bound) ---


def _bound(name: str, **kw: object) -> dict[str, object]:
    """A pod the extender bound to this node: its allocation is written before the binding."""
    pod = make_pod(name, **kw)  # type: ignore[arg-type]
    pod["metadata"]["annotations"][ALLOC] = allocation(uid_of(pod))
    return pod


def test_a_pod_the_watch_has_not_delivered_yet_is_served_at_once(tmp_path: Path) -> None:
    kube = FakeKube()

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), lookup_wait=5) as (daemon, kubelet):
            kube.watch_held.set()
            late = _bound("late")
            kube.put(late)
            began = time.monotonic()
            response = await kubelet.allocate(slice_id(GPU0, 0), pod="late")
            assert time.monotonic() - began < 1.0  # not after the lookup wait: from the fresh read
            assert response.container_responses[0].envs[Env.TF_POD_NAME] == "late"
            assert daemon.cache.get(uid_of(late)) is not None  # the read was fed to the cache too
            assert await receipt(kube, uid_of(late)) == {"main": (slice_id(GPU0, 0),)}

    run(scenario())


def test_a_deleted_pod_and_its_successor_never_shift_allocations(tmp_path: Path) -> None:
    # The e2e failure: the kubelet admits A while the watch lags; A is deleted, the gate lets B bind.
    # Matching on the cache served B's allocation to A's container, B's to nothing, and refused the last.
    kube = FakeKube()

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), lookup_wait=2) as (_, kubelet):
            kube.watch_held.set()
            a = _bound("a")
            kube.put(a)
            for_a = asyncio.create_task(kubelet.allocate(slice_id(GPU0, 0), pod="a"))
            await asyncio.sleep(0.2)
            kube.delete(uid_of(a))
            kube.put(_bound("b"))
            kube.watch_held.clear()
            assert (await for_a).container_responses[0].envs[Env.TF_POD_NAME] == "a"
            for_b = await kubelet.allocate(slice_id(GPU0, 1), pod="b")
            assert for_b.container_responses[0].envs[Env.TF_POD_NAME] == "b"

    run(scenario())


def test_a_stale_cache_never_serves_a_pod_the_api_no_longer_has(tmp_path: Path) -> None:
    gone, alone = _bound("gone"), _bound("alone")
    kube = FakeKube([gone, alone])

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), lookup_wait=0.2) as (daemon, kubelet):
            await until(lambda: daemon.cache.get(uid_of(gone)) is not None)
            kube.watch_held.set()  # the cache still shows both: "ambiguous" there, one pod in the API
            kube.delete(uid_of(gone))
            response = await kubelet.allocate(slice_id(GPU0, 0), pod="alone")
            assert response.container_responses[0].envs[Env.TF_POD_NAME] == "alone"
            await receipt(kube, uid_of(alone))
            kube.delete(uid_of(alone))  # the held watch still shows "gone" awaiting: never served from there
            successor = _bound("successor")
            kube.put(successor)
            response = await kubelet.allocate(slice_id(GPU0, 1), pod="successor")
            assert response.container_responses[0].envs[Env.TF_POD_NAME] == "successor"
            await receipt(kube, uid_of(successor))
            kube.delete(uid_of(successor))
            with pytest.raises(grpc.aio.AioRpcError) as err:  # truly absent: the same clear error
                await kubelet.allocate(slice_id(GPU0, 2))
            assert "no pod on node node-a awaits an allocation of 1" in (err.value.details() or "")

    run(scenario())


def test_two_pods_awaiting_in_the_api_stay_ambiguous_while_the_watch_lags(tmp_path: Path) -> None:
    kube = FakeKube()

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (_, kubelet):
            kube.watch_held.set()
            kube.put(_bound("twin-a"))
            kube.put(_bound("twin-b"))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.allocate(slice_id(GPU0, 0))
            assert "ambiguous: 2 pods on node node-a" in (err.value.details() or "")
            assert kube.pod_patches == []

    run(scenario())


def test_a_pod_bound_after_the_allocate_arrived_is_never_its_pod(tmp_path: Path) -> None:
    kube = FakeKube()

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), lookup_wait=0.5) as (_, kubelet):
            call = asyncio.create_task(kubelet.allocate(slice_id(GPU0, 0)))
            await asyncio.sleep(0.1)
            later = _bound("later")
            kube.put(later)  # the kubelet is admitting some other pod: this one was not bound yet
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert "no pod on node node-a awaits" in (err.value.details() or "")
            assert kube.annotation(uid_of(later), HANDOFF) is None

    run(scenario())


def test_without_the_api_allocate_still_serves_from_the_watch(tmp_path: Path) -> None:
    pod = _bound("cached")
    kube = FakeKube([pod])

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (daemon, kubelet):
            await until(lambda: daemon.cache.get(uid_of(pod)) is not None)
            kube.fail_pod_lists = 1
            response = await kubelet.allocate(slice_id(GPU0, 0))
            assert response.container_responses[0].envs[Env.TF_POD_NAME] == "cached"
            assert kube.fail_pod_lists == 0

    run(scenario())


# --- a node reboot: every pod re-allocated at once ---


def test_allocates_arriving_together_share_one_list_and_its_failure(tmp_path: Path) -> None:
    pods = []
    for i in range(8):
        pod = _bound(f"p{i}")
        receipt = Handoff(pod_uid=uid_of(pod), node="node-a", devices=(("main", (slice_id(GPU0, i),)),), at="t")
        pod["metadata"]["annotations"][HANDOFF] = encode_handoff(receipt)  # type: ignore[index]
        pods.append(pod)
    kube = CountingKube(pods)

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (daemon, _):
            await until(lambda: len(list(daemon.cache.pods())) == 8)
            allocator, before = daemon.allocator, kube.lists

            async def burst() -> list[str]:
                grants = await asyncio.gather(*(allocator.allocate((slice_id(GPU0, i),)) for i in range(8)))
                return [g.envs[Env.TF_POD_NAME] for g in grants]

            assert await burst() == [f"p{i}" for i in range(8)]
            assert kube.lists == before + 1
            kube.fail_pod_lists = 1  # the shared LIST fails: each Allocate falls back to the watch, counted
            assert await burst() == [f"p{i}" for i in range(8)]
            assert kube.lists == before + 2
            failed = daemon.metrics.registry.get_sample_value("tf_device_plugin_errors_total", {"where": "pod_list"})
            assert failed == 8

    run(scenario())


# --- a pod that reached the node without the extender (preset nodeName, a Binding posted by hand) ---


@pytest.mark.parametrize("rogue_namespace", ["default", "tenant-b"], ids=["same-namespace", "other-namespace"])
def test_a_rogue_pod_admitted_first_takes_no_grant_and_the_pod_in_hand_off_gets_its_own(
    tmp_path: Path, rogue_namespace: str
) -> None:
    # The kubelet admits the rogue (no allocation) while "legit" is in hand-off: the request cannot tell
    # them apart, so the answer carries legit's grant, but the kubelet's record shows whose it became.
    legit = _bound("legit")
    rogue = make_pod("rogue", namespace=rogue_namespace)
    kube = FakeKube([legit, rogue])

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (daemon, kubelet):
            stolen = await kubelet.allocate(slice_id(GPU1, 0), pod="rogue", namespace=rogue_namespace)
            assert stolen.container_responses[0].envs[Env.TF_POD_NAME] == "legit"  # the request says no more
            own = await kubelet.allocate(slice_id(GPU0, 3), pod="legit")
            assert own.container_responses[0].envs[Env.TF_POD_NAME] == "legit"
            assert await receipt(kube, uid_of(legit)) == {"main": (slice_id(GPU0, 3),)}
            assert kube.annotation(uid_of(rogue), HANDOFF) is None
            await kubelet.prestart(slice_id(GPU0, 3))  # legit's container starts
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.prestart(slice_id(GPU1, 0))  # the rogue's never does
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert (
                f"pod {rogue_namespace}/rogue (container main) was admitted with devices ['{slice_id(GPU1, 0)}'], "
                "but the Allocate that gave them answered with pod default/legit's GPU grant"
            ) in (err.value.details() or "")
            stolen_count = daemon.metrics.registry.get_sample_value(
                "tf_device_plugin_errors_total", {"where": "stolen_answer"}
            )
            assert stolen_count == 1

    run(scenario())


def test_a_rogue_pod_admitted_after_the_hand_off_fails_allocate(tmp_path: Path) -> None:
    legit = _bound("legit")
    kube = FakeKube([legit, make_pod("rogue")])

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), lookup_wait=0.1) as (_, kubelet):
            await kubelet.allocate(slice_id(GPU0, 0), pod="legit")
            await receipt(kube, uid_of(legit))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.allocate(slice_id(GPU0, 1), pod="rogue")
            assert "no pod on node node-a awaits an allocation of 1" in (err.value.details() or "")

    run(scenario())


def test_a_pod_in_hand_off_is_not_released_until_the_kubelet_records_its_devices(tmp_path: Path) -> None:
    # An answer the kubelet never recorded (it abandoned the admission) is not a hand-off.
    legit = _bound("legit")
    kube = FakeKube([legit])

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (daemon, kubelet):
            await kubelet.allocate(slice_id(GPU0, 0))  # not recorded
            await asyncio.sleep(0.3)
            assert kube.annotation(uid_of(legit), HANDOFF) is None
            assert daemon.allocator.served() == {uid_of(legit): frozenset({"main"})}
            kubelet.records[("default", "legit")] = {"main": (slice_id(GPU0, 0),)}  # recorded late
            await daemon.keeper.reconcile_once(daemon.allocator)
            assert await receipt(kube, uid_of(legit)) == {"main": (slice_id(GPU0, 0),)}

    run(scenario())


def test_prestart_proves_a_grant_from_the_receipt_after_a_plugin_restart_and_refuses_the_unknown(
    tmp_path: Path,
) -> None:
    legit = _bound("legit")
    kube = FakeKube([legit, make_pod("stranger")])

    async def scenario() -> None:
        kubelet = TestKubelet(tmp_path)
        await kubelet.start()
        gpus = gpu_file(tmp_path / "gpus.yaml")
        async with plugin(tmp_path, kube, gpus, kubelet=kubelet):
            await kubelet.allocate(slice_id(GPU0, 0), pod="legit")
            await receipt(kube, uid_of(legit))
        kubelet.records[("default", "stranger")] = {"main": (slice_id(GPU0, 1),)}
        async with plugin(tmp_path, kube, gpus, kubelet=kubelet):  # nothing in memory: the receipt proves it
            await kubelet.prestart(slice_id(GPU0, 0))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.prestart(slice_id(GPU0, 1))
            assert "no tensor-fusion grant is proven for pod default/stranger (container main)" in (
                err.value.details() or ""
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.prestart(slice_id(GPU1, 3))
            assert "PodResources shows no container holding devices" in (err.value.details() or "")
        await kubelet.stop()

    run(scenario())


def _split_pod() -> dict[str, Any]:
    """container-gpu-count {"pre": 1, "inference": 1}: the grant's GPU1 is pre's, GPU0 inference's."""
    pod = make_pod("split", containers=[("pre", 1), ("inference", 1)])
    pod["metadata"]["annotations"][ALLOC] = allocation(
        uid_of(pod),
        containers=("pre", "inference"),
        gpus=[grant(GPU0), grant(GPU1, index=1, tflops=20_000)],
        container_gpus=(("pre", (GPU1,)), ("inference", (GPU0,))),
    )
    return pod


def test_each_container_of_a_split_grant_is_steered_to_served_with_and_proven_on_its_own_gpu(tmp_path: Path) -> None:
    split = _split_pod()
    kube = FakeKube([split])
    available = [slice_id(gpu, n) for gpu in (GPU0, GPU1) for n in range(4)]

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (daemon, kubelet):
            await until(lambda: daemon.cache.get(uid_of(split)) is not None)
            got = {}
            for container, gpu, tflops in (("pre", GPU1, 20), ("inference", GPU0, 10)):
                [device] = await kubelet.preferred(available, [], 1)
                assert gpu_of(device) == gpu, container  # the kubelet is steered to the container's own GPU
                envs = (await kubelet.allocate(device, pod="split", container=container)).container_responses[0].envs
                assert json.loads(envs[Env.TF_UP_LIMIT_TFLOPS]) == {gpu: tflops}, container
                assert envs[Env.TF_CONTAINER_NAME] == container
                got[container] = (device,)
            assert await receipt(kube, uid_of(split)) == got
            for (device,) in got.values():
                await kubelet.prestart(device)

    run(scenario())


def test_an_answer_the_kubelet_gave_another_container_of_the_pod_never_starts(tmp_path: Path) -> None:
    """The answer for pre (GPU1, its own) recorded by the kubelet for inference, whose GPU is GPU0: inference
    would run on its sibling's GPU, so it is never proven, never starts, and the pod gets no receipt."""
    split = _split_pod()
    kube = FakeKube([split])

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml")) as (daemon, kubelet):
            await until(lambda: daemon.cache.get(uid_of(split)) is not None)
            response = await kubelet.allocate(slice_id(GPU1, 0), pod="split", container="inference")
            assert response.container_responses[0].envs[Env.TF_CONTAINER_NAME] == "pre"
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.prestart(slice_id(GPU1, 0))
            assert "no tensor-fusion grant is proven for pod default/split (container inference)" in (
                err.value.details() or ""
            )
            assert kube.annotation(uid_of(split), HANDOFF) is None

    run(scenario())
