"""An in-memory API server speaking the KubeGateway protocol, with failure injection, and object builders.

The fake keeps Nodes and Pods as raw JSON with resourceVersions and an event log, so the real
informers list and watch it exactly as they do the API server (including 410 Gone after a
compaction), and the binder's patches and Bindings change the same objects the cache then sees.
``auto_receipt`` plays the device plugin: after a Binding it writes the hand-off receipt.
``stall_at`` plays a stalled API server (SIGSTOP): from the named call on, every pod read, patch and
Binding waits out its timeout and raises GatewayTimeout, until ``resume()``; a call still waiting then
goes through, as a request the API server had queued would.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from scheduler_extender.claim_board import lease_name
from scheduler_extender.gateway import Kind, PodEvent
from tf_shell.kube.api import GatewayError, GatewayTimeout, GoneError, Listing, RawObject, WatchEvent
from vgpu.contract import allocation as allocation_contract
from vgpu.contract import claims as claims_contract
from vgpu.contract import inventory as inventory_contract
from vgpu.contract import resolved as resolved_contract
from vgpu.contract.allocation import Handoff
from vgpu.contract.claims import Claim, NodeClaims
from vgpu.contract.inventory import GpuInfo, Health, NodeInventory
from vgpu.names import (
    CLAIMS_ANNOTATION,
    LABEL_ENABLED,
    PLURAL_GPU_POOL,
    PLURAL_WORKLOAD,
    QOS_PRIORITY_VALUE,
    EnforcementBackend,
    Qos,
    SystemAnnotation,
)
from vgpu.request import GpuRequest

GI = 1024**3


class FakeGateway:
    """Thread-safe fake API server: Nodes and Pods (watchable), TensorFusionWorkloads and GPUPools (list,
    status), Leases."""

    def __init__(self, *, auto_receipt: bool = False) -> None:
        self._cond = threading.Condition()
        self.objects: dict[Kind, dict[str, RawObject]] = {Kind.NODE: {}, Kind.POD: {}}
        self.rv = 1
        self.log: list[tuple[int, Kind, WatchEvent]] = []
        self.compacted = 0  # watches from a resourceVersion below this get 410
        self.events: list[PodEvent] = []
        self.bindings: list[tuple[str, str, str]] = []
        self.fail: dict[str, GatewayError] = {}  # operation name -> error to raise (once per entry)
        self.lost_bind_answer: GatewayError | None = None  # raised once by a bind after it took effect
        self.calls: list[str] = []  # pod writes, reads and lists
        self.lease_calls: list[str] = []  # "get|create|update <lease>"
        self.timeouts: list[tuple[str, float | None]] = []  # (call, timeout it was given) for get/patch/bind
        self.stall_at: str | None = None  # "get", "patch", "lease" or "bind": the API server stalls from it on
        self.stalled = False
        self.auto_receipt = auto_receipt
        self.closed = False
        self.workloads: dict[tuple[str, str], RawObject] = {}  # TensorFusionWorkloads by (namespace, name)
        self.pools: dict[str, RawObject] = {}  # GPUPools by name
        self.status_patches: list[tuple[str, str, RawObject]] = []  # (plural, name, merge patch)
        self.leases: dict[tuple[str, str], RawObject] = {}  # coordination.k8s.io Leases by (namespace, name)
        self.after_get: Callable[[], None] | None = None  # runs once after the next pod read (interleaving)
        self.before_claim: Callable[[], None] | None = None  # runs once before the next claims Lease write
        self.protected: set[str] = set()  # "namespace/name" of pods a PodDisruptionBudget keeps (eviction: 429)
        self.controllers: dict[tuple[str, str, str], RawObject] = {}  # (kind, namespace, name)
        self.endpoint_slices: list[RawObject] = []
        self.hpas: dict[tuple[str, str], RawObject] = {}
        self.config_maps: dict[tuple[str, str], RawObject] = {}
        self.graceful_evictions = False  # evicted pods only start terminating (deletionTimestamp)

    # --- test controls ----------------------------------------------------------------------------
    def put(self, kind: Kind, obj: RawObject) -> RawObject:
        with self._cond:
            key = _key(obj)
            event_type = "MODIFIED" if key in self.objects[kind] else "ADDED"
            return self._store(kind, obj, event_type)

    def delete(self, kind: Kind, key: str) -> None:
        with self._cond:
            obj = self.objects[kind].pop(key)
            self._emit(kind, "DELETED", obj)

    def compact(self) -> None:
        """Forget history: watches from older resourceVersions get 410 Gone."""
        with self._cond:
            self.compacted = self.rv + 1
            self.log.clear()
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def resume(self) -> None:
        """The stalled API server runs again (SIGCONT)."""
        with self._cond:
            self.stall_at, self.stalled = None, False
            self._cond.notify_all()

    def pod(self, namespace: str, name: str) -> RawObject:
        with self._cond:
            return copy.deepcopy(self.objects[Kind.POD][f"{namespace}/{name}"])

    def write_receipt(self, namespace: str, name: str) -> None:
        """What the device plugin does after Allocate."""
        with self._cond:
            pod = self.objects[Kind.POD][f"{namespace}/{name}"]
            alloc = allocation_contract.decode(pod["metadata"]["annotations"][SystemAnnotation.ALLOCATION])
            receipt = Handoff(
                pod_uid=alloc.pod_uid, node=alloc.node, devices=(("main", ("dev-0",)),), at="2026-01-01T00:00:00Z"
            )
            self._patch(pod, {SystemAnnotation.HANDOFF: allocation_contract.encode_handoff(receipt)})

    def write_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """What the kubelet does once it admitted the pod."""
        with self._cond:
            pod = copy.deepcopy(self.objects[Kind.POD][f"{namespace}/{name}"])
            pod["status"] = {**(pod.get("status") or {}), **status}
            self._store(Kind.POD, pod, "MODIFIED")

    # --- KubeGateway ------------------------------------------------------------------------------
    def list(self, kind: Kind) -> Listing:
        self._maybe_fail(f"list-{kind}")
        with self._cond:
            return Listing(items=copy.deepcopy(list(self.objects[kind].values())), resource_version=str(self.rv))

    def watch(self, kind: Kind, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        self._maybe_fail(f"watch-{kind}")
        since = int(resource_version)
        deadline = time.monotonic() + min(timeout_seconds, 2)
        while True:
            with self._cond:
                if since < self.compacted:
                    raise GoneError()
                pending = [(rv, e) for rv, k, e in self.log if k is kind and rv > since]
                if not pending:
                    left = deadline - time.monotonic()
                    if left <= 0 or self.closed:
                        return
                    self._cond.wait(min(left, 0.05))
                    continue
            for rv, event in pending:
                since = rv
                yield WatchEvent(event.type, copy.deepcopy(event.object))

    def get_pod(self, namespace: str, name: str, *, timeout: float | None = None) -> RawObject | None:
        self._maybe_stall("get", timeout)
        self._maybe_fail("get")
        with self._cond:
            pod = self.objects[Kind.POD].get(f"{namespace}/{name}")
            pod = copy.deepcopy(pod) if pod is not None else None
        hook, self.after_get = self.after_get, None
        if hook is not None:
            hook()
        return pod

    def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        uid: str,
        changes: Mapping[str, str | None],
        *,
        resource_version: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self.calls.append(f"patch {namespace}/{name} {sorted(changes)}")
        self._maybe_stall("patch", timeout)
        self._maybe_fail("patch")
        with self._cond:
            pod = self.objects[Kind.POD].get(f"{namespace}/{name}")
            if pod is None:
                raise GatewayError("pods not found", 404)
            if pod["metadata"]["uid"] != uid:
                raise GatewayError("Precondition failed: UID", 409)
            if resource_version is not None and pod["metadata"]["resourceVersion"] != resource_version:
                raise GatewayError("Operation cannot be fulfilled on pods: the object has been modified", 409)
            self._patch(pod, changes)

    def get_lease(self, namespace: str, name: str, *, timeout: float | None = None) -> RawObject | None:
        self.lease_calls.append(f"get {name}")
        self._maybe_stall_lease(timeout)
        self._maybe_fail("lease")
        with self._cond:
            lease = self.leases.get((namespace, name))
            return copy.deepcopy(lease) if lease is not None else None

    def create_lease(self, namespace: str, body: RawObject, *, timeout: float | None = None) -> RawObject:
        self.lease_calls.append(f"create {body['metadata']['name']}")
        self._claiming(body["metadata"]["name"])
        self._maybe_stall_lease(timeout)
        self._maybe_fail("lease")
        with self._cond:
            key = (namespace, body["metadata"]["name"])
            if key in self.leases:
                raise GatewayError("leases already exists", 409)
            return self._store_lease(key, body)

    def replace_lease(self, namespace: str, name: str, body: RawObject, *, timeout: float | None = None) -> RawObject:
        self.lease_calls.append(f"update {name}")
        self._claiming(name)
        self._maybe_stall_lease(timeout)
        self._maybe_fail("lease")
        with self._cond:
            lease = self.leases.get((namespace, name))
            if lease is None:
                raise GatewayError("leases not found", 404)
            if body["metadata"].get("resourceVersion") != lease["metadata"]["resourceVersion"]:
                raise GatewayError("Operation cannot be fulfilled on leases: the object has been modified", 409)
            return self._store_lease((namespace, name), body)

    def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        *,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        resource_version: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """As the API server: UID and resourceVersion preconditions, then ``spec.nodeName``, the annotations and
        the labels in one write."""
        self.calls.append(f"bind {namespace}/{name} {node}")
        self._maybe_stall("bind", timeout)
        self._maybe_fail("bind")
        with self._cond:
            pod = self.objects[Kind.POD].get(f"{namespace}/{name}")
            if pod is None:
                raise GatewayError("pods not found", 404)
            if pod["metadata"]["uid"] != uid or pod["spec"].get("nodeName"):
                raise GatewayError("pod is already assigned / UID mismatch", 409)
            if resource_version is not None and pod["metadata"]["resourceVersion"] != resource_version:
                raise GatewayError("Operation cannot be fulfilled on pods: the object has been modified", 409)
            pod = copy.deepcopy(pod)
            pod["spec"]["nodeName"] = node
            pod["metadata"].setdefault("annotations", {}).update(annotations or {})
            if labels:
                pod["metadata"].setdefault("labels", {}).update(labels)
            self._store(Kind.POD, pod, "MODIFIED")
            self.bindings.append((namespace, name, node))
        lost, self.lost_bind_answer = self.lost_bind_answer, None
        if lost is not None:
            raise lost
        if self.auto_receipt and SystemAnnotation.ALLOCATION in pod["metadata"].get("annotations", {}):
            self.write_receipt(namespace, name)

    def record_event(self, event: PodEvent) -> None:
        self._maybe_fail("event")
        with self._cond:
            self.events.append(event)

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(f"evict {namespace}/{name}")
        self._maybe_fail("evict")
        key = f"{namespace}/{name}"
        with self._cond:
            pod = self.objects[Kind.POD].get(key)
            if pod is None:
                return
            if pod["metadata"]["uid"] != uid:
                raise GatewayError("Precondition failed: UID in precondition does not match", 409)
            if key in self.protected:
                raise GatewayError("Cannot evict pod as it would violate the pod's disruption budget.", 429)
            if self.graceful_evictions:  # as with a kubelet: the pod terminates first, the test deletes it
                pod = copy.deepcopy(pod)
                pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                self._store(Kind.POD, pod, "MODIFIED")
                return
        self.delete(Kind.POD, key)

    def nominate_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.calls.append(f"nominate {namespace}/{name} {node}")
        self._maybe_fail("nominate")
        with self._cond:
            pod = self.objects[Kind.POD].get(f"{namespace}/{name}")
            if pod is None:
                raise GatewayError("pods not found", 404)
            if pod["metadata"]["uid"] != uid:
                raise GatewayError("UID mismatch", 409)
            pod = copy.deepcopy(pod)
            pod.setdefault("status", {})["nominatedNodeName"] = node
            self._store(Kind.POD, pod, "MODIFIED")

    def list_resources(self, plural: str) -> list[RawObject]:
        self._maybe_fail(f"list-{plural}")
        with self._cond:
            return copy.deepcopy(list(self._resources(plural).values()))

    def patch_resource_status(self, plural: str, namespace: str | None, name: str, body: RawObject) -> None:
        self._maybe_fail(f"{plural}/status")
        with self._cond:
            obj = self._resources(plural).get(name if namespace is None else (namespace, name))
            if obj is None:
                raise GatewayError(f"{plural} {name!r} not found", 404)
            obj.setdefault("status", {}).update(copy.deepcopy(body["status"]))  # a merge patch replaces lists
            self.status_patches.append((plural, name, copy.deepcopy(body)))

    # --- the autoscaler's ------------------------------------------------------------------------
    def get_controller(self, kind: str, namespace: str, name: str) -> RawObject | None:
        self._maybe_fail("controllers")
        return copy.deepcopy(self.controllers.get((kind, namespace, name)))

    def list_endpoint_slices(self, namespace: str, service: str) -> list[RawObject]:
        self._maybe_fail("endpointslices")
        return copy.deepcopy(self.endpoint_slices)

    def list_hpas(self, label_selector: str) -> list[RawObject]:
        self._maybe_fail("hpas")
        key, _, value = label_selector.partition("=")
        return [copy.deepcopy(h) for h in self.hpas.values() if h["metadata"].get("labels", {}).get(key) == value]

    def upsert_hpa(self, namespace: str, body: RawObject) -> None:
        self._maybe_fail("hpas")
        self.calls.append(f"upsert hpa {namespace}/{body['metadata']['name']}")
        self.hpas[(namespace, body["metadata"]["name"])] = copy.deepcopy(body)

    def delete_hpa(self, namespace: str, name: str) -> None:
        self._maybe_fail("hpas")
        self.calls.append(f"delete hpa {namespace}/{name}")
        self.hpas.pop((namespace, name), None)

    def list_config_maps(self, namespace: str, label_selector: str) -> list[RawObject]:
        self._maybe_fail("configmaps")
        key, _, value = label_selector.partition("=")
        return [
            copy.deepcopy(c)
            for (ns, _), c in self.config_maps.items()
            if ns == namespace and c["metadata"].get("labels", {}).get(key) == value
        ]

    def upsert_config_map(self, namespace: str, body: RawObject) -> None:
        self._maybe_fail("configmaps")
        self.config_maps[(namespace, body["metadata"]["name"])] = copy.deepcopy(body)

    # --- internals ----------------------------------------------------------------------------
    def _resources(self, plural: str) -> dict[Any, RawObject]:
        return {PLURAL_WORKLOAD: self.workloads, PLURAL_GPU_POOL: self.pools}[plural]

    def _maybe_stall(self, op: str, timeout: float | None) -> None:
        with self._cond:
            self.timeouts.append((op, timeout))
            self.stalled = self.stalled or op == self.stall_at
            if not self.stalled:
                return
            assert timeout is not None, f"{op} without a timeout would hang on a stalled API server"
            end = time.monotonic() + timeout
            while self.stalled:
                left = end - time.monotonic()
                if left <= 0:
                    raise GatewayTimeout(f"{op}: the API server did not answer within {timeout:.1f}s (stalled?)")
                self._cond.wait(left)

    def _maybe_fail(self, op: str) -> None:
        error = self.fail.pop(op, None)
        if error is not None:
            raise error

    def _patch(self, pod: RawObject, changes: Mapping[str, str | None]) -> None:
        pod = copy.deepcopy(pod)
        annotations = pod["metadata"].setdefault("annotations", {})
        for k, v in changes.items():
            if v is None:
                annotations.pop(k, None)
            else:
                annotations[k] = v
        self._store(Kind.POD, pod, "MODIFIED")

    def _store_lease(self, key: tuple[str, str], body: RawObject) -> RawObject:
        lease = copy.deepcopy(body)
        self.rv += 1
        lease["metadata"]["resourceVersion"] = str(self.rv)
        self.leases[key] = lease
        return copy.deepcopy(lease)

    def add_claim(self, namespace: str, claim: Claim, node: str) -> None:
        """Another extender replica's claim on ``node``, added to its claims Lease (created if missing)."""
        name = lease_name(node)
        with self._cond:
            lease = self.leases.get((namespace, name))
            text = ((lease or {}).get("metadata", {}).get("annotations") or {}).get(CLAIMS_ANNOTATION)
            board = claims_contract.decode(text) if text else NodeClaims(node=node)
            board = NodeClaims(node=node, horizon=board.horizon, claims=(*board.claims, claim))
            annotations = {CLAIMS_ANNOTATION: claims_contract.encode(board)}
            meta = {"name": name, "namespace": namespace, "annotations": annotations}
            self._store_lease((namespace, name), {"metadata": meta, "spec": {}})

    def _claiming(self, name: str) -> None:
        if "gpu-claims" in name:
            hook, self.before_claim = self.before_claim, None
            if hook is not None:
                hook()

    def _maybe_stall_lease(self, timeout: float | None) -> None:
        """A lease call with a timeout (the binder's claims) stalls with the API server; the leader's have none."""
        if timeout is not None:
            self._maybe_stall("lease", timeout)

    def _store(self, kind: Kind, obj: RawObject, event_type: str) -> RawObject:
        obj = copy.deepcopy(obj)
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        self.objects[kind][_key(obj)] = obj
        self._emit(kind, event_type, obj)
        return obj

    def _emit(self, kind: Kind, event_type: str, obj: RawObject) -> None:
        obj = copy.deepcopy(obj)
        if event_type == "DELETED":  # as the API server does: the deletion has its own resourceVersion
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
        self.log.append((self.rv, kind, WatchEvent(event_type, obj)))  # type: ignore[arg-type]
        self._cond.notify_all()


