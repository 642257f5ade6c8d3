"""What the e2e tier does through the Kubernetes API: apply manifests, wait on pods, read events.

WHY: scenarios should read like what a user checks (``kubectl get pod -o wide``, ``kubectl
describe``), so the waiting, polling and event reading live here, once, with bounded timeouts and
messages that say what was being waited for and what was seen instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config
from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.dynamic import DynamicClient

T = TypeVar("T")


def api_client(kubeconfig: Path) -> ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig))


def load_docs(paths: Iterable[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in paths:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def apply(api: ApiClient, docs: Iterable[dict[str, Any]], namespace: str = "default") -> None:
    """Server-side apply each object, in order (CRDs before their objects)."""
    dyn = DynamicClient(api)
    for doc in docs:
        resource = _resource(dyn, doc)
        ns = doc["metadata"].get("namespace", namespace) if resource.namespaced else None
        resource.server_side_apply(body=doc, namespace=ns, field_manager="tf-e2e", force_conflicts=True)


def _resource(dyn: DynamicClient, doc: dict[str, Any]) -> Any:
    # A CRD applied a moment ago may not be in the discovery cache yet.
    deadline = time.monotonic() + 30
    while True:
        try:
            return dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        except Exception:
            if time.monotonic() > deadline:
                raise
            dyn.resources.invalidate_cache()
            time.sleep(0.5)


def eventually(what: str, probe: Callable[[], T | None], timeout: float = 60, every: float = 0.3) -> T:
    """Poll ``probe`` until it returns something truthy; fail with the last value seen (404 counts as not yet)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        try:
            last = probe()
        except client.ApiException as e:
            if e.status != 404:
                raise
            last = None
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")
        time.sleep(every)


def kubectl_get(api: ApiClient, path: str) -> list[dict[str, Any]]:
    """The rows ``kubectl get`` prints for the collection at ``path`` (``/apis/<group>/<version>/…``), by
    column name: the API server's Table, whose cells it computes from a CRD's additionalPrinterColumns
    (``-o wide`` columns included)."""
    accept = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    table = json.loads(DynamicClient(api).request("GET", path, header_params=accept, serialize=False).data)
    names = [column["name"] for column in table["columnDefinitions"]]
    return [dict(zip(names, row["cells"], strict=True)) for row in table["rows"]]


def pod(core: CoreV1Api, namespace: str, name: str) -> Any:
    return core.read_namespaced_pod(name, namespace)


def wait_running(core: CoreV1Api, namespace: str, name: str, timeout: float = 90) -> Any:
    def probe() -> Any:
        p = core.read_namespaced_pod(name, namespace)
        if p.status.phase == "Failed":
            raise AssertionError(f"pod {namespace}/{name} failed: {p.status.reason} {p.status.message}")
        return p if p.status.phase == "Running" else None

    return eventually(f"pod {namespace}/{name} Running", probe, timeout)


def wait_running_pods(core: CoreV1Api, namespace: str, selector: str, count: int, timeout: float = 120) -> list[Any]:
    """The pods of ``namespace`` that the label ``selector`` matches, once ``count`` of them are Running."""

    def probe() -> list[Any] | None:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        live = [p for p in pods if p.status.phase == "Running"]
        return live if len(live) == count else None

    return eventually(f"{count} pods {selector} of {namespace} Running", probe, timeout)


def wait_bound(core: CoreV1Api, namespace: str, name: str, timeout: float = 60) -> Any:
    return eventually(
        f"pod {namespace}/{name} bound to a node",
        lambda: p if (p := core.read_namespaced_pod(name, namespace)).spec.node_name else None,
        timeout,
    )


def events_for(core: CoreV1Api, namespace: str, name: str) -> list[str]:
    """The ``reason: message`` lines ``kubectl describe pod`` shows."""
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [f"{e.reason}: {e.message}" for e in events]


def messages(core: CoreV1Api, namespace: str, kind: str, name: str, reason: str) -> list[str]:
    """The messages of the Events with ``reason`` about the ``kind`` object ``name`` in ``namespace``."""
    selector = f"involvedObject.kind={kind},involvedObject.name={name},reason={reason}"
    return [e.message for e in core.list_namespaced_event(namespace, field_selector=selector).items]


def ensure_namespace(api: ApiClient, name: str) -> None:
    """A namespace with its default ServiceAccount, ready for pods (the controllers fill in the rest)."""
    core = CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    except client.ApiException as e:
        if e.status != 409:
            raise
    eventually(
        f"default ServiceAccount in {name}",
        lambda: [sa for sa in core.list_namespaced_service_account(name).items if sa.metadata.name == "default"],
    )


def service_account_token(api: ApiClient, namespace: str, name: str) -> str:
    """A bound token for a ServiceAccount, as a pod running as it would mount."""
    core = CoreV1Api(api)
    try:
        core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata={"name": name}))
    except client.ApiException as e:
        if e.status != 409:
            raise
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=86400)
    )
    token: str = core.create_namespaced_service_account_token(name, namespace, request).status.token
    return token


def untaint_not_ready(core: CoreV1Api, node: str) -> None:
    """What the node-lifecycle controller does once the kubelet reports Ready."""
    n = core.read_node(node)
    taints = [t for t in (n.spec.taints or []) if t.key != "node.kubernetes.io/not-ready"]
    if len(taints) != len(n.spec.taints or []):
        core.patch_node(node, {"spec": {"taints": [core.api_client.sanitize_for_serialization(t) for t in taints]}})


def bind_by_hand(core: CoreV1Api, namespace: str, name: str, node: str) -> None:
    """POST a Binding as an administrator would, bypassing the scheduler and its extender."""
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    # The API answers a Status, which the client cannot read back as a Binding: take the raw answer.
    response = core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
    assert response.status == 201, response.data


def emptied(core: CoreV1Api, namespace: str) -> None:
    """Delete every pod of ``namespace`` at once and wait until they are gone: a scenario leaves the
    kubelet node's GPUs as it found them (later scenarios count on its arithmetic)."""
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    eventually(f"pods of {namespace} gone", lambda: not core.list_namespaced_pod(namespace).items, timeout=120)
