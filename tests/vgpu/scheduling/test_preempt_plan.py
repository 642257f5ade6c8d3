"""Where the extender's own preemption evicts (GPU fragmentation): the node and victims ``plan`` picks.

The case kube-scheduler cannot see: the node's totals have room for the pod, no single GPU has.
"""

from __future__ import annotations

from tests.vgpu.scheduling.builders import CATALOG, make_demand, make_gpu, make_node
from vgpu.contract.allocation import GpuGrant
from vgpu.names import Qos
from vgpu.quantity import parse_milli
from vgpu.scheduling.ledger import Ledger
from vgpu.scheduling.model import NodeState
from vgpu.scheduling.policy import Binpack
from vgpu.scheduling.preempt import Candidate, Victim, plan

POLICY = Binpack()


def pod(key: str, qos: Qos, uuid: str, tflops: str) -> Victim:
    t = parse_milli(tflops)
    grant = GpuGrant(
        uuid=uuid, index=0, tflops_request=t, tflops_limit=t, vram_request=0, vram_limit=0, gpu_tflops=312_000
    )
    return Victim(pod_key=key, qos=qos, grants=(grant,))


def loaded(node: NodeState, *pods: Victim) -> NodeState:
    ledger = Ledger()
    for v in pods:
        ledger = ledger.reserve(v.pod_key, node, v.grants, None, qos=v.qos, slots=v.slots)
    return ledger.apply_node(node)


def fragmented(name: str, low: Qos = Qos.LOW) -> tuple[NodeState, list[Victim]]:
    """Two A100s (312 TFLOPS), each with a 160-TFLOPS high pod and a 100-TFLOPS pod of ``low``: 104 free
    in total, 52 on each GPU."""
    gpus = [make_gpu(f"{name}-g{i}", index=i) for i in range(2)]
    pods = []
    for i in range(2):
        pods += [
            pod(f"ns/{name}-high-{i}", Qos.HIGH, f"{name}-g{i}", "160"),
            pod(f"ns/{name}-low-{i}", low, f"{name}-g{i}", "100"),
        ]
    return loaded(make_node(name, gpus=gpus), *pods), pods


def test_one_lower_qos_pod_is_evicted_from_a_fragmented_node_and_the_pod_gets_its_gpu() -> None:
    node, pods = fragmented("a")
    chosen = plan(
        make_demand(tflops="100", vram="0", qos=Qos.CRITICAL), [Candidate(node=node, victims=pods)], POLICY, CATALOG
    )
    assert chosen is not None
    assert chosen.node == "a" and len(chosen.victims) == 1 and chosen.victims[0].startswith("ns/a-low-")
    gpu = next(p.grants[0].uuid for p in pods if p.pod_key == chosen.victims[0])
    assert [g.uuid for g in chosen.grants] == [gpu]  # the GPU its victim frees


def test_equal_or_higher_qos_is_never_evicted() -> None:
    node, pods = fragmented("a")
    assert (
        plan(make_demand(tflops="100", vram="0", qos=Qos.LOW), [Candidate(node=node, victims=pods)], POLICY, CATALOG)
        is None
    )
    # medium may evict the low pods, but a pod that needs more than a low pod frees finds no plan
    medium = make_demand(tflops="100", vram="0", qos=Qos.MEDIUM)
    assert plan(medium, [Candidate(node=node, victims=pods)], POLICY, CATALOG) is not None
    assert (
        plan(make_demand(tflops="200", vram="0", qos=Qos.MEDIUM), [Candidate(node=node, victims=pods)], POLICY, CATALOG)
        is None
    )


def test_the_node_whose_victims_have_the_lowest_qos_wins_then_the_fewest() -> None:
    a, a_pods = fragmented("a", low=Qos.MEDIUM)
    b, b_pods = fragmented("b", low=Qos.LOW)
    demand = make_demand(tflops="100", vram="0", qos=Qos.CRITICAL)
    chosen = plan(demand, [Candidate(node=a, victims=a_pods), Candidate(node=b, victims=b_pods)], POLICY, CATALOG)
    assert chosen is not None and chosen.node == "b"
    # Same QoS everywhere: the node needing fewer victims. On c, two 60-TFLOPS low pods share each GPU
    # with the high one (160 + 2x60 = 280): the pod needs two of them gone from one GPU.
    gpus = [make_gpu(f"c-g{i}", index=i) for i in range(2)]
    c_pods = [pod(f"ns/c-high-{i}", Qos.HIGH, f"c-g{i}", "160") for i in range(2)]
    c_pods += [pod(f"ns/c-low-{i}{j}", Qos.LOW, f"c-g{i}", "60") for i in range(2) for j in range(2)]
    c = loaded(make_node("c", gpus=gpus), *c_pods)
    chosen = plan(demand, [Candidate(node=c, victims=c_pods), Candidate(node=b, victims=b_pods)], POLICY, CATALOG)
    assert chosen is not None and chosen.node == "b" and len(chosen.victims) == 1
    only_c = plan(demand, [Candidate(node=c, victims=c_pods)], POLICY, CATALOG)
    assert only_c is not None and len(only_c.victims) == 2 and len({v[:-1] for v in only_c.victims}) == 1


def test_pods_already_leaving_make_room_without_a_new_victim() -> None:
    node, pods = fragmented("a")
    leaving = [p for p in pods if p.pod_key == "ns/a-low-0"]
    rest = [p for p in pods if p not in leaving]
    chosen = plan(
        make_demand(tflops="100", vram="0", qos=Qos.CRITICAL),
        [Candidate(node=node, victims=rest, leaving=leaving)],
        POLICY,
        CATALOG,
    )
    assert chosen is not None and chosen.victims == () and [g.uuid for g in chosen.grants] == ["a-g0"]


def test_no_candidate_no_plan() -> None:
    assert plan(make_demand(qos=Qos.CRITICAL), [], POLICY, CATALOG) is None