def _key(obj: RawObject) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if "namespace" in meta else str(meta["name"])


# --- builders -------------------------------------------------------------------------------------
def make_node(
    name: str,
    gpus: int = 2,
    *,
    model: str = "NVIDIA A100-SXM4-80GB",
    tflops: int = 312_000,
    vram: int = 80 * GI,
    pool: str = "default-pool",
    inventory: str | None = None,
    unhealthy: tuple[int, ...] = (),
    backend: EnforcementBackend = EnforcementBackend.HAMI_CORE,
) -> RawObject:
    if inventory is None:
        inv = NodeInventory(
            node=name,
            pool=pool,
            gpus=tuple(
                GpuInfo(
                    uuid=f"GPU-{name}-{i}",
                    index=i,
                    model=model,
                    tflops=tflops,
                    vram=vram,
                    health=Health.UNHEALTHY if i in unhealthy else Health.HEALTHY,
                )
                for i in range(gpus)
            ),
            slices_per_gpu=4,
            backend=backend,
            heartbeat="2026-01-01T00:00:00Z",
        )
        inventory = inventory_contract.encode(inv)
    return {"metadata": {"name": name, "labels": {}, "annotations": {SystemAnnotation.NODE_INVENTORY: inventory}}}


def gpu_request(
    tflops: int = 10_000,
    vram: int = 4 * GI,
    *,
    count: int = 1,
    qos: Qos = Qos.MEDIUM,
    model: str | None = None,
    **kw: Any,
) -> GpuRequest:
    return GpuRequest(
        pool=kw.pop("pool", "default-pool"),
        containers=("main",),
        gpu_count=count,
        tflops_request=tflops,
        tflops_limit=kw.pop("tflops_limit", tflops),
        vram_request=vram,
        vram_limit=kw.pop("vram_limit", vram),
        qos=qos,
        gpu_model=model,
        **kw,
    )


def make_pod(
    name: str,
    request: GpuRequest | None = None,
    *,
    namespace: str = "default",
    uid: str | None = None,
    annotations: Mapping[str, str] | None = None,
    priority: int | None = None,
) -> RawObject:
    """A pod as the API server holds it after admission: ``priority`` defaults to its QoS's class value (what
    the webhook's class and the Priority admission plugin give it), else 0."""
    if priority is None:
        priority = QOS_PRIORITY_VALUE[request.qos] if request is not None else 0
    ann = dict(annotations or {})
    labels = {}
    if request is not None:
        ann[SystemAnnotation.RESOLVED_REQUEST] = resolved_contract.encode(request)
        labels[LABEL_ENABLED] = "true"
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "labels": labels,
            "annotations": ann,
        },
        "spec": {"containers": [{"name": "main", "image": "x"}], "priority": priority, "schedulerName": "x"},
        "status": {"phase": "Pending"},
    }
