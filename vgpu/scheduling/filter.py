"""The extender's filter verb as a pure function: which of the offered nodes can hold this pod, and why not.

kube-scheduler distinguishes two kinds of "no": ``FailedNodes`` (Unschedulable — preemption may
still try the node) and ``FailedAndUnresolvableNodes`` (nothing on that node would help, so
preemption skips it). :class:`FilterResult` keeps them apart using the reason's code, keeps the
passing nodes in the order they were offered, and renders the wire maps. The per-node work is in
:func:`vgpu.scheduling.fit.check_node`; this module walks the names once and checks each node
state once: nodes in one state (:meth:`~vgpu.scheduling.model.NodeState.state`) fit a demand
without node affinity alike, so a state that fits passes its other nodes without a check. A state that
does not fit is checked node by node, for each node's own reason (it names the node's GPUs). Over many nodes
every one a state of its own (a cold decision at scale), the nodes that surely fit are found first at once
as arrays (:mod:`vgpu.scheduling.fit_arrays`), and only the others are checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import not_, or_
from typing import Final, cast

from vgpu.catalog import Catalog
from vgpu.scheduling.fit import ModelMatcher, check_node
from vgpu.scheduling.fit_arrays import plain, surely_fit
from vgpu.scheduling.model import Demand, NodeState, Snapshot
from vgpu.scheduling.packed import Columns
from vgpu.scheduling.reasons import Reason, ReasonCode

BATCH: Final = 64  # offered nodes from which the arrays judge a plain demand first (fewer: the check alone)
SAMPLE: Final = 256  # nodes, spread over the offered ones, whose states tell whether those are of many states

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


def filter_nodes(
    demand: Demand,
    snapshot: Snapshot,
    node_names: Iterable[str],
    catalog: Catalog,
    packed: Columns | None = None,
) -> FilterResult:
    """Split the offered nodes into those that can take the demand now and those that cannot, with reasons.

    A name offered twice is judged once. Work is O(offered nodes) plus a fit check per fitting node
    state and per node that does not fit (×GPUs per node); with node affinity, a check per node. Given
    ``packed`` (kept by the caller from one call to the next), many nodes and a plain demand
    (:func:`~vgpu.scheduling.fit_arrays.plain`), the nodes the arrays surely pass skip the check.
    """
    match = ModelMatcher(catalog, demand.gpu_model)
    nodes = snapshot.nodes
    names = tuple(dict.fromkeys(node_names))
    sure = _surely_fit(demand, names, nodes, match, packed)
    passed: list[str] = []
    failed: dict[str, Reason] = {}
    unresolvable: dict[str, Reason] = {}
    by_state = demand.node_affinity is None  # check_node reads a node's name and labels only for affinity
    fits: dict[int, bool] = {}  # node state -> whether it takes the demand
    for name in names if sure is None else compress(names, map(not_, sure)):
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
    if sure is not None:  # the nodes the arrays passed, and those the checks passed, in the offered order
        also = frozenset(passed)
        passed = list(compress(names, map(or_, sure, map(also.__contains__, names)) if also else sure))
    return FilterResult(passed=tuple(passed), failed=failed, unresolvable=unresolvable)


def _surely_fit(
    demand: Demand, names: Sequence[str], nodes: Mapping[str, NodeState], match: ModelMatcher, packed: Columns | None
) -> list[bool] | None:
    """Per name, whether the arrays pass its node (:func:`~vgpu.scheduling.fit_arrays.surely_fit`); None when
    they do not pay (no ``packed``, few nodes, or few node states among a sample of them) or cannot judge the
    demand."""
    if packed is None or len(names) < BATCH or not plain(demand):
        return None
    known = list(map(nodes.get, names))
    at = None if all(known) else [i for i, node in enumerate(known) if node is not None]
    view = cast("list[NodeState]", known if at is None else [known[i] for i in at])
    sample = view[:: max(1, len(view) // SAMPLE)]
    if len(set(map(NodeState.state, sample))) * 4 < len(sample):
        return None  # few states, each checked once by the walk: cheaper than the arrays
    sure: list[bool] = surely_fit(demand, packed.of(view), packed, match).tolist()
    if at is not None:  # nodes unknown to the extender: judged by the check, which says so
        sure, known_sure = [False] * len(names), sure
        for i, ok in zip(at, known_sure, strict=True):
            sure[i] = ok
    return sure
