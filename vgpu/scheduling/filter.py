"""The extender's filter verb as a pure function: which of the offered nodes can hold this pod, and why not.

kube-scheduler distinguishes two kinds of "no": ``FailedNodes`` (Unschedulable — preemption may
still try the node) and ``FailedAndUnresolvableNodes`` (nothing on that node would help, so
preemption skips it). :class:`FilterResult` keeps them apart using the reason's code, keeps the
passing nodes in the order they were offered, and renders the wire maps. The per-node work is in
:func:`vgpu.scheduling.fit.check_node`; this module walks the names once and checks each node
state once: nodes in one state (:meth:`~vgpu.scheduling.model.NodeState.state`) fit a demand
without node affinity alike, so a state that fits passes its other nodes without a check. A state that
does not fit is checked node by node, for each node's own reason (it names the node's GPUs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vgpu.catalog import Catalog
from vgpu.scheduling.fit import ModelMatcher, check_node
from vgpu.scheduling.model import Demand, Snapshot
from vgpu.scheduling.reasons import Reason, ReasonCode

_UNKNOWN = Reason(
    code=ReasonCode.UNKNOWN_NODE, message="node unknown to the GPU extender (no GPU inventory seen for it)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterResult:
    """The outcome of one filter call over the offered node names."""

    passed: tuple[str, ...]
    failed: Mapping[str, Reason] = field(default_factory=dict)
    unresolvable: Mapping[str, Reason] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.passed) + len(self.failed) + len(self.unresolvable)

    def reasons(self) -> dict[str, Reason]:
        """Every rejected node with its reason, resolvable or not."""
        return {**self.failed, **self.unresolvable}

    def failed_messages(self) -> dict[str, str]:
        """``FailedNodes`` as kube-scheduler wants it: node → message."""
        return {name: r.message for name, r in self.failed.items()}

    def unresolvable_messages(self) -> dict[str, str]:
        """``FailedAndUnresolvableNodes``: node → message."""
        return {name: r.message for name, r in self.unresolvable.items()}


def filter_nodes(demand: Demand, snapshot: Snapshot, node_names: Iterable[str], catalog: Catalog) -> FilterResult:
    """Split the offered nodes into those that can take the demand now and those that cannot, with reasons.

    A name offered twice is judged once. Work is O(offered nodes) plus a fit check per fitting node
    state and per node that does not fit (×GPUs per node); with node affinity, a check per node.
    """
    match = ModelMatcher(catalog, demand.gpu_model)
    nodes = snapshot.nodes
    passed: list[str] = []
    failed: dict[str, Reason] = {}
    unresolvable: dict[str, Reason] = {}
    seen: set[str] = set()
    by_state = demand.node_affinity is None  # check_node reads a node's name and labels only for affinity
    fits: dict[int, bool] = {}  # node state -> whether it takes the demand
    for name in node_names:
        if name in seen:
            continue
        seen.add(name)
        node = nodes.get(name)
        if node is None:
            reason: Reason | None = _UNKNOWN
        elif by_state:
            state = node.state()
            fit = fits.get(state)
            if fit:
                passed.append(name)
                continue
            reason = check_node(demand, node, match)
            if fit is None:
                fits[state] = reason is None
        else:
            reason = check_node(demand, node, match)
        if reason is None:
            passed.append(name)
        elif reason.unresolvable:
            unresolvable[name] = reason
        else:
            failed[name] = reason
    return FilterResult(passed=tuple(passed), failed=failed, unresolvable=unresolvable)
