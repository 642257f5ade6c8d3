"""``tfctl autoscale``: one line per autoscaled TensorFusionWorkload from its status — the limits raised and
lowered, the TFLOPS request now and recommended, the replicas now and recommended with their HPA, each with
its layer's reason; with ``-o wide`` the conditions' messages. Read from what the autoscaler writes."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from scheduler_extender.autoscaler.report import autoscaling_status
from scheduler_extender.status import Status, status_patch
from tf_shell.kube.api import GatewayError, RawObject
from tf_shell.kube.reads import MetricsCluster
from tfctl.autoscale_view import autoscale_table
from tfctl.main import main
from vgpu.autoscale.config import parse
from vgpu.autoscale.evaluate import Evaluation, Grant, LimitDecision, Member, Workload
from vgpu.autoscale.recommend import Decision, Reason

GI = 1024**3


def workload(name: str, status: dict[str, Any] | None = None, namespace: str = "team-a") -> RawObject:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {}, **({"status": status} if status else {})}


def condition(kind: str, reason: str, message: str = "why") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


TRAINER = workload("trainer", {
    "autoScaling": {
        "limits": {"pods": [], "raised": 2, "lowered": 1},
        "requests": {"current": {"tflopsRequest": "10", "vramRequest": "8Gi"}, "tflopsRequest": "7500m",
                     "vramRequest": "6Gi", "reason": "RequestsLowered"},
        "replicas": {"current": 3, "min": 1, "max": 10, "targetTflopsPerReplica": "24", "recommended": 5,
                     "horizontalPodAutoscaler": "tf-trainer"},
    },
    "conditions": [
        condition("LimitsAutoSet", "LimitsRaised", "3 of 3 pod GPUs changed"),
        condition("RequestsAutoSet", "RequestsLowered", "p90 is 7.5 TFLOPS"),
        condition("ReplicasAutoSet", "ScaledUp", "mean use 90 % of the target"),
        condition("Prediction", "NotImplemented", "nothing predicts"),
        condition("Ready", "Ready", "not the autoscaler's"),
    ],
})  # fmt: skip


@pytest.mark.parametrize(
    ("auto", "conditions", "row"),
    [
        ({"limits": {"raised": 0, "lowered": 4}}, [condition("LimitsAutoSet", "LimitsLowered")],
         ["+0 -4 LimitsLowered", "-", "-"]),
        # no recommendation yet: the webhook keeps the admitted request
        ({"requests": {"current": {"tflopsRequest": "10"}, "reason": "WaitingForHistory"}},
         [condition("RequestsAutoSet", "WaitingForHistory")], ["-", "10 -> - WaitingForHistory", "-"]),
        ({"replicas": {"current": 2, "min": 1, "max": 4}}, [], ["-", "-", "2 -> - -"]),
        ({"replicas": {"current": 2, "recommended": 2}},
         [{"type": "ReplicasAutoSet", "status": "False", "reason": "NoScaleTarget", "message": "no owner"}],
         ["-", "-", "2 -> 2 NoScaleTarget"]),
        # a status someone else wrote badly is shown as written, never a crash
        ({"requests": {"current": "10", "tflopsRequest": "lots"}, "limits": {"raised": None}},
         ["not a condition", {"reason": "typeless"}], ["+- -- -", "- -> lots -", "-"]),
    ],
)  # fmt: skip
def test_each_layer_is_its_figures_and_its_reason(auto: dict[str, Any], conditions: list[Any], row: list[str]) -> None:
    lines = autoscale_table([workload("w", {"autoScaling": auto, "conditions": conditions})]).splitlines()
    assert len(lines) == 2
    assert [cell.strip() for cell in lines[1].split("  ") if cell.strip()] == ["team-a", "w", *row]


def test_workloads_without_autoscaling_are_left_out_unless_all_are_asked_for() -> None:
    plain = workload("plain", {"conditions": [condition("Ready", "Ready")]})
    assert autoscale_table([plain, workload("new")]) == "no autoscaled workloads"
    assert autoscale_table([]) == "no autoscaled workloads"
    assert autoscale_table([plain, TRAINER], all_workloads=True).splitlines()[1:] == [
        "team-a     plain     -                   -                          -",
        "team-a     trainer   +2 -1 LimitsRaised  10 -> 7.5 RequestsLowered  3 -> 5 hpa/tf-trainer ScaledUp",
    ]
    assert autoscale_table([], all_workloads=True) == "no tensorfusionworkloads here"


def test_rows_are_sorted_by_namespace_then_name() -> None:
    rows = [workload(n, {"autoScaling": {}}, namespace=ns) for ns, n in (("b", "x"), ("a", "z"), ("a", "y"))]
    assert [line.split()[:2] for line in autoscale_table(rows).splitlines()[1:]] == [["a", "y"], ["a", "z"], ["b", "x"]]


def test_the_autoscalers_own_status_reads_back() -> None:
    """What report.py and the status writer put on a workload is what the table shows."""
    config = parse({"autoSetLimits": {"enable": True}, "autoSetRequests": {"enable": True},
                    "autoSetReplicas": {"enable": True}})  # fmt: skip
    grant = Grant(gpu="GPU-0", tflops_request=10_000, tflops_limit=20_000, vram_request=8 * GI, vram_limit=8 * GI,
                  tflops_capacity=312_000, vram_capacity=80 * GI)  # fmt: skip
    member = Member(uid="u1", name="web-1", grants=(grant,), admitted_tflops_limit=20_000, admitted_vram_limit=8 * GI)
    w = Workload(namespace="team-a", name="web", config=config, members=(member,), tflops_request=10_000,
                 tflops_limit=20_000, vram_request=8 * GI, vram_limit=8 * GI, gpu_count=1, replicas=2, min_replicas=1,
                 max_replicas=6)  # fmt: skip
    evaluation = Evaluation(
        limits=(LimitDecision("u1", "web-1", "GPU-0", Decision(20_000, 30_000, Reason.LIMITS_RAISED, "peak 19"),
                              Decision(8 * GI, 8 * GI, Reason.UNCHANGED, "fits")),),
        requests_tflops=Decision(10_000, 12_500, Reason.REQUESTS_RAISED, "p90 12.5 TFLOPS"),
        requests_vram=Decision(8 * GI, 8 * GI, Reason.UNCHANGED, "p95 7 GiB"),
        replicas=Decision(2, 3, Reason.SCALED_UP, "mean 95 % of target"),
        replica_target_tflops=40_000,
    )  # fmt: skip
    fields, conditions = autoscaling_status(w, evaluation, hpa="tf-web", replicas_problem=None, predictions=(),
                                            last_changes={})  # fmt: skip
    patch = status_patch(workload("web"), Status({"autoScaling": fields}, conditions), "2026-01-01T00:00:00Z")
    assert patch is not None
    assert autoscale_table([workload("web", patch["status"])], wide=True).splitlines() == [
        "NAMESPACE  WORKLOAD  LIMITS              REQUEST (TFLOPS)           REPLICAS                    MESSAGES",
        "team-a     web       +1 -0 LimitsRaised  10 -> 12.5 RequestsRaised  2 -> 3 hpa/tf-web ScaledUp  "
        "LimitsAutoSet: 1 of 1 pod GPUs changed; pod web-1: peak 19 | RequestsAutoSet: p90 12.5 TFLOPS; p95 7 GiB | "
        "ReplicasAutoSet: mean 95 % of target; HorizontalPodAutoscaler tf-web scales the workload",
    ]


class FakeCluster:
    """The API server as ``tfctl autoscale`` reads it."""

    def __init__(self) -> None:
        self.items = [TRAINER, workload("plain")]
        self.asked: list[str | None] = []

    def workloads(self, namespace: str | None) -> list[RawObject]:
        self.asked.append(namespace)
        return self.items


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster()
    monkeypatch.setattr(MetricsCluster, "connect", classmethod(lambda cls, kubeconfig: fake))
    return fake


def test_tfctl_autoscale_prints_the_table(cluster: FakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["autoscale", "-n", "team-a"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "NAMESPACE  WORKLOAD  LIMITS              REQUEST (TFLOPS)           REPLICAS",
        "team-a     trainer   +2 -1 LimitsRaised  10 -> 7.5 RequestsLowered  3 -> 5 hpa/tf-trainer ScaledUp",
    ]
    assert main(["autoscale", "-A", "-o", "wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert wide[0].endswith("MESSAGES")
    assert wide[1].endswith(
        "LimitsAutoSet: 3 of 3 pod GPUs changed | RequestsAutoSet: p90 is 7.5 TFLOPS | "
        "ReplicasAutoSet: mean use 90 % of the target | Prediction: nothing predicts"
    )
    assert cluster.asked == ["team-a", None]


def test_nothing_autoscaled_is_said_in_words(cluster: FakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.items = [workload("plain")]
    assert main(["autoscale"]) == 0
    assert capsys.readouterr().out == "no autoscaled workloads\n"
    assert cluster.asked == ["default"]


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (GatewayError("list tensorfusionworkloads in team-a: HTTP 404 Not Found: not found", 404),
         "HTTP 404 Not Found: not found (is the TensorFusionWorkload CRD installed?"),
        (GatewayError("list tensorfusionworkloads in team-a: HTTP 403 Forbidden: no", 403), "HTTP 403 Forbidden: no\n"),
    ],
)  # fmt: skip
def test_an_unreadable_api_is_an_error_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: GatewayError, said: str
) -> None:
    class Refusing:
        def workloads(self, namespace: str | None) -> list[RawObject]:
            raise error

    monkeypatch.setattr(MetricsCluster, "connect", classmethod(lambda cls, kubeconfig: Refusing()))
    assert main(["autoscale", "-n", "team-a"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfctl autoscale: ") and said in err


class FakeCustomObjects:
    """CustomObjectsApi's two list calls, as the kube adapter makes them: the raw response's bytes."""

    def __init__(self, answer: bytes | ApiException) -> None:
        self.answer = answer
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _respond(self, call: str, args: tuple[Any, ...]) -> SimpleNamespace:
        self.calls.append((call, args))
        if isinstance(self.answer, ApiException):
            raise self.answer
        return SimpleNamespace(data=self.answer)

    def list_cluster_custom_object(self, *args: Any, **options: Any) -> SimpleNamespace:
        return self._respond("cluster", args)

    def list_namespaced_custom_object(self, *args: Any, **options: Any) -> SimpleNamespace:
        return self._respond("namespaced", args)


def test_the_kube_adapter_lists_the_workloads_of_a_namespace_or_of_all() -> None:
    cluster = MetricsCluster(client.ApiClient())
    fake = FakeCustomObjects(json.dumps({"items": [TRAINER, "not an object"]}).encode())
    cluster.custom = fake  # type: ignore[assignment]
    assert cluster.workloads("team-a") == [TRAINER]
    assert cluster.workloads(None) == [TRAINER]
    assert fake.calls == [
        ("namespaced", ("tensor-fusion.ai", "v1", "team-a", "tensorfusionworkloads")),
        ("cluster", ("tensor-fusion.ai", "v1", "tensorfusionworkloads")),
    ]
    cluster.custom = FakeCustomObjects(ApiException(status=404, reason="Not Found"))  # type: ignore[assignment]
    with pytest.raises(GatewayError) as raised:
        cluster.workloads("team-a")
    assert raised.value.status == 404
