"""Node Events for GPU health: ``kubectl describe node`` says when and why a GPU left service.

A GPU that turns unhealthy leaves the node's allocatable and the extender's placements at once; an
operator looking at a node whose capacity shrank, or at pods that no longer land there, should not
need the plugin's logs to learn which GPU and why. Each flip is posted once, off the gRPC loop, and a
failed post is logged and counted, never retried into a storm.
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

    async def drain(self) -> None:
        """Wait for the events being posted (tests, shutdown)."""
        await self._background.drain()

    async def _post(self, reason: str, message: str, warning: bool) -> None:
        try:
            await asyncio.to_thread(self._gateway.record_node_event, self._node, reason, message, warning=warning)
        except Exception as exc:
            self._metrics.errors.labels("node_event").inc()
            log.warning("could not post %s on node %s: %s", reason, self._node, exc)
