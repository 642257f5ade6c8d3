"""The plugin's port to the Kubernetes API: the few calls it makes, as a protocol.

Only :mod:`device_plugin.cluster.kube` implements it against a real API server (the one module that
imports ``kubernetes``); tests use an in-memory fake. Every method blocks, so callers run it in a
thread (``asyncio.to_thread``) and never on the gRPC event loop. Objects travel as the API's own
camelCase JSON (``Mapping``), reduced at the edge by :mod:`device_plugin.cluster.pods`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal, Protocol

from tf_shell.kube.api import Listing, RawObject, WatchEvent

WatchKind = Literal["ADDED", "MODIFIED", "DELETED"]
Json = Mapping[str, Any]


class KubeGateway(Protocol):
    """Every failed call raises :class:`~tf_shell.kube.api.GatewayError` (with the HTTP status where there was
    one; :class:`~tf_shell.kube.api.GatewayTimeout` when the API server did not answer in time)."""

    def list_pods(self, node: str) -> Listing:
        """Every pod bound to ``node`` and the list's resourceVersion."""
        ...

    def watch_pods(self, node: str, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Changes to pods on ``node`` after ``resource_version`` (BOOKMARKs included) until the server ends the
        watch; raises :class:`~tf_shell.kube.api.GoneError` when the version is gone."""
        ...

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> RawObject:
        """Merge-patch annotations onto a pod; returns the patched pod."""
        ...

    def get_node(self, name: str) -> RawObject: ...

    def patch_node(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> None:
        """Merge-patch labels and annotations onto a node."""
        ...

    def patch_node_resources(self, name: str, resources: Mapping[str, str]) -> None:
        """Merge-patch extended resources into the node's status capacity and allocatable."""
        ...

    def record_node_event(self, node: str, reason: str, message: str, *, warning: bool, key: str) -> None:
        """Post an Event about ``node`` (what ``kubectl describe node`` shows). ``key``: the Event's own part of
        its name, the same on every try of one Event, so a try after one that landed unanswered is refused
        (HTTP 409) rather than posted twice."""
        ...

    def record_pod_event(
        self, namespace: str, name: str, uid: str, node: str, reason: str, message: str, *, warning: bool, key: str
    ) -> None:
        """Post an Event about the pod ``namespace/name`` (``uid``) on ``node`` (what ``kubectl describe pod``
        shows); ``key`` as for :meth:`record_node_event`."""
        ...
