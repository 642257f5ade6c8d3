"""tfctl's input errors: each names the key or value and what is accepted, and exits non-zero.

A misspelt key once gave a wrong plan with exit 0, an unknown policy a traceback, and a manifest of
the wrong kind "not a GPU pod" with exit 0; a person reading the terminal must never mistake a bad
input for an answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tfctl.main import main

CLUSTER = "nodes:\n  - {name: a, gpu_model: T4, gpus: 2}\n"
PODS = "- {name: p, tflops: '10', vram: 1Gi}\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("pods", "cluster", "message"),
    [
        (
            PODS,
            "nodes:\n  - {name: a, gpu_model: T4, gpu: 2}\n",
            "nodes[0]: unknown key 'gpu'; did you mean 'gpus'? accepted keys: name, count, gpus, gpu_model, tflops, "
            "vram, cpu, memory, pool, labels",
        ),
        (
            "- {name: p, tflop: '10', vram: 1Gi}\n",
            CLUSTER,
            "pod p: unknown key 'tflop'; did you mean 'tflops'? accepted keys: name, replicas, tflops, vram, "
            "gpu_count, gpu_model, whole_gpu, cpu, memory",
        ),
    ],
    ids=["node-key", "pod-key"],
)
def test_plan_refuses_a_misspelt_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pods: str, cluster: str, message: str
) -> None:
    code = main(["plan", str(write(tmp_path, "p.yaml", pods)), str(write(tmp_path, "c.yaml", cluster))])
    assert code == 2
    assert message in capsys.readouterr().err


def test_plan_refuses_an_unknown_policy_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", str(write(tmp_path, "p.yaml", PODS)), str(write(tmp_path, "c.yaml", CLUSTER)), "--policy", "foo"]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --policy: invalid choice: 'foo' (choose from" in err and "binpack" in err
    assert "Traceback" not in err


def test_resolve_refuses_a_manifest_that_is_not_a_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = write(tmp_path, "profile.yaml", "kind: WorkloadProfile\nmetadata: {name: x}\nspec: {}\n")
    assert main(["resolve", str(profile)]) == 1
    err = capsys.readouterr().err
    assert (
        f"{profile}: kind 'WorkloadProfile': not a pod; accepted: Pod, Deployment, StatefulSet, DaemonSet, "
        "ReplicaSet, Job"
    ) in err


def test_resolve_still_says_an_unlabelled_pod_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = write(tmp_path, "pod.yaml", "kind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: c}]}\n")
    assert main(["resolve", str(pod)]) == 0
    assert "not a GPU pod" in capsys.readouterr().out
