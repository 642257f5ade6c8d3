"""Which isolation modes a GPU serves, and whose limiter a container granted it gets.

A node's device plugin enforces limits one way (its ``--backend``), and a MIG unit is a hardware partition
whatever the backend, so the modes a GPU serves follow from what its inventory already publishes: the
node's backend and whether the GPU is a MIG unit. Deriving them here, in one place, keeps the inventory
readable by every extender version, and the extender (placement), the device plugin (Allocate's check),
pool status and ``tfctl nodes`` agree. What each mode promises: docs/isolation.md.
"""

from __future__ import annotations

from typing import Final

from vgpu.names import EnforcementBackend, IsolationMode

M = IsolationMode
_BY_BACKEND: Final = {
    EnforcementBackend.NONE: frozenset({M.SHARED}),
    EnforcementBackend.HAMI_CORE: frozenset({M.SHARED, M.SOFT}),
    # An MPS GPU runs in EXCLUSIVE_PROCESS compute mode: only the MPS server's clients can use it.
    EnforcementBackend.MPS: frozenset({M.HARD}),
}
_PARTITION: Final = frozenset({M.PARTITIONED})


def served(backend: EnforcementBackend, *, mig_unit: bool) -> frozenset[IsolationMode]:
    """The modes a GPU serves: a MIG unit is a partition; a whole GPU, what its node's backend enforces."""
    return _PARTITION if mig_unit else _BY_BACKEND[backend]


def enforcing(backend: EnforcementBackend, *, mig_unit: bool) -> EnforcementBackend:
    """The backend whose knobs a container granted this GPU gets: the node's, except that the MPS daemon serves
    whole GPUs only, so a MIG unit on an MPS node gets none (the partition is its limit)."""
    return EnforcementBackend.NONE if mig_unit and backend is EnforcementBackend.MPS else backend
