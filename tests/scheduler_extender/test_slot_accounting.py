"""vGPU slots in the extender shell: read from inventories and pod specs, counted by the cache, refused by filter.

The fake nodes advertise 4 slices per GPU (2 GPUs: 8 device IDs). A pod's IDs come from its spec by
the kubelet's rule, so a pod with two GPU containers holds two on its GPU; a pod whose spec asks for
none yet counts what the webhook will inject.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scheduler_extender.cache import ClusterCache
from scheduler_extender.gateway import Kind
from scheduler_extender.handoff import HandoffGate
from scheduler_extender.objects import node_state, pod_record, scheduled_pod
from tests.scheduler_extender.conftest import Running
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tests.scheduler_extender.test_cache import allocated_pod, grant
from vgpu.names import RESOURCE_VGPU

SLOTS = f"insufficient {RESOURCE_VGPU} slots"


def with_vgpu(pod: dict[str, Any], *per_container: int) -> dict[str, Any]:
    """The pod with one container per count, each with that ``tensor-fusion.ai/vgpu`` limit (as the webhook writes)."""
    pod["spec"]["containers"] = [
        {"name": f"c{i}", "resources": {"limits": {RESOURCE_VGPU: str(n)}, "requests": {RESOURCE_VGPU: str(n)}}}
        for i, n in enumerate(per_container)
    ]
    return pod


def test_each_gpu_gets_the_slices_its_node_publishes() -> None:
    assert [g.slots for g in node_state(make_node("n1"), "default-pool").gpus] == [4, 4]


def test_a_pods_slots_come_from_its_spec_else_from_what_the_webhook_injects() -> None:
    assert scheduled_pod(with_vgpu(make_pod("p", gpu_request()), 1, 1)).device_ids == 2
    assert scheduled_pod(make_pod("p", gpu_request())).device_ids is None
    two_containers = with_vgpu(allocated_pod("a", "n1", grant("n1", 0), grant("n1", 1)), 2, 2)
    assert pod_record(two_containers).slots == 2  # 4 IDs over 2 GPUs
    assert pod_record(allocated_pod("b", "n1")).slots == 1  # no vGPU in its spec: one per container


def test_the_cache_counts_each_pods_ids_on_its_gpus_and_node_and_frees_them() -> None:
    cache = ClusterCache(default_pool="default-pool", gate=HandoffGate(ttl=60), clock=lambda: 0.0)
    cache.replace(Kind.NODE, [make_node("n1")])
    two = with_vgpu(allocated_pod("two", "n1", grant("n1", 0)), 1, 1)
    cache.replace(Kind.POD, [two, allocated_pod("one", "n1", grant("n1", 1))])
    view = cache.node("n1")
    assert view is not None and [g.slots_used for g in view.gpus] == [2, 1] and view.slots_used == 3
    cache.replace(Kind.POD, [two])
    view = cache.node("n1")
    assert view is not None and [g.slots_used for g in view.gpus] == [2, 0] and view.slots_used == 2


def test_pods_bound_past_a_gpus_slices_are_all_counted_and_leave_it_no_room() -> None:
    cache = ClusterCache(default_pool="default-pool", gate=HandoffGate(ttl=60), clock=lambda: 0.0)
    cache.replace(Kind.NODE, [make_node("n1")])
    crowd = [allocated_pod(f"p{i}", "n1", grant("n1", 0, vram=GI)) for i in range(6)]  # 6 on 4 slices
    cache.replace(Kind.POD, crowd)
    view = cache.node("n1")
    assert cache.conflicts() == {}  # none left uncounted (their VRAM included)
    assert view is not None and (view.gpus[0].slots_used, view.gpus[0].vram_used) == (6, 6 * GI)


def test_a_node_out_of_slots_is_a_filter_reason_shown_by_explain_until_a_pod_goes(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    fake.put(Kind.NODE, make_node("n1"))
    for i in range(8):  # 2 GPUs x 4 slices, 1 GiB of 80 each: VRAM and TFLOPS are far from full
        fake.put(Kind.POD, with_vgpu(allocated_pod(f"p{i}", "n1", grant("n1", i % 2, vram=GI)), 1))
    fake.put(Kind.POD, with_vgpu(make_pod("new", gpu_request(vram=GI)), 1))
    app = run()
    body = {"Pod": fake.pod("default", "new"), "Nodes": None, "NodeNames": ["n1"]}
    reply = app.post("/filter", body)
    message = f"{SLOTS} on node n1: requested 1, free 0 of 8"
    assert reply["NodeNames"] == [] and reply["FailedNodes"] == {"n1": message}
    explained = app.client.get("/explain/default/new").json()
    assert explained["nodes"]["n1"] == {"verdict": "unschedulable", "reason": message, "code": "insufficient-slots"}
    assert explained["summary"] == f"0/1 nodes: 1 {SLOTS} (need 1, most free 0)"
    fake.delete(Kind.POD, "default/p3")
    app.settle()
    assert app.post("/filter", body)["NodeNames"] == ["n1"]


def hand_bound(name: str, node: str, ids: int, phase: str = "Running") -> dict[str, Any]:
    """A pod bound to ``node`` outside the extender (a Binding posted by hand, a static pod): it asks for
    vGPU device IDs, which the kubelet gives it, but carries no allocation."""
    pod = with_vgpu(make_pod(name, gpu_request()), ids)
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = phase
    return pod


def test_device_ids_held_without_an_allocation_still_count_against_the_node(
    run: Callable[..., Running], fake: FakeGateway
) -> None:
    # Otherwise a pod bound by hand, which the kubelet gave IDs, lets the extender bind a pod the kubelet
    # must then fail with "requested number of devices unavailable".
    fake.put(Kind.NODE, make_node("n1"))  # 8 device IDs
    for i in range(6):
        fake.put(Kind.POD, with_vgpu(allocated_pod(f"p{i}", "n1", grant("n1", i % 2, vram=GI)), 1))
    fake.put(Kind.POD, hand_bound("rogue", "n1", 2))
    fake.put(Kind.POD, hand_bound("done", "n1", 2, phase="Failed"))  # a finished pod holds none
    fake.put(Kind.POD, with_vgpu(make_pod("new", gpu_request(vram=GI)), 1))
    app = run()
    view = app.ext.cache.node("n1")
    assert view is not None and view.slots_used == 8
    body = {"Pod": fake.pod("default", "new"), "Nodes": None, "NodeNames": ["n1"]}
    assert app.post("/filter", body)["FailedNodes"] == {"n1": f"{SLOTS} on node n1: requested 1, free 0 of 8"}
    fake.delete(Kind.POD, "default/rogue")
    app.settle()
    assert app.post("/filter", body)["NodeNames"] == ["n1"]
