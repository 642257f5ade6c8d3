"""Test doubles at the plugin's own seams: an in-memory Kubernetes gateway, pod and allocation builders,
and a fake GPU file. Pods are API-shaped JSON, as the real gateway serves them."""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from device_plugin.cluster.gateway import Json, WatchKind
from tf_shell.kube.api import GatewayError, GatewayTimeout, GoneError, Listing, RawObject, WatchEvent
from vgpu.contract.allocation import GpuGrant, PodAllocation, encode
from vgpu.names import NVIDIA_DEVICE_MOUNT_ROOT, RESOURCE_VGPU, Env, IsolationMode, Qos, SystemAnnotation

NODE = "node-a"
GPU0 = "GPU-00000000-0000-0000-0000-00000000a100"
GPU1 = "GPU-11111111-1111-1111-1111-11111111a100"
A100_TFLOPS = 312_000  # milli, from the shared catalog
A100_VRAM = 81920 * 1024 * 1024
GIB = 1024**3


def gpu_file(
    path: Path,
    *,
    fail: Mapping[str, str] | None = None,
    events: Sequence[tuple[str, int]] = (),
    numa: Mapping[str, int | None] | None = None,
    usage: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """Two A100s on NUMA 0 and 1 (``numa`` overrides; None: unknown); ``fail`` makes a GPU's check fail;
    ``events`` are XIDs; ``usage`` the scripted processes (device_plugin/gpus/fake_probe.py format)."""
    fail = fail or {}
    numa = {GPU0: 0, GPU1: 1, **(numa or {})}
    doc = {
        "gpus": [
            {
                "uuid": uuid,
                "index": i,
                "name": "NVIDIA A100-SXM4-80GB",
                "memoryMiB": 81920,
                **({"numa": numa[uuid]} if numa[uuid] is not None else {}),
                **({"fail": fail[uuid]} if uuid in fail else {}),
                "utilization": 30 + i,
                "memoryUsedMiB": 1024,
                "temperature": 40,
                "powerWatts": 90.5,
            }
            for i, uuid in enumerate((GPU0, GPU1))
        ],
        "events": [{"uuid": u, "xid": x} for u, x in events],
        "usage": list(usage),
    }
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def grant(uuid: str = GPU0, *, index: int = 0, tflops: int = 10_000, vram: int = 4 * GIB, **kw: int) -> GpuGrant:
    values = {
        "tflops_request": tflops,
        "tflops_limit": tflops,
        "vram_request": vram,
        "vram_limit": vram,
        "gpu_tflops": A100_TFLOPS,
    }
    values.update(kw)
    return GpuGrant(uuid=uuid, index=index, **values)


def allocation(
    uid: str,
    *,
    node: str = NODE,
    containers: Sequence[str] = ("main",),
    gpus: Sequence[GpuGrant] = (),
    isolation: IsolationMode | None = None,
    container_gpus: Sequence[tuple[str, tuple[str, ...]]] | None = None,
) -> str:
    return encode(
        PodAllocation(
            pod_uid=uid,
            node=node,
            pool="default-pool",
            qos=Qos.MEDIUM,
            containers=tuple(containers),
            gpus=tuple(gpus) or (grant(),),
            bound_at="2026-11-22T03:05:46Z",
            isolation=isolation,
            container_gpus=None if container_gpus is None else tuple(container_gpus),
        )
    )


_uids = itertools.count(1)


def make_pod(
    name: str,
    *,
    uid: str | None = None,
    node: str = NODE,
    containers: Sequence[tuple[str, int]] = (("main", 1),),
    init: Sequence[tuple[str, int]] = (),
    alloc: str | None = None,
    handoff: str | None = None,
    phase: str = "Pending",
    namespace: str = "default",
) -> dict[str, Any]:
    uid = uid or f"00000000-0000-4000-8000-{next(_uids):012d}"

    def spec(cname: str, count: int) -> dict[str, Any]:
        res = {"limits": {RESOURCE_VGPU: str(count)}} if count else {}
        return {"name": cname, "image": "busybox", "resources": res}

    annotations = {}
    if alloc is not None:
        annotations[SystemAnnotation.ALLOCATION.value] = alloc
    if handoff is not None:
        annotations[SystemAnnotation.HANDOFF.value] = handoff
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "initContainers": [spec(c, n) for c, n in init],
            "containers": [spec(c, n) for c, n in containers],
        },
        "status": {"phase": phase},
    }


