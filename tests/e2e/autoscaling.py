"""A workload the autoscaler looks after, for the e2e scenario and the demo: its profile, its Deployment, and
a scripted load that follows the pods as they come and go."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping
from typing import Any

from kubernetes.client import AppsV1Api, CoreV1Api, CustomObjectsApi

from vgpu.names import CRD_GROUP, CRD_VERSION, LABEL_ENABLED, PLURAL_WORKLOAD, Annotation, SystemAnnotation

from .cluster import LIVE_LIMITS_DIRS, Cluster
from .fake_nodes import MIB, fake_nvml_yaml
from .pods import IMAGE, allocation_of

NAMESPACE = "e2e-autoscaling"
WORKLOAD = "trainer"
LIVE_LIMITS = LIVE_LIMITS_DIRS  # the kubelet node's --live-limits-dir of each cluster this process runs
HIGH_SM, LOW_SM = 10, 1  # percent of an A100's 312 TFLOPS: 31.2 and 3.12 TFLOPS
PROFILE = {
    "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}",
    "kind": "WorkloadProfile",
    "metadata": {"name": "auto", "namespace": NAMESPACE},
    "spec": {
        "autoScalingConfig": {
            "autoSetLimits": {
                "enable": True,
                "targetResource": "tflops",
                "evaluationPeriod": "2s",
                "maxRatioToRequests": "3.0",
            },
            "autoSetReplicas": {
                "enable": True,
                "targetTFlopsOfLimits": "50%",
                "evaluationPeriod": "2s",
                "scaleUpStep": "1",
                "scaleDownStep": "1",
                "scaleUpCoolDownTime": "0s",
                "scaleDownCoolDownTime": "4s",
            },
            "autoSetRequests": {
                "enable": True,
                "targetResource": "tflops",
                "aggregationPeriod": "8s",
                "evaluationPeriod": "1s",
            },
        }
    },
}
TEMPLATE_ANNOTATIONS = {
    Annotation.TFLOPS_REQUEST: "10",
    Annotation.TFLOPS_LIMIT: "20",
    Annotation.VRAM_REQUEST: "1Gi",
    Annotation.VRAM_LIMIT: "2Gi",
    Annotation.WORKLOAD_PROFILE: "auto",
    Annotation.WORKLOAD: WORKLOAD,
    Annotation.GENERATE_WORKLOAD: "true",
}


def deployment(
    name: str = WORKLOAD,
    namespace: str = NAMESPACE,
    annotations: Mapping[Annotation | str, str] = TEMPLATE_ANNOTATIONS,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A one-replica GPU Deployment whose pods are labelled ``app=<name>``, with ``annotations`` on its template."""
    labels = {"app": name}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": IMAGE}], "terminationGracePeriodSeconds": 0}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": {LABEL_ENABLED: "true", **labels},
                    "annotations": {str(k): v for k, v in annotations.items()},
                },
                "spec": spec,
            },
        },
    }


class Load:
    """Scripts every placed pod of a Deployment (``app`` in ``namespace``) at ``sm`` percent of its GPU and
    ``vram_mib`` of its memory (None: all it may hold, its VRAM limit there, as a load pressing on the limiter
    inside its container would: more, and the device plugin's VRAM guard kills it), rewriting the fake GPU
    file as pods come and go and limits change (a thread, every half second)."""

    def __init__(
        self, cluster: Cluster, sm: int, *, app: str = WORKLOAD, namespace: str = NAMESPACE, vram_mib: int | None = 512
    ) -> None:
        self.cluster, self.sm = cluster, sm
        self.app, self.namespace, self.vram_mib = app, namespace, vram_mib
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._written = ""

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.cluster.set_gpu_faults({})

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a pod deleted under us: the next round sees the new list
                self._write()
            self._stop.wait(0.5)

    def _write(self) -> None:
        memory = {g.uuid: g.model.memory_mib for g in self.cluster.gpus}
        script = []
        for pod in self.cluster.core.list_namespaced_pod(self.namespace, label_selector=f"app={self.app}").items:
            if pod.status.phase != "Running" or not (pod.metadata.annotations or {}).get(SystemAnnotation.ALLOCATION):
                continue
            for g in allocation_of(pod).gpus:
                vram = min(memory[g.uuid], g.vram_limit // MIB) if self.vram_mib is None else self.vram_mib
                script.append(
                    {"pod": pod.metadata.uid, "container": "main", "gpu": g.uuid, "smPercent": self.sm, "vramMiB": vram}
                )
        text = fake_nvml_yaml(self.cluster.gpus, {}, usage=script)
        if text != self._written:
            self.cluster.write_fake_nvml(text)
            self._written = text


def live_limits(uid: str) -> dict[str, Any] | None:
    """The Deployment's container's limits.json the device plugin wrote on the node (docs/live-limits.md), in
    the live-limits directory of the cluster running the pod (a pod UID is one cluster's only)."""
    for root in LIVE_LIMITS:
        path = root / uid / "main" / "limits.json"
        if path.exists():
            return dict(json.loads(path.read_text()))
    return None


def replicas_now(apps: AppsV1Api) -> int:
    return int(apps.read_namespaced_deployment_scale(WORKLOAD, NAMESPACE).spec.replicas or 0)


def running(core: CoreV1Api) -> list[Any]:
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"app={WORKLOAD}").items
    return [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]


def workload_status(cluster: Cluster) -> dict[str, Any]:
    obj = CustomObjectsApi(cluster.admin).get_namespaced_custom_object(
        CRD_GROUP, CRD_VERSION, NAMESPACE, PLURAL_WORKLOAD, WORKLOAD
    )
    return dict(obj.get("status") or {})


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or () if c["type"] == kind), None)


def events_of(core: CoreV1Api, pod: str) -> list[str]:
    found = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={pod}").items
    return [e.reason for e in found]
