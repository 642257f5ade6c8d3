"""The Kubernetes reads of ``tf-metrics``, ``tfctl top`` and ``tfctl autoscale``, with the official client.

tf-metrics finds the device plugins through their Service's EndpointSlices, lists the pods a label
selector chooses, reads the API server's front-proxy configuration and asks SubjectAccessReviews;
``tfctl top`` lists GPU pods and nodes and reads the custom metrics API through the API server (a raw
GET: its answer's status matters, not only its body); ``tfctl autoscale`` lists TensorFusionWorkloads.
Errors are the extender gateway's :class:`~scheduler_extender.gateway.GatewayError`, with the HTTP status
where there is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubernetes import client, config
from urllib3.exceptions import HTTPError

from scheduler_extender.gateway import GatewayError, RawObject
from scheduler_extender.kube.gateway import CALL_TIMEOUT, LIST_TIMEOUT, SERVICE_NAME_LABEL, _call, _json, api_client
from vgpu.names import CRD_GROUP, CRD_VERSION, PLURAL_WORKLOAD


class MetricsCluster:
    """The reads over one ApiClient (thread-safe: the poller and the request threads share it)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.discovery = client.DiscoveryV1Api(api)
        self.authorization = client.AuthorizationV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    @classmethod
    def connect(cls, kubeconfig: str | None) -> MetricsCluster:
        """Over the kubeconfig at that path, else in-cluster config, else $KUBECONFIG or ~/.kube/config;
        GatewayError saying why when there is none to use."""
        try:
            return cls(api_client(kubeconfig))
        except (config.ConfigException, OSError, ValueError) as exc:
            raise GatewayError(f"no usable kubeconfig: {exc}") from None

    def endpoint_slices(self, namespace: str, service: str) -> list[RawObject]:
        listed = _call(
            f"list endpointslices of service {namespace}/{service}",
            lambda: _json(
                self.discovery.list_namespaced_endpoint_slice(
                    namespace,
                    label_selector=f"{SERVICE_NAME_LABEL}={service}",
                    _preload_content=False,
                    _request_timeout=CALL_TIMEOUT,
                )
            ),
        )
        return _items(listed)

    def pods(self, namespace: str | None, label_selector: str) -> list[RawObject]:
        """The pods of ``namespace`` (None: every namespace) that ``label_selector`` chooses."""
        where = f"pods {label_selector!r} in {namespace or 'every namespace'}"

        def listing() -> RawObject:
            options: dict[str, Any] = {
                "label_selector": label_selector,
                "_preload_content": False,
                "_request_timeout": LIST_TIMEOUT,
            }
            if namespace is None:
                return _json(self.core.list_pod_for_all_namespaces(**options))
            return _json(self.core.list_namespaced_pod(namespace, **options))

        return _items(_call(f"list {where}", listing, LIST_TIMEOUT))

    def nodes(self) -> list[RawObject]:
        listed = _call(
            "list nodes",
            lambda: _json(self.core.list_node(_preload_content=False, _request_timeout=LIST_TIMEOUT)),
            LIST_TIMEOUT,
        )
        return _items(listed)

    def workloads(self, namespace: str | None) -> list[RawObject]:
        """The TensorFusionWorkloads of ``namespace`` (None: every namespace)."""

        def listing() -> RawObject:
            options: dict[str, Any] = {"_preload_content": False, "_request_timeout": LIST_TIMEOUT}
            if namespace is None:
                return _json(self.custom.list_cluster_custom_object(CRD_GROUP, CRD_VERSION, PLURAL_WORKLOAD, **options))
            return _json(
                self.custom.list_namespaced_custom_object(CRD_GROUP, CRD_VERSION, namespace, PLURAL_WORKLOAD, **options)
            )

        return _items(_call(f"list {PLURAL_WORKLOAD} in {namespace or 'every namespace'}", listing, LIST_TIMEOUT))

    def config_map(self, namespace: str, name: str) -> RawObject:
        return _call(
            f"get configmap {namespace}/{name}",
            lambda: _json(
                self.core.read_namespaced_config_map(
                    name, namespace, _preload_content=False, _request_timeout=CALL_TIMEOUT
                )
            ),
        )

    def review(self, body: RawObject) -> RawObject:
        """Create a SubjectAccessReview; the API server's answer, its status filled in."""
        return _call(
            "create subjectaccessreview",
            lambda: _json(
                self.authorization.create_subject_access_review(
                    body,  # type: ignore[arg-type]  # a plain dict is sent as is
                    _preload_content=False,
                    _request_timeout=CALL_TIMEOUT,
                )
            ),
        )

    def get(self, path: str, query: Sequence[tuple[str, str]] = ()) -> tuple[int, bytes]:
        """GET ``path`` of the API server as this client's user: the status and the body, whatever the status."""
        request = self.api.param_serialize(
            "GET",
            path,
            query_params=list(query),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(*request, _request_timeout=CALL_TIMEOUT)
            return int(response.status), bytes(response.read())  # type: ignore[no-untyped-call]
        except (client.ApiException, HTTPError, OSError) as exc:
            raise GatewayError(f"GET {path}: {exc.__class__.__name__}: {exc}") from None


def _items(listed: RawObject) -> list[RawObject]:
    return [item for item in listed.get("items") or () if isinstance(item, dict)]
