"""A MIG reconfiguration seen by the extender's cache: the instances a pod held vanish from the node's
inventory; the node's view follows at once, nothing fails, and the pod's entry goes with the pod."""

from __future__ import annotations

from scheduler_extender.cache import ClusterCache
from scheduler_extender.gateway import Kind
from scheduler_extender.handoff import HandoffGate
from tests.scheduler_extender.test_cache import allocated_pod
from tests.vgpu.scheduling.test_mig_placement import MIB, PARENT, UNITS, mig_node_object
from tf_shell.kube.api import WatchEvent
from vgpu.contract.allocation import GpuGrant

UNIT = UNITS[0]


def test_instances_removed_under_a_pod_leave_the_view_and_the_pod_entry_goes_with_the_pod() -> None:
    cache = ClusterCache(default_pool="default-pool", gate=HandoffGate(ttl=60), clock=lambda: 1000.0)
    cache.replace(Kind.NODE, [mig_node_object(UNIT)])
    grant = GpuGrant(
        uuid=UNIT,
        index=0,
        tflops_request=44_571,
        tflops_limit=44_571,
        vram_request=4864 * MIB,
        vram_limit=4864 * MIB,
        gpu_tflops=44_571,
    )
    pod = allocated_pod("p", "m", grant)
    cache.replace(Kind.POD, [pod])
    view = cache.node("m")
    assert view is not None and next(g for g in view.gpus if g.uuid == UNIT).tflops_used == 44_571
    # MIG off: the unit is gone, the GPU is whole again
    cache.apply(Kind.NODE, WatchEvent("MODIFIED", mig_node_object()))
    view = cache.node("m")
    assert view is not None and [(g.uuid, g.healthy, g.tflops_used) for g in view.gpus][:1] == [(PARENT, True, 0)]
    assert UNIT not in {g.uuid for g in view.gpus}
    assert "default/p" in cache.entries()  # the pod still runs on what it was granted: the kubelet's concern
    cache.apply(Kind.POD, WatchEvent("DELETED", pod))
    assert cache.entries() == {}
