"""Node Events for GPU health: ``kubectl describe node`` says when and why a GPU left service; and Events
on a pod and its node when its container tampered with its live limits, or held GPU memory past its limit.

A GPU that turns unhealthy leaves the node's allocatable and the extender's placements at once; an
operator looking at a node whose capacity shrank, or at pods that no longer land there, should not
need the plugin's logs to learn which GPU and why. Each flip is posted once, off the gRPC loop, and a
failed post is logged and counted, never retried into a storm. Tampering with live limits
(docs/security.md, "Tampering with live limits") is posted on the pod, for its owner, and on the node,
naming the pod, for the node's operator; the live-limits keeper posts each kind once per container. A node
whose container toolkit lets other pods take GPUs, or cannot give ours theirs, gets a Warning of its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from device_plugin.background import Background
from device_plugin.cluster.gateway import KubeGateway
from device_plugin.gpus.health import GpuHealth
from device_plugin.metrics import PluginMetrics

log = logging.getLogger(__name__)

REASON_UNHEALTHY: Final = "GpuUnhealthy"
REASON_HEALTHY: Final = "GpuHealthy"
REASON_LIVE_LIMITS_RESTORED: Final = "LiveLimitsRestored"  # a container's limit file tampered with, put back
REASON_LIVE_LIMITS_RESET: Final = "LiveLimitsReset"  # HAMi-core's region beyond repair, reset to an empty file
REASON_VRAM_OVERUSE: Final = "GpuMemoryLimitExceeded"  # a pod past its VRAM limit by the driver's count


def event_for(uuid: str, state: GpuHealth) -> tuple[str, str, bool]:
    """(reason, message, warning) for a GPU whose health just flipped."""
    if state.healthy:
        return (
            REASON_HEALTHY,
            f"GPU {uuid} is healthy again: its vGPU slices are allocatable and new pods may use it",
            False,
        )
    return (
        REASON_UNHEALTHY,
        f"GPU {uuid} is unhealthy ({state.reason}): its vGPU slices leave the node's allocatable and no new pod "
        "is placed on it; running pods keep it",
        True,
    )


class NodeEvents:
    """Posts GPU health flips as Events on ``node``; :meth:`gpu_flipped` is the health monitor's hook."""

    def __init__(self, gateway: KubeGateway, node: str, metrics: PluginMetrics) -> None:
        self._gateway, self._node, self._metrics = gateway, node, metrics
        self._background = Background()

    def gpu_flipped(self, uuid: str, state: GpuHealth) -> None:
        self._background.spawn(self._post(*event_for(uuid, state)))

    def node_warning(self, reason: str, message: str) -> None:
        """A Warning Event on the node (its toolkit setup: :mod:`device_plugin.enforcement.toolkit_check`)."""
        self._background.spawn(self._post(reason, message, True))

    def live_limits_tampered(self, namespace: str, pod: str, uid: str, message: str, *, restored: bool) -> None:
        """A Warning Event on the pod and one on the node (``message`` names the pod and the container)."""
        reason = REASON_LIVE_LIMITS_RESTORED if restored else REASON_LIVE_LIMITS_RESET
        self._pod_and_node(namespace, pod, uid, reason, message)

    def vram_overuse(self, namespace: str, pod: str, uid: str, message: str) -> None:
        """A Warning Event on the pod and one on the node: a pod held GPU memory past its VRAM limit."""
        self._pod_and_node(namespace, pod, uid, REASON_VRAM_OVERUSE, message)

    def _pod_and_node(self, namespace: str, pod: str, uid: str, reason: str, message: str) -> None:
        self._background.spawn(self._post(reason, message, True))
        self._background.spawn(self._post_pod(namespace, pod, uid, reason, message))

    async def drain(self) -> None:
        """Wait for the events being posted (tests, shutdown)."""
        await self._background.drain()

    async def _post(self, reason: str, message: str, warning: bool) -> None:
        try:
            await asyncio.to_thread(self._gateway.record_node_event, self._node, reason, message, warning=warning)
        except Exception as exc:
            self._metrics.errors.labels("node_event").inc()
            log.warning("could not post %s on node %s: %s", reason, self._node, exc)

    async def _post_pod(self, namespace: str, pod: str, uid: str, reason: str, message: str) -> None:
        try:
            await asyncio.to_thread(
                self._gateway.record_pod_event, namespace, pod, uid, self._node, reason, message, warning=True
            )
        except Exception as exc:
            self._metrics.errors.labels("pod_event").inc()
            log.warning("could not post %s on pod %s/%s: %s", reason, namespace, pod, exc)
