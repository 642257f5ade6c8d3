"""GPU health as a pure state machine: faults make a GPU unhealthy, a quiet interval heals it.

Kept free of clocks, threads and NVML so that every transition is a table test with injected time.
Inputs are XID events (critical unless in the ignorable set, by default the application-level
XIDs 13, 31, 43, 45, 68 and 109 that NVIDIA's plugin also ignores), periodic check results and the
passing of time. A GPU is unhealthy from its last fault until ``recovery_s`` of clean checks have
passed; both transitions reach ListAndWatch and the node inventory through the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final

# XIDs caused by the application, not the GPU (NVIDIA k8s-device-plugin's default skip list).
DEFAULT_IGNORED_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    recovery_s: float = 60.0


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU's health: ``reason`` says why it is unhealthy; ``last_fault`` is on the caller's clock."""

    healthy: bool = True
    reason: str = ""
    last_fault: float | None = None


HEALTHY: Final = GpuHealth()


def on_xid(state: GpuHealth, xid: int, now: float, policy: HealthPolicy) -> GpuHealth:
    """A driver XID event: critical ones mark the GPU unhealthy and restart the recovery clock."""
    if xid in policy.ignored_xids:
        return state
    return GpuHealth(healthy=False, reason=f"XID {xid}", last_fault=now)


def on_check(state: GpuHealth, problem: str | None, now: float, policy: HealthPolicy) -> GpuHealth:
    """A periodic check: a problem is a fault; a clean check heals once the quiet interval passed."""
    if problem is not None:
        return GpuHealth(healthy=False, reason=problem, last_fault=now)
    if state.healthy or state.last_fault is None:
        return state
    if now - state.last_fault >= policy.recovery_s:
        return replace(HEALTHY, last_fault=state.last_fault)
    return state


@dataclass(frozen=True, slots=True)
class HealthBoard:
    """Every GPU's health; each method returns the new board and the UUIDs whose health flipped."""

    states: Mapping[str, GpuHealth]
    policy: HealthPolicy

    @classmethod
    def fresh(cls, uuids: Iterable[str], policy: HealthPolicy) -> HealthBoard:
        return cls(dict.fromkeys(uuids, HEALTHY), policy)

    def xid(self, uuid: str, xid: int, now: float) -> tuple[HealthBoard, frozenset[str]]:
        """An XID for ``uuid``; an empty or unknown UUID (driver could not tell) faults every GPU."""
        targets = [uuid] if uuid in self.states else list(self.states)
        return self._apply({u: on_xid(self.states[u], xid, now, self.policy) for u in targets})

    def checked(self, results: Mapping[str, str | None], now: float) -> tuple[HealthBoard, frozenset[str]]:
        """Results of one round of periodic checks (``None`` = clean), for GPUs this board knows."""
        return self._apply(
            {
                u: on_check(self.states[u], problem, now, self.policy)
                for u, problem in results.items()
                if u in self.states
            }
        )

    def healthy(self, uuid: str) -> bool:
        return self.states[uuid].healthy

    def _apply(self, updates: Mapping[str, GpuHealth]) -> tuple[HealthBoard, frozenset[str]]:
        flipped = frozenset(u for u, s in updates.items() if s.healthy != self.states[u].healthy)
        return HealthBoard({**self.states, **updates}, self.policy), flipped
