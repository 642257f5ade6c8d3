"""The plugin's port to the Kubernetes API: the few calls it makes, as a protocol.

Only :mod:`device_plugin.kube` implements it against a real API server (the one module that
imports ``kubernetes``); tests use an in-memory fake. Every method blocks, so callers run it in a
thread (``asyncio.to_thread``) and never on the gRPC event loop. Objects travel as the API's own
camelCase JSON (``Mapping``), reduced at the edge by :mod:`device_plugin.pods`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Protocol

WatchKind = Literal["ADDED", "MODIFIED", "DELETED"]
Json = Mapping[str, Any]


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class KubeGateway(Protocol):
    def list_pods(self, node: str) -> tuple[list[Json], str]:
        """Every pod bound to ``node`` and the list's resourceVersion."""
        ...

    def watch_pods(self, node: str, resource_version: str, stop: threading.Event) -> Iterator[tuple[WatchKind, Json]]:
        """Changes to pods on ``node`` after ``resource_version``; ends when the server closes the watch or
        ``stop`` is set; raises :class:`WatchExpired` when the version is gone."""
        ...

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> Json:
        """Merge-patch annotations onto a pod; returns the patched pod."""
        ...

    def get_node(self, name: str) -> Json: ...

    def patch_node(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> None:
        """Merge-patch labels and annotations onto a node."""
        ...

    def patch_node_resources(self, name: str, resources: Mapping[str, str]) -> None:
        """Merge-patch extended resources into the node's status capacity and allocatable."""
        ...

    def record_node_event(self, node: str, reason: str, message: str, *, warning: bool) -> None:
        """Post an Event about ``node`` (what ``kubectl describe node`` shows)."""
        ...
