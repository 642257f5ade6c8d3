"""Proof of who got a grant: the kubelet's own record settles every Allocate answer.

Allocate carries device IDs and no pod, so a pod that reached the node without the extender may be
the one being admitted, and an answer is only *provisional*. The kubelet records ``(pod, container)
→ device IDs`` as soon as Allocate returns, and PodResources ``List`` shows it: an answer is
**confirmed** when the record gives its IDs to the very container it answered for (containers of one pod
may be granted different GPUs: ``container-gpu-count``), **stolen** when it gives them to another pod,
**pending** while it shows them nowhere else yet. A container starts only on proof:
:func:`refusal` is PreStartContainer's reason to refuse one whose IDs the record does not tie to a
grant confirmed for that very pod. See docs/architecture.md, section "The hand-off".

Pure: decisions over plain data.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum

from device_plugin.cluster.pods import PodRecord
from device_plugin.kubelet.kubelet_api import PodDevices
from device_plugin.kubelet.lookup import cached_receipt
from vgpu.errors import DomainError


@dataclass(frozen=True, slots=True)
class Holder:
    """A container the kubelet recorded as holding some device IDs."""

    namespace: str
    pod: str
    container: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class Answer:
    """An Allocate answered with the grant of pod ``uid`` for its ``container``, not yet settled."""

    uid: str
    namespace: str
    pod: str
    container: str
    ids: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"


class Outcome(StrEnum):
    CONFIRMED = "confirmed"
    STOLEN = "stolen"
    PENDING = "pending"


@dataclass(frozen=True, slots=True)
class Settled:
    outcome: Outcome
    holder: Holder | None = None  # for CONFIRMED, the container the kubelet recorded; for STOLEN, the thief


def holders(truth: PodDevices, ids: tuple[str, ...]) -> Iterator[Holder]:
    """Every container whose recorded IDs are exactly ``ids`` (an init container and the app container
    that reuses its IDs may both hold them)."""
    wanted = frozenset(ids)
    for (namespace, pod), containers in truth.items():
        for container, got in containers.items():
            if frozenset(got) == wanted:
                yield Holder(namespace, pod, container)


def settle(answer: Answer, truth: PodDevices) -> Settled:
    """Where the kubelet's record put the IDs of one provisional answer. Recorded only for another container of
    the answer's pod, it stays pending: that container was answered with its sibling's GPUs, so it is never
    proven and never starts (the kubelet and the plugin serve a pod's containers in the same order, so this
    does not happen)."""
    found = list(holders(truth, answer.ids))
    exact = Holder(answer.namespace, answer.pod, answer.container)
    if exact in found:
        return Settled(Outcome.CONFIRMED, exact)
    others = [h for h in found if (h.namespace, h.pod) != (answer.namespace, answer.pod)]
    if others:
        return Settled(Outcome.STOLEN, others[0])
    return Settled(Outcome.PENDING)


def _in_receipt(pod: PodRecord, container: str, ids: frozenset[str]) -> bool:
    if pod.handoff is None:
        return False
    try:
        receipt = cached_receipt(pod.handoff)
    except DomainError:
        return False
    return receipt.pod_uid == pod.uid and any(c == container and frozenset(got) == ids for c, got in receipt.devices)


def proven(
    pod: PodRecord, container: str, ids: tuple[str, ...], confirmed: Mapping[str, Mapping[str, frozenset[str]]]
) -> bool:
    """``pod``'s grant was confirmed for ``container`` with exactly ``ids`` (now, or before a restart)."""
    wanted = frozenset(ids)
    if pod.allocation is None or not pod.active:
        return False
    return confirmed.get(pod.uid, {}).get(container) == wanted or _in_receipt(pod, container, wanted)


def refusal(
    ids: tuple[str, ...],
    truth: PodDevices,
    pods: Mapping[tuple[str, str], PodRecord],
    confirmed: Mapping[str, Mapping[str, frozenset[str]]],
    stolen: Mapping[frozenset[str], Answer],
    node: str,
) -> str | None:
    """Why the container holding ``ids`` must not start, or None when its grant is proven its own.

    ``pods`` are the node's pods by (namespace, name); ``stolen`` maps IDs to the answer whose grant
    another pod's admission took."""
    found = list(holders(truth, ids))
    if not found:
        return f"the kubelet's PodResources shows no container holding devices {list(ids)} on node {node}"
    for holder in found:
        pod = pods.get((holder.namespace, holder.pod))
        if pod is not None and proven(pod, holder.container, ids, confirmed):
            return None
    holder = found[0]
    taken = stolen.get(frozenset(ids))
    if taken is not None and taken.key != holder.key:
        return (
            f"pod {holder.key} (container {holder.container}) was admitted with devices {list(ids)}, but the "
            f"Allocate that gave them answered with pod {taken.key}'s GPU grant: {holder.key} holds no "
            f"tensor-fusion allocation of its own (it reached node {node} without the tensor-fusion scheduler); "
            "refusing to start it on another pod's grant"
        )
    return (
        f"no tensor-fusion grant is proven for pod {holder.key} (container {holder.container}) with devices "
        f"{list(ids)} on node {node}: the pod has no allocation from the tensor-fusion scheduler, or the kubelet "
        "gave these devices to it after an Allocate answered for another pod; refusing to start it"
    )
