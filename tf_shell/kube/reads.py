"""The Kubernetes reads of ``tf-metrics``, ``tfctl top`` and ``tfctl autoscale``, with the official client.

tf-metrics finds the device plugins through their Service's EndpointSlices, lists the pods a label
selector chooses, reads the API server's front-proxy configuration and asks SubjectAccessReviews;
``tfctl top`` lists GPU pods and nodes and reads the custom metrics API through the API server (a raw
GET: its answer's status matters, not only its body); ``tfctl autoscale`` lists TensorFusionWorkloads.
Calls go through :mod:`tf_shell.kube.client`; errors are :class:`~tf_shell.kube.api.GatewayError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubernetes import client, config

from tf_shell.kube.api import GatewayError, RawObject
from tf_shell.kube.client import CALL_TIMEOUT, LIST_TIMEOUT, SERVICE_NAME_LABEL, api_client, call, json_body
from tf_shell.kube.reviews import KubeReviews
from vgpu.names import CRD_GROUP, CRD_VERSION, PLURAL_WORKLOAD


class MetricsCluster:
    """The reads over one ApiClient (thread-safe: the poller and the request threads share it)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.discovery = client.DiscoveryV1Api(api)
        self.reviews = KubeReviews(api)
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
        listed = call(
            f"list endpointslices of service {namespace}/{service}",
            lambda: json_body(
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
                return json_body(self.core.list_pod_for_all_namespaces(**options))
            return json_body(self.core.list_namespaced_pod(namespace, **options))

        return _items(call(f"list {where}", listing, LIST_TIMEOUT))

    def nodes(self) -> list[RawObject]:
        listed = call(
            "list nodes",
            lambda: json_body(self.core.list_node(_preload_content=False, _request_timeout=LIST_TIMEOUT)),
            LIST_TIMEOUT,
        )
        return _items(listed)

    def workloads(self, namespace: str | None) -> list[RawObject]:
        """The TensorFusionWorkloads of ``namespace`` (None: every namespace)."""

        def listing() -> RawObject:
            options: dict[str, Any] = {"_preload_content": False, "_request_timeout": LIST_TIMEOUT}
            if namespace is None:
                return json_body(
                    self.custom.list_cluster_custom_object(CRD_GROUP, CRD_VERSION, PLURAL_WORKLOAD, **options)
                )
            return json_body(
                self.custom.list_namespaced_custom_object(CRD_GROUP, CRD_VERSION, namespace, PLURAL_WORKLOAD, **options)
            )

        return _items(call(f"list {PLURAL_WORKLOAD} in {namespace or 'every namespace'}", listing, LIST_TIMEOUT))

    def config_map(self, namespace: str, name: str) -> RawObject:
        return call(
            f"get configmap {namespace}/{name}",
            lambda: json_body(
                self.core.read_namespaced_config_map(
                    name, namespace, _preload_content=False, _request_timeout=CALL_TIMEOUT
                )
            ),
        )

    def review(self, body: RawObject) -> RawObject:
        """Create a SubjectAccessReview; the API server's answer, its status filled in."""
        return self.reviews.review(body)

    def get(self, path: str, query: Sequence[tuple[str, str]] = ()) -> tuple[int, bytes]:
        """GET ``path`` of the API server as this client's user: the status and the body, whatever the status."""
        request = self.api.param_serialize(
            "GET",
            path,
            query_params=list(query),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )

        def get() -> tuple[int, bytes]:
            response = self.api.call_api(*request, _request_timeout=CALL_TIMEOUT)
            return int(response.status), bytes(response.read())  # type: ignore[no-untyped-call]

        return call(f"GET {path}", get)


def _items(listed: RawObject) -> list[RawObject]:
    return [item for item in listed.get("items") or () if isinstance(item, dict)]
