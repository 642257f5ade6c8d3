"""The model-pinned trace family: rebuildable from (share, seed), and every pin plausible."""

from __future__ import annotations

from collections import Counter

from benchmarks.placement.pinned import hosts, label, pin
from benchmarks.placement.traces import TraceNode, TracePod

NODES = [
    *(TraceNode(f"g{i}", 96_000, 512_000, 8, "G2") for i in range(30)),
    *(TraceNode(f"v{i}", 32_000, 256_000, 4, "V100M32") for i in range(5)),
    *(TraceNode(f"t{i}", 16_000, 64_000, 1, "T4") for i in range(10)),
]
PODS = [
    *(TracePod(f"p{i:03d}", 4000, 8192, 1, 100 * (1 + i % 9)) for i in range(300)),
    *(TracePod(f"big{i}", 8000, 16384, 8, 1000) for i in range(20)),
    *(TracePod(f"cpu{i}", 2000, 4096, 0, 0) for i in range(30)),
]


def pinned_count(pods: list[TracePod]) -> int:
    return sum(1 for p in pods if p.gpu_spec)


def test_the_same_share_and_seed_rebuild_the_same_trace_whatever_the_input_order() -> None:
    a = pin(PODS, NODES, 0.25, 7)
    assert a == pin(list(reversed(PODS)), NODES, 0.25, 7)
    assert a != pin(PODS, NODES, 0.25, 8)
    assert [p.name for p in a] == sorted(p.name for p in PODS)


def test_the_share_is_of_the_gpu_pods_and_nothing_else_changes() -> None:
    for share in (0.0, 0.1, 0.33):
        out = pin(PODS, NODES, share, 7)
        assert pinned_count(out) == round(share * 320)
        assert all(not p.gpu_spec for p in out if p.num_gpu == 0)
        assert sorted((p.name, p.cpu, p.num_gpu, p.gpu_milli) for p in out) == sorted(
            (p.name, p.cpu, p.num_gpu, p.gpu_milli) for p in PODS
        )


def test_pods_are_pinned_only_where_they_fit_and_mostly_where_the_gpus_are() -> None:
    out = pin(PODS, NODES, 0.33, 7)
    by_model: Counter[str] = Counter()
    for p in out:
        if p.gpu_spec:
            assert set(p.gpu_spec) <= set(hosts(p, NODES))
            by_model.update(p.gpu_spec)
    assert all(p.gpu_spec in ((), ("G2",)) for p in out if p.num_gpu == 8)  # only G2 nodes have 8 GPUs
    assert by_model["G2"] > by_model["V100M32"] > by_model["T4"] > 0  # 240, 20 and 10 GPUs
    assert any(len(p.gpu_spec) == 2 for p in out)  # some accept a `|` list of two models


def test_rows_are_named_by_trace_share_and_seed() -> None:
    assert label("default", 0.25, 7) == "default+pin25/7"