def toolkit_gpus(response: Any) -> str:
    """The GPUs NVIDIA's toolkit would give the container of a ContainerAllocateResponse, comma-separated: the
    /dev/null mounts under its device root where the answer has them (volume-mounts delivery, the harness's
    well-set node), else NVIDIA_VISIBLE_DEVICES."""
    mounted = [
        m.container_path.removeprefix(NVIDIA_DEVICE_MOUNT_ROOT + "/")
        for m in response.mounts
        if m.host_path == "/dev/null" and m.container_path.startswith(NVIDIA_DEVICE_MOUNT_ROOT + "/")
    ]
    return ",".join(mounted) if mounted else str(response.envs[Env.NVIDIA_VISIBLE_DEVICES])


def uid_of(pod: Json) -> str:
    return str(pod["metadata"]["uid"])


class FakeKube:
    """A :class:`~device_plugin.cluster.gateway.KubeGateway` over dicts, with a real watch stream.

    Every write gets the next resourceVersion and is logged, so a watch from a list's version replays
    exactly what followed it, as the API server does. ``watch_held`` models a lagging watch (the API
    has the change, the stream has not delivered it yet): while set, watches deliver nothing. A watch
    ends after ``watch_window_s`` (at most its timeout), as the API server ends watches, so the
    informer watches again from the last version it saw; ``expire_watches`` makes that many watches
    fail with 410 Gone, as when the server no longer has the version (the informer then lists again).
    Failures are the gateway's: :class:`~tf_shell.kube.api.GatewayError` with a status."""

    watch_window_s = 0.5

    def __init__(self, pods: Sequence[dict[str, Any]] = (), node_labels: Mapping[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._version = itertools.count(1)
        self._current = 0
        self._log: list[tuple[int, WatchKind, dict[str, Any]]] = []
        self.pods: dict[str, dict[str, Any]] = {}
        self.node: dict[str, Any] = {"metadata": {"name": NODE, "labels": dict(node_labels or {}), "annotations": {}}}
        self.node_patches: list[tuple[dict[str, str], dict[str, str]]] = []
        self.resource_patches: list[dict[str, str]] = []
        self.node_events: list[tuple[str, str, str, bool]] = []  # (node, reason, message, warning)
        self.pod_events: list[tuple[str, str, str, str, str, bool]] = []  # (ns, name, uid, reason, message, warning)
        self.pod_patches: list[tuple[str, str, dict[str, str]]] = []
        self.fail_pod_patches = 0
        self.fail_pod_lists = 0
        # How the next Event posts are answered, one word each (then "ok"): "lost" is taken but its answer lost
        # (a timeout), "timeout" not taken, "busy" a 503, "forbidden" a 403.
        self.event_answers: list[str] = []
        self.event_keys: set[str] = set()
        self.expire_watches = 0
        self.watch_held = threading.Event()
        for pod in pods:
            self.put(pod, notify=False)

    def _stamp(self, pod: dict[str, Any]) -> dict[str, Any]:
        self._current = next(self._version)
        pod["metadata"]["resourceVersion"] = str(self._current)
        return copy.deepcopy(pod)

    def _emit(self, kind: WatchKind, pod: dict[str, Any]) -> None:
        self._log.append((self._current, kind, copy.deepcopy(pod)))
        self._changed.notify_all()

    def put(self, pod: dict[str, Any], *, notify: bool = True) -> None:
        with self._lock:
            kind: WatchKind = "MODIFIED" if uid_of(pod) in self.pods else "ADDED"
            self.pods[uid_of(pod)] = self._stamp(copy.deepcopy(pod))
            if notify:
                self._emit(kind, self.pods[uid_of(pod)])

    def annotate(self, uid: str, key: str, value: str) -> None:
        with self._lock:
            self.pods[uid]["metadata"]["annotations"][key] = value
            self._stamp(self.pods[uid])
            self._emit("MODIFIED", self.pods[uid])

    def delete(self, uid: str) -> None:
        with self._lock:
            pod = self.pods.pop(uid)
            self._stamp(pod)
            self._emit("DELETED", pod)

    def annotation(self, uid: str, key: str) -> str | None:
        with self._lock:
            value = self.pods[uid]["metadata"]["annotations"].get(key)
            return None if value is None else str(value)

    # --- KubeGateway ------------------------------------------------------------------------------

    def list_pods(self, node: str) -> Listing:
        with self._lock:
            if self.fail_pod_lists:
                self.fail_pod_lists -= 1
                raise GatewayError("list pods: HTTP 503 Service Unavailable: injected API failure", 503)
            items = [copy.deepcopy(p) for p in self.pods.values() if p["spec"]["nodeName"] == node]
            return Listing(items=items, resource_version=str(self._current))

    def watch_pods(self, node: str, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        with self._lock:
            if self.expire_watches:
                self.expire_watches -= 1
                raise GoneError(f"too old resource version: {resource_version}")
        after = int(resource_version)
        deadline = time.monotonic() + min(timeout_seconds, self.watch_window_s)
        while time.monotonic() < deadline:
            with self._changed:
                ready = [] if self.watch_held.is_set() else [e for e in self._log if e[0] > after]
                if not ready:
                    self._changed.wait(0.05)
                    continue
            for version, kind, pod in ready:
                after = version
                if pod["spec"]["nodeName"] == node:
                    yield WatchEvent(kind, copy.deepcopy(pod))

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> RawObject:
        with self._lock:
            if self.fail_pod_patches:
                self.fail_pod_patches -= 1
                raise GatewayError(f"patch pod {namespace}/{name}: HTTP 503 Service Unavailable: injected", 503)
            pod = next((p for p in self.pods.values() if p["metadata"]["name"] == name), None)
            if pod is None:
                raise GatewayError(f'patch pod {namespace}/{name}: HTTP 404 Not Found: pods "{name}" not found', 404)
            pod["metadata"]["annotations"].update(annotations)
            self.pod_patches.append((namespace, name, dict(annotations)))
            out = self._stamp(pod)
            self._emit("MODIFIED", pod)
            return out

    def get_node(self, name: str) -> RawObject:
        with self._lock:
            return copy.deepcopy(self.node)

    def patch_node(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> None:
        with self._lock:
            self.node["metadata"]["labels"].update(labels)
            self.node["metadata"]["annotations"].update(annotations)
            self.node_patches.append((dict(labels), dict(annotations)))

    def patch_node_resources(self, name: str, resources: Mapping[str, str]) -> None:
        with self._lock:
            status = self.node.setdefault("status", {})
            for side in ("capacity", "allocatable"):
                status.setdefault(side, {}).update(resources)
            self.resource_patches.append(dict(resources))

    def record_node_event(self, node: str, reason: str, message: str, *, warning: bool, key: str) -> None:
        with self._lock:
            self._take_event(f"default/{node}.{key}", lambda: self.node_events.append((node, reason, message, warning)))

    def record_pod_event(
        self, namespace: str, name: str, uid: str, node: str, reason: str, message: str, *, warning: bool, key: str
    ) -> None:
        with self._lock:
            self._take_event(
                f"{namespace}/{name}.{key}",
                lambda: self.pod_events.append((namespace, name, uid, reason, message, warning)),
            )

    def _take_event(self, name: str, record: Callable[[], None]) -> None:
        """As the API server takes an Event named ``name``: once, then 409; or as ``event_answers`` says."""
        answer = self.event_answers.pop(0) if self.event_answers else "ok"
        if answer in ("timeout", "busy", "forbidden"):
            raise {
                "timeout": GatewayTimeout(f"event {name}: the API server did not answer"),
                "busy": GatewayError(f"event {name}: HTTP 503", 503),
                "forbidden": GatewayError(f"event {name}: HTTP 403", 403),
            }[answer]
        if name in self.event_keys:
            raise GatewayError(f"event {name}: HTTP 409 AlreadyExists", 409)
        self.event_keys.add(name)
        record()
        if answer == "lost":
            raise GatewayTimeout(f"event {name}: the API server did not answer")


class CountingKube(FakeKube):
    """The fake API server, counting the pod LISTs it answers."""

    def __init__(self, pods: list[dict[str, object]]) -> None:
        super().__init__(pods)
        self.lists = 0

    def list_pods(self, node: str) -> Listing:
        self.lists += 1
        return super().list_pods(node)
