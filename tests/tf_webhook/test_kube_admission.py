"""The Kubernetes shell of the webhook against a fake CustomObjectsApi answering raw JSON, as the shared client
asks for it: 404 → None, errors → a retryable reason, workload upserts that merge and survive a concurrent
writer (409), and GPUPools read from the watch's cache while it is trusted, listed otherwise."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from tf_shell.kube.api import GatewayError, Listing, WatchEvent
from tf_webhook.cluster import ClusterUnavailable
from tf_webhook.kube import KubeAdmission
from tf_webhook.pool_cache import PoolCache
from tf_webhook.workload import WorkloadUpsert

UPSERT = WorkloadUpsert(namespace="ns", name="w", spec={"qos": "high", "resources": {"limits": {"tflops": "20"}}})


class Raw:
    """An unread HTTP response (``_preload_content=False``): the JSON body and the pool's connection calls."""

    def __init__(self, body: Any) -> None:
        self.data = json.dumps(body).encode()
        self.released = False

    def stream(self, amt: Any = None, decode_content: Any = None) -> Any:
        yield self.data

    def drain_conn(self) -> None: ...

    def release_conn(self) -> None:
        self.released = True


class FakeApi:
    """Stores objects with resourceVersions and rejects stale replaces with 409, like the API server."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.before_replace: list[Any] = []
        self.fail_status: int | None = None
        self.pool_calls: list[dict[str, Any]] = []  # the options of each GPUPool LIST or watch
        self.events: list[dict[str, Any]] = []  # what a watch streams

    def get_namespaced_custom_object(self, g: str, v: str, ns: str, plural: str, name: str, **_: Any) -> Any:
        if self.fail_status:
            raise ApiException(status=self.fail_status, reason="Forbidden")
        if (plural, ns, name) not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return Raw(copy.deepcopy(self.objects[(plural, ns, name)]))

    def create_namespaced_custom_object(self, g: str, v: str, ns: str, plural: str, body: Any, **_: Any) -> Raw:
        key = (plural, ns, body["metadata"]["name"])
        if key in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.objects[key] = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
        return Raw(self.objects[key])

    def replace_namespaced_custom_object(
        self, g: str, v: str, ns: str, plural: str, name: str, body: Any, **_: Any
    ) -> Raw:
        if self.before_replace:  # one concurrent write per replace call
            self.before_replace.pop(0)(self)
        current = self.objects[(plural, ns, name)]
        if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        version = str(int(current["metadata"]["resourceVersion"]) + 1)
        self.objects[(plural, ns, name)] = {**body, "metadata": {**body["metadata"], "resourceVersion": version}}
        return Raw(self.objects[(plural, ns, name)])

    def list_cluster_custom_object(self, g: str, v: str, plural: str, **options: Any) -> Any:
        self.pool_calls.append(options)
        if options.get("watch"):
            raw = Raw(None)
            raw.data = b"".join(json.dumps(e).encode() + b"\n" for e in self.events)
            return raw
        items = [o for (p, _, _), o in self.objects.items() if p == plural] + ["junk"]
        return Raw({"metadata": {"resourceVersion": "40"}, "items": items})


def kube(api: FakeApi) -> KubeAdmission:
    return KubeAdmission(api, timeout_s=1.0)  # type: ignore[arg-type]


def unreachable(*_: Any, **__: Any) -> Any:
    raise urllib3.exceptions.ProtocolError("Connection aborted.")


def test_not_found_is_none_and_other_errors_are_unavailable() -> None:
    api = FakeApi()
    assert kube(api).workload_profile("ns", "p") is None
    api.fail_status = 403
    with pytest.raises(ClusterUnavailable, match="get workloadprofiles ns/p: HTTP 403 Forbidden"):
        kube(api).workload_profile("ns", "p")


def test_pools_list_skips_non_objects() -> None:
    api = FakeApi()
    api.objects[("gpupools", "", "a")] = {"metadata": {"name": "a"}}
    assert kube(api).gpu_pools() == [{"metadata": {"name": "a"}}]


def test_pools_come_from_the_trusted_cache_without_a_call() -> None:
    api, cache = FakeApi(), PoolCache()
    api.objects[("gpupools", "", "a")] = {"metadata": {"name": "a"}}
    cache.replace([{"metadata": {"name": "cached"}}])
    assert KubeAdmission(api, 1.0, cache).gpu_pools() == ({"metadata": {"name": "cached"}},)  # type: ignore[arg-type]
    assert api.pool_calls == []


def test_pools_are_listed_while_the_cache_is_not_trusted_or_a_fresh_read_is_asked() -> None:
    api, cache = FakeApi(), PoolCache()
    api.objects[("gpupools", "", "a")] = {"metadata": {"name": "a"}}
    admission = KubeAdmission(api, 1.0, cache)  # type: ignore[arg-type]
    assert admission.gpu_pools() == [{"metadata": {"name": "a"}}]  # not listed yet
    cache.replace([{"metadata": {"name": "cached"}}])
    assert admission.gpu_pools(fresh=True) == [{"metadata": {"name": "a"}}]
    cache.distrust()
    assert admission.gpu_pools() == [{"metadata": {"name": "a"}}]
    assert len(api.pool_calls) == 3


def test_a_failing_live_read_of_the_pools_is_unavailable_even_with_a_cache() -> None:
    api = FakeApi()
    api.list_cluster_custom_object = unreachable  # type: ignore[method-assign]
    with pytest.raises(ClusterUnavailable, match=r"list gpupools: ProtocolError"):
        KubeAdmission(api, 1.0, PoolCache()).gpu_pools()  # type: ignore[arg-type]


def test_the_pool_source_lists_with_the_version_and_watches_from_it() -> None:
    api = FakeApi()
    api.objects[("gpupools", "", "a")] = {"metadata": {"name": "a"}}
    api.events = [
        {"type": "MODIFIED", "object": {"metadata": {"name": "a", "resourceVersion": "41"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "42"}}},
    ]
    source = kube(api).pool_source()
    assert source.list() == Listing(items=[{"metadata": {"name": "a"}}], resource_version="40")
    assert list(source.watch("40", 60)) == [WatchEvent(type=e["type"], object=e["object"]) for e in api.events]
    watched = api.pool_calls[-1]
    assert (watched["watch"], watched["resource_version"], watched["timeout_seconds"]) == (True, "40", 60)


def test_a_watch_error_event_fails_the_watch() -> None:
    api = FakeApi()
    api.events = [{"type": "ERROR", "object": {"code": 500, "message": "etcd unavailable"}}]
    with pytest.raises(GatewayError, match="watch gpupools: etcd unavailable"):
        list(kube(api).pool_source().watch("40", 60))


def test_create_then_merge_keeps_fields_the_pod_does_not_set() -> None:
    api = FakeApi()
    kube(api).upsert_workload(UPSERT)
    api.objects[("tensorfusionworkloads", "ns", "w")]["spec"]["nodeAffinity"] = {"x": 1}
    kube(api).upsert_workload(WorkloadUpsert(namespace="ns", name="w", spec={"qos": "low"}))
    spec = api.objects[("tensorfusionworkloads", "ns", "w")]["spec"]
    assert spec == {"qos": "low", "resources": {"limits": {"tflops": "20"}}, "nodeAffinity": {"x": 1}}


def test_a_concurrent_writer_is_merged_not_overwritten() -> None:
    api = FakeApi()
    kube(api).upsert_workload(UPSERT)

    def operator_edits(a: FakeApi) -> None:
        obj = a.objects[("tensorfusionworkloads", "ns", "w")]
        obj["spec"]["autoScalingConfig"] = {"autoSetLimits": {"enable": True}}
        obj["metadata"]["resourceVersion"] = "7"

    api.before_replace.append(operator_edits)
    kube(api).upsert_workload(WorkloadUpsert(namespace="ns", name="w", spec={"gpuCount": 2}))
    spec = api.objects[("tensorfusionworkloads", "ns", "w")]["spec"]
    assert spec["gpuCount"] == 2 and spec["autoScalingConfig"] == {"autoSetLimits": {"enable": True}}
    assert api.objects[("tensorfusionworkloads", "ns", "w")]["metadata"]["resourceVersion"] == "8"


def test_endless_conflicts_end_in_a_clear_error() -> None:
    api = FakeApi()
    kube(api).upsert_workload(UPSERT)

    def bump(a: FakeApi) -> None:
        obj = a.objects[("tensorfusionworkloads", "ns", "w")]
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        a.before_replace.append(bump)

    api.before_replace.append(bump)
    with pytest.raises(ClusterUnavailable, match="still conflicting after 5 attempts"):
        kube(api).upsert_workload(WorkloadUpsert(namespace="ns", name="w", spec={"gpuCount": 3}))


def test_a_transport_failure_is_unavailable_with_its_cause() -> None:
    api = FakeApi()
    api.list_cluster_custom_object = unreachable  # type: ignore[method-assign]
    with pytest.raises(ClusterUnavailable, match=r"list gpupools: ProtocolError: Connection aborted"):
        kube(api).gpu_pools()
