"""``tfctl plan``: argument parsing, the input formats, and the answer on a cluster small enough to check."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfctl import planning
from tfctl.main import parser
from vgpu.catalog import builtin

CLUSTER = """
nodes:
  - name: t4
    count: 2
    gpu_model: T4
    gpus: 2
    cpu: "16"
    memory: 64Gi
"""

PODS = """
pods:
  - {name: half, replicas: 4, tflops: "32", vram: 7Gi, cpu: "1", memory: 1Gi}
  - {name: whole, replicas: 2, whole_gpu: true, cpu: "2", memory: 2Gi}
  - {name: huge, gpu_count: 4, whole_gpu: true}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_subcommand_parses_its_flags() -> None:
    args = parser().parse_args(["plan", "pods.yaml", "cluster.yaml", "--policy", "binpack", "--shuffle", "3"])
    assert args.run is planning.run
    assert (args.pods, args.cluster, args.policy, args.shuffle) == (
        Path("pods.yaml"),
        Path("cluster.yaml"),
        ["binpack"],
        3,
    )
    assert args.show_dropped == 10


def test_cluster_yaml_expands_counts_and_takes_gpu_sizes_from_the_catalog(tmp_path: Path) -> None:
    nodes = planning.load_cluster(write(tmp_path, "c.yaml", CLUSTER), builtin())
    assert [n.name for n in nodes] == ["t4-0", "t4-1"]
    t4 = builtin().lookup("T4")
    assert t4 is not None
    assert nodes[0].gpus[0].tflops == t4.tflops_milli
    assert nodes[0].cpu_free == 16_000


def test_unknown_models_need_explicit_sizes(tmp_path: Path) -> None:
    bad = write(tmp_path, "c.yaml", "nodes: [{name: x, gpu_model: G9, gpus: 1}]")
    with pytest.raises(planning.PlanError, match="not in the catalog"):
        planning.load_cluster(bad, builtin())
    ok = write(tmp_path, "d.yaml", "nodes: [{name: x, gpu_model: G9, gpus: 1, tflops: '100', vram: 16Gi}]")
    assert planning.load_cluster(ok, builtin())[0].gpus[0].vram == 16 * 1024**3


def test_pod_csv_replicas_and_quantities(tmp_path: Path) -> None:
    csv_file = write(tmp_path, "p.csv", "name,replicas,tflops,vram,cpu,memory\ninfer,3,10,4Gi,500m,1Gi\n")
    demands = planning.load_pods(csv_file, [])
    assert [d.pod_key for d in demands] == ["plan/infer-0", "plan/infer-1", "plan/infer-2"]
    assert (demands[0].tflops, demands[0].vram, demands[0].cpu, demands[0].gpu_count) == (10_000, 4 * 1024**3, 500, 1)


def test_openb_share_rows_need_one_gpu_size(tmp_path: Path) -> None:
    rows = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,4000,1024,1,250,T4|P100\n"
    nodes = planning.load_cluster(write(tmp_path, "c.yaml", CLUSTER), builtin())
    (d,) = planning.load_pods(write(tmp_path, "p.csv", rows), nodes)
    assert d.tflops == nodes[0].gpus[0].tflops // 4
    assert d.node_affinity is not None
    mixed = nodes + planning.load_cluster(write(tmp_path, "a.yaml", CLUSTER.replace("T4", "A10")), builtin())
    with pytest.raises(planning.PlanError, match="single GPU size"):
        planning.load_pods(write(tmp_path, "q.csv", rows), mixed)


def test_plan_reports_what_fits_per_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(
        ["plan", str(write(tmp_path, "p.yaml", PODS)), str(write(tmp_path, "c.yaml", CLUSTER)), "--policy", "binpack"]
    )
    assert args.run(args) == 3  # the 4-GPU pod fits on no 2-GPU node
    out = capsys.readouterr().out
    assert "7 pods on 2 nodes / 4 GPUs" in out
    assert "binpack" in out and "6/7" in out
    assert "did not fit: plan/huge" in out


def test_every_pod_fitting_exits_zero(tmp_path: Path) -> None:
    pods = write(tmp_path, "p.yaml", "- {name: a, tflops: '10', vram: 1Gi}\n")
    args = parser().parse_args(["plan", str(pods), str(write(tmp_path, "c.yaml", CLUSTER))])
    assert args.run(args) == 0


def test_unusable_input_is_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = write(tmp_path, "p.yaml", "- {name: a, tflops: '10', vram: 1Gi}\n")
    args = parser().parse_args(["plan", str(pods), str(write(tmp_path, "c.yaml", "nodes: 3"))])
    assert args.run(args) == 2
    assert "expected a YAML object with a 'nodes' list" in capsys.readouterr().err
