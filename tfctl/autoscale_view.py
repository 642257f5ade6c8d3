"""``tfctl autoscale``: what the autoscaler decided for each workload, read from the workloads' status.

The autoscaler (inside the extender) writes its decisions into each TensorFusionWorkload's status:
``status.autoScaling`` beside the current values, and one condition per enabled layer whose reason is
the decision's (``report.py``). Reading them takes a ``kubectl get tensorfusionworkload -o yaml`` per
workload; this prints one line per autoscaled workload instead — the limits raised and lowered, the
TFLOPS request now and recommended, the replicas now and recommended with the HorizontalPodAutoscaler
that applies them — each with its layer's reason, and with ``-o wide`` the conditions' messages (the why,
in numbers). It shows what the status says, so it agrees with what the webhook and the HPA act on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Final

from tf_shell.kube.api import GatewayError, RawObject
from tf_shell.kube.reads import MetricsCluster
from tfctl.top import NONE, table
from vgpu.errors import DomainError
from vgpu.names import AUTOSCALING_CONDITIONS as CONDITIONS
from vgpu.names import CONDITION_LIMITS as LIMITS
from vgpu.names import CONDITION_REPLICAS as REPLICAS
from vgpu.names import CONDITION_REQUESTS as REQUESTS
from vgpu.names import KIND_WORKLOAD, PLURAL_WORKLOAD
from vgpu.quantity import humanize_tflops, parse_milli

HEADER: Final = ("NAMESPACE", "WORKLOAD", "LIMITS", "REQUEST (TFLOPS)", "REPLICAS")


def add_subcommand(subparsers: Any) -> None:
    """Register ``autoscale`` on tfctl's sub-parsers."""
    p = subparsers.add_parser(
        "autoscale", help="the autoscaler's decisions per TensorFusionWorkload: limits, request, replicas"
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", default="default", help="the workloads' namespace (default: default)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="the workloads of every namespace")
    p.add_argument("-o", "--output", choices=("wide",), help="wide: add the layers' condition messages")
    p.add_argument(
        "--all-workloads", action="store_true", help="also the workloads the autoscaler has written nothing for"
    )
    p.add_argument("--kubeconfig", help="kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        workloads = MetricsCluster.connect(args.kubeconfig).workloads(None if args.all_namespaces else args.namespace)
    except GatewayError as exc:
        hint = (
            f" (is the {KIND_WORKLOAD} CRD installed? the tensor-fusion chart installs it)" if exc.status == 404 else ""
        )
        sys.stderr.write(f"tfctl autoscale: {exc}{hint}\n")
        return 2
    sys.stdout.write(autoscale_table(workloads, wide=args.output == "wide", all_workloads=args.all_workloads) + "\n")
    return 0


def autoscale_table(workloads: Iterable[RawObject], *, wide: bool = False, all_workloads: bool = False) -> str:
    """One line per workload with ``status.autoScaling`` (every workload with ``all_workloads``): each
    layer's figures and its condition's reason; ``-`` for a layer the status does not carry."""
    rows: list[tuple[str, ...]] = []
    for w in workloads:
        meta, status = _obj(w.get("metadata")), _obj(w.get("status"))
        auto = status.get("autoScaling")
        if not isinstance(auto, Mapping) and not all_workloads:
            continue
        auto = _obj(auto)
        conditions = {
            str(c.get("type")): c for c in status.get("conditions") or () if isinstance(c, Mapping) and "type" in c
        }
        row = (
            _text(meta.get("namespace")),
            _text(meta.get("name")),
            _limits(auto.get("limits"), conditions.get(LIMITS)),
            _request(auto.get("requests"), conditions.get(REQUESTS)),
            _replicas(auto.get("replicas"), conditions.get(REPLICAS)),
        )
        rows.append(row + ((_messages(conditions),) if wide else ()))
    if not rows:
        return f"no {PLURAL_WORKLOAD} here" if all_workloads else "no autoscaled workloads"
    return table([HEADER + (("MESSAGES",) if wide else ()), *sorted(rows)])


def _limits(limits: object, condition: Mapping[str, Any] | None) -> str:
    if not isinstance(limits, Mapping):
        return NONE
    return f"+{_text(limits.get('raised'))} -{_text(limits.get('lowered'))} {_reason(condition)}"


def _request(requests: object, condition: Mapping[str, Any] | None) -> str:
    if not isinstance(requests, Mapping):
        return NONE
    current = _obj(requests.get("current")).get("tflopsRequest")
    return f"{_tflops(current)} -> {_tflops(requests.get('tflopsRequest'))} {_reason(condition)}"


def _replicas(replicas: object, condition: Mapping[str, Any] | None) -> str:
    if not isinstance(replicas, Mapping):
        return NONE
    hpa = replicas.get("horizontalPodAutoscaler")
    via = f" hpa/{hpa}" if isinstance(hpa, str) and hpa else ""
    return f"{_text(replicas.get('current'))} -> {_text(replicas.get('recommended'))}{via} {_reason(condition)}"


def _messages(conditions: Mapping[str, Mapping[str, Any]]) -> str:
    """The autoscaler's conditions as ``Type: message``, in the layers' order, `` | `` between them."""
    shown = [f"{kind}: {_text(conditions[kind].get('message'))}" for kind in CONDITIONS if kind in conditions]
    return " | ".join(shown) or NONE


def _reason(condition: Mapping[str, Any] | None) -> str:
    return NONE if condition is None else _text(condition.get("reason"))


def _tflops(quantity: object) -> str:
    """A status quantity as TFLOPS for people (``7500m`` → ``7.5``); as written when it is no quantity."""
    if not isinstance(quantity, str):
        return _text(quantity)
    try:
        return humanize_tflops(parse_milli(quantity))
    except DomainError:
        return quantity


def _text(value: object) -> str:
    return NONE if value is None or value == "" else str(value)


def _obj(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
