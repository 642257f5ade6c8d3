"""Publishes the node inventory (annotation), GPU labels and GPU share resources on our Node, on change and
as a heartbeat.

The extender places pods from this annotation, so it must follow health changes promptly (the board
wakes us) and prove liveness (a heartbeat every ``heartbeat_s``), yet not churn the API server: we
patch only when the content changed or the heartbeat is due. Labels (pool, GPU model, GPU count)
let users select GPU nodes with plain nodeAffinity; two more say what the node's NVIDIA toolkit check
found (:mod:`device_plugin.enforcement.toolkit_check`), for ``tfctl nodes`` and for affinities. The node's
TFLOPS and VRAM totals go into its status as extended resources (``vgpu/node_resources.py``), so
kube-scheduler's fit and preemption, ResourceQuota and ``kubectl describe node`` count GPU shares; the
kubelet keeps resources it does not manage, and a re-created Node gets them back at the next heartbeat.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Callable, Mapping

from device_plugin.cluster.gateway import KubeGateway
from device_plugin.cluster.handoff import rfc3339_now
from device_plugin.enforcement.delivery import NodeSetup
from device_plugin.gpus.board import DeviceBoard
from device_plugin.metrics import PluginMetrics
from vgpu.contract.inventory import NodeInventory, encode
from vgpu.names import (
    DEFAULT_POOL,
    LABEL_NODE_DEVICE_DELIVERY,
    LABEL_NODE_ENVVAR_GUARD,
    LABEL_NODE_GPU_COUNT,
    LABEL_NODE_GPU_MODEL,
    LABEL_NODE_POOL,
    EnforcementBackend,
    SystemAnnotation,
)
from vgpu.node_resources import node_capacity

log = logging.getLogger(__name__)
_RETRY_S = 5.0
_INVALID = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """A valid label value (≤ 63 chars, alphanumeric at both ends): GFD's spelling of a model name."""
    return _INVALID.sub("-", text).strip("-_.")[:63].rstrip("-_.")


def node_labels(inv: NodeInventory, setup: NodeSetup) -> dict[str, str]:
    labels = {
        LABEL_NODE_POOL: label_value(inv.pool),
        LABEL_NODE_GPU_COUNT: str(len(inv.gpus)),
        LABEL_NODE_ENVVAR_GUARD: setup.guard.value,
        LABEL_NODE_DEVICE_DELIVERY: setup.delivery.value,
    }
    if inv.gpus:
        labels[LABEL_NODE_GPU_MODEL] = label_value(min(inv.gpus, key=lambda g: g.index).model)
    return labels


class InventoryPublisher:
    def __init__(
        self,
        gateway: KubeGateway,
        board: DeviceBoard,
        metrics: PluginMetrics,
        *,
        node: str,
        backend: EnforcementBackend,
        setup: Callable[[], NodeSetup],
        pool: str | None = None,
        heartbeat_s: float = 30.0,
        now: Callable[[], str] = rfc3339_now,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gateway, self._board, self._metrics = gateway, board, metrics
        self._node, self._backend, self._setup, self._pool = node, backend, setup, pool
        self._heartbeat_s, self._now, self._clock = heartbeat_s, now, clock
        self._last: tuple[Mapping[str, str], str] | None = None
        self._last_at = 0.0
        self._nudged = asyncio.Event()
        self.patches = 0

    def nudge(self) -> None:
        """Look again now (the toolkit check changed its conclusion: the labels follow at once)."""
        self._nudged.set()

    async def resolve_pool(self) -> str:
        """The pool flag, else the node's existing pool label, else the default pool."""
        if self._pool is None:
            node = await asyncio.to_thread(self._gateway.get_node, self._node)
            labels = (node.get("metadata") or {}).get("labels") or {}
            self._pool = str(labels.get(LABEL_NODE_POOL) or DEFAULT_POOL)
        return self._pool

    def inventory(self, pool: str, heartbeat: str) -> NodeInventory:
        return NodeInventory(
            node=self._node,
            pool=pool,
            gpus=self._board.gpus(),
            slices_per_gpu=self._board.slices_per_gpu,
            backend=self._backend,
            heartbeat=heartbeat,
        )

    async def publish_once(self) -> bool:
        """Patch the node if the inventory changed or the heartbeat is due; True when it patched."""
        pool = await self.resolve_pool()
        content = self.inventory(pool, "")
        state = (node_labels(content, self._setup()), encode(content))
        due = self._last is None or self._clock() - self._last_at >= self._heartbeat_s
        if state == self._last and not due:
            return False
        text = encode(dataclasses.replace(content, heartbeat=self._now()))
        await asyncio.to_thread(
            self._gateway.patch_node, self._node, state[0], {SystemAnnotation.NODE_INVENTORY.value: text}
        )
        await asyncio.to_thread(self._gateway.patch_node_resources, self._node, node_capacity(content))
        self._last, self._last_at = state, self._clock()
        self.patches += 1
        return True

    async def run(self) -> None:
        while True:
            generation = self._board.generation
            try:
                await self.publish_once()
                wait = max(0.05, self._heartbeat_s - (self._clock() - self._last_at))
            except Exception as exc:
                self._metrics.errors.labels("inventory").inc()
                log.warning("cannot publish the node inventory (will retry): %s", exc)
                self._last, wait = None, min(_RETRY_S, self._heartbeat_s)
            changed = asyncio.ensure_future(self._board.wait_change(generation, wait))
            nudged = asyncio.ensure_future(self._nudged.wait())
            try:
                await asyncio.wait((changed, nudged), return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                nudged.cancel()
            self._nudged.clear()
