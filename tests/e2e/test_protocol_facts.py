"""What a leaner bind can build on, checked against the real API server and kubelet (v1.36.2).

The issue "A lean bind" plans one write that binds and grants, and a hand-off gate opened by the kubelet's own
status write instead of the device plugin's receipt. Both rest on behaviour of the real binaries, pinned here so
that a Kubernetes upgrade that changes it fails this tier:

1. A Binding's ``metadata.annotations`` and ``metadata.labels`` land on the pod in the same write that sets
   ``spec.nodeName``: one watch event carries all three. A Binding whose ``metadata.uid`` or
   ``metadata.resourceVersion`` is not the pod's is refused with 409 Conflict and binds nothing.
2. The kubelet answers a pod's device Allocates at admission, before it first writes the pod's status: when the
   first event carrying a status written by the kubelet arrives (``startTime``, or a condition other than the
   scheduler's ``PodScheduled``), the device plugin has already answered the pod's Allocate.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from typing import Any

import pytest
from kubernetes import watch
from kubernetes.client import ApiException, CoreV1Api

from vgpu.names import Annotation

from .cluster import REAL_NODE, Cluster
from .kube import wait_running
from .pods import IMAGE, gpu_pod

NOWHERE = "e2e-no-such-node"  # the API server binds to any name: nothing runs the pod


def parked(name: str) -> dict[str, Any]:
    """A plain pod no scheduler picks up (its scheduler does not exist): only a Binding places it."""
    spec = {"schedulerName": "e2e-nobody", "containers": [{"name": "main", "image": IMAGE}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def binding(name: str, *, uid: str | None = None, version: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "annotations": {"e2e.example.com/granted": "yes"},
        "labels": {"e2e.example.com/node": NOWHERE},
    }
    if uid is not None:
        meta["uid"] = uid
    if version is not None:
        meta["resourceVersion"] = version
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta, "target": {"kind": "Node", "name": NOWHERE}}


def test_a_binding_carries_annotations_and_labels_in_its_one_write_and_honours_its_preconditions(
    core: CoreV1Api, fresh: str
) -> None:
    created = core.create_namespaced_pod(fresh, parked("bound-once"))
    events: list[dict[str, Any]] = []
    stream = watch.Watch()
    seen = threading.Event()

    def follow() -> None:
        for event in stream.stream(
            core.list_namespaced_pod,
            fresh,
            field_selector="metadata.name=bound-once",
            resource_version=created.metadata.resource_version,
            timeout_seconds=30,
        ):
            events.append(event["raw_object"])
            if event["raw_object"]["spec"].get("nodeName"):
                seen.set()
                stream.stop()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    uid, version = created.metadata.uid, created.metadata.resource_version
    core.create_namespaced_pod_binding("bound-once", fresh, binding("bound-once", uid=uid, version=version),
                                       _preload_content=False)  # fmt: skip
    assert seen.wait(30), events
    first = events[0]
    assert first["spec"]["nodeName"] == NOWHERE  # one event: the node, the annotation and the label together
    assert first["metadata"]["annotations"]["e2e.example.com/granted"] == "yes"
    assert first["metadata"]["labels"]["e2e.example.com/node"] == NOWHERE

    for name, stale in (("wrong-uid", "uid"), ("stale-version", "version")):
        pod = core.create_namespaced_pod(fresh, parked(name))
        old = pod.metadata.resource_version
        core.patch_namespaced_pod(name, fresh, {"metadata": {"labels": {"touched": "yes"}}})  # a newer version
        body = (
            binding(name, uid="00000000-0000-0000-0000-000000000000")
            if stale == "uid"
            else binding(name, uid=pod.metadata.uid, version=old)
        )
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod_binding(name, fresh, body, _preload_content=False)
        assert refused.value.status == 409, refused.value.body
        after = core.read_namespaced_pod(name, fresh)
        assert after.spec.node_name is None and "e2e.example.com/granted" not in (after.metadata.annotations or {})


def allocated_at(log: str, key: str) -> dt.datetime | None:
    """When the device plugin logged its Allocate answer for pod ``key`` (text log format)."""
    for line in log.splitlines():
        found = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \S+: Allocate \[.*\]: pod (\S+) ", line)
        if found and found[2] == key:
            return dt.datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f")
    return None


def written_by_kubelet(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    kinds = {c.get("type") for c in status.get("conditions") or ()}
    return bool(status.get("startTime")) or bool(kinds - {"PodScheduled"})


def test_the_kubelet_writes_a_pods_status_only_after_its_device_allocates(
    cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    name = "status-after-allocate"
    pod = gpu_pod(name, {Annotation.TFLOPS_REQUEST: "1", Annotation.VRAM_REQUEST: "1Gi"})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    first_status: list[dt.datetime] = []
    stream = watch.Watch()
    ready = threading.Event()

    def follow() -> None:
        ready.set()
        for event in stream.stream(core.list_namespaced_pod, fresh, field_selector=f"metadata.name={name}",
                                   timeout_seconds=90):  # fmt: skip
            if written_by_kubelet(event["raw_object"]):
                first_status.append(dt.datetime.now())
                stream.stop()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    ready.wait(5)
    core.create_namespaced_pod(fresh, pod)
    wait_running(core, fresh, name)
    follower.join(30)
    assert first_status, "no status written by the kubelet was seen"
    answered = allocated_at(cluster.ours["tf-device-plugin"].log.read_text(), f"{fresh}/{name}")
    assert answered is not None, "the device plugin logged no Allocate for the pod"
    assert answered <= first_status[0], (answered, first_status[0])
