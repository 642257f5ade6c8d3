"""Node Events for GPU health: ``kubectl describe node`` says when and why a GPU left service; and Events
on a pod and its node when its container tampered with its live limits, or held GPU memory or used compute
past its limit.

A GPU that turns unhealthy leaves the node's allocatable and the extender's placements at once; an
operator looking at a node whose capacity shrank, or at pods that no longer land there, should not
need the plugin's logs to learn which GPU and why. Each flip is posted once, off the gRPC loop. A post the
API server did not take (no answer, 5xx, 429) is tried again a few times over about a minute, as the
kubelet's own recorder does, under one name, so that a try which landed unanswered is refused as a
duplicate rather than posted twice; one it refused, or still not taken, is logged and counted. Tampering
with live limits (docs/security.md, "Tampering with live limits") is posted on the pod, for its owner, and
on the node, naming the pod, for the node's operator; the live-limits keeper posts each kind once per
container. A node whose container toolkit lets other pods take GPUs, or cannot give ours theirs, gets a
Warning of its own.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Final

from device_plugin.background import Background
from device_plugin.cluster.gateway import KubeGateway
from device_plugin.gpus.health import GpuHealth
from device_plugin.metrics import PluginMetrics
from tf_shell.kube.api import GatewayError

log = logging.getLogger(__name__)

REASON_UNHEALTHY: Final = "GpuUnhealthy"
REASON_HEALTHY: Final = "GpuHealthy"
REASON_LIVE_LIMITS_RESTORED: Final = "LiveLimitsRestored"  # a container's limit file tampered with, put back
REASON_LIVE_LIMITS_RESET: Final = "LiveLimitsReset"  # HAMi-core's region beyond repair, reset to an empty file
REASON_VRAM_OVERUSE: Final = "GpuMemoryLimitExceeded"  # a pod past its VRAM limit by the driver's count
REASON_COMPUTE_OVERUSE: Final = "GpuComputeLimitExceeded"  # a pod past its compute cap, over a window
# Seconds before each new try of an Event the API server did not take: about a minute in all (the kubelet's
# recorder tries an Event 12 times, 10 s apart), then it is given up.
RETRY_AFTER_S: Final = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
_ALREADY_EXISTS: Final = 409


def _retryable(exc: GatewayError) -> bool:
    """No answer, or one that says try later: the Event may still be taken."""
    return exc.status is None or exc.status == 429 or exc.status >= 500


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

    def __init__(
        self, gateway: KubeGateway, node: str, metrics: PluginMetrics, retry_after_s: Sequence[float] = RETRY_AFTER_S
    ) -> None:
        self._gateway, self._node, self._metrics = gateway, node, metrics
        self._retry_after_s = tuple(retry_after_s)
        self._background = Background()
        self._closing = asyncio.Event()

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

    def compute_overuse(self, namespace: str, pod: str, uid: str, message: str) -> None:
        """A Warning Event on the pod and one on the node: a pod used more of a GPU than its TFLOPS limit lets it."""
        self._pod_and_node(namespace, pod, uid, REASON_COMPUTE_OVERUSE, message)

    def _pod_and_node(self, namespace: str, pod: str, uid: str, reason: str, message: str) -> None:
        self._background.spawn(self._post(reason, message, True))
        self._background.spawn(self._post_pod(namespace, pod, uid, reason, message))

    async def drain(self) -> None:
        """Wait for the events being posted, tries again included (tests)."""
        await self._background.drain()

    async def close(self) -> None:
        """Stop trying again, and wait for the tries in flight (shutdown: at most one call's timeout)."""
        self._closing.set()
        await self._background.drain()

    async def _post(self, reason: str, message: str, warning: bool) -> None:
        def post(key: str) -> None:
            self._gateway.record_node_event(self._node, reason, message, warning=warning, key=key)

        await self._deliver("node_event", f"{reason} on node {self._node}", post)

    async def _post_pod(self, namespace: str, pod: str, uid: str, reason: str, message: str) -> None:
        def post(key: str) -> None:
            self._gateway.record_pod_event(namespace, pod, uid, self._node, reason, message, warning=True, key=key)

        await self._deliver("pod_event", f"{reason} on pod {namespace}/{pod}", post)

    async def _deliver(self, where: str, what: str, post: Callable[[str], None]) -> None:
        """``post`` the Event under one key, tried again after each of ``retry_after_s`` while the API server
        does not take it; given up (logged, counted under ``where``) when refused or out of tries."""
        key = secrets.token_hex(6)
        for delay in (*self._retry_after_s, None):
            try:
                await asyncio.to_thread(post, key)
                return
            except GatewayError as exc:
                if exc.status == _ALREADY_EXISTS:
                    return  # an earlier try landed; its answer was lost
                if delay is None or not _retryable(exc) or await self._stopping_within(delay):
                    self._give_up(where, what, exc)
                    return
                log.info("could not post %s yet, trying again in %gs: %s", what, delay, exc)
            except Exception as exc:
                self._give_up(where, what, exc)
                return

    async def _stopping_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def _give_up(self, where: str, what: str, exc: Exception) -> None:
        self._metrics.errors.labels(where).inc()
        log.warning("could not post %s: %s", what, exc)
