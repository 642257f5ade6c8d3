"""A bind's time budget: one deadline from which every API call's timeout and the gate wait are cut.

kube-scheduler forgets a bind after its ``httpTimeout`` while the late bind may still post its
Binding, so a bind must answer within ``bind_timeout`` whatever the API server does. The budget starts
when the request arrives; the forward steps end ``CLEANUP_SHARE`` of it early, kept for cleaning up
after a failed step, and the gate wait also leaves ``CALLS_SHARE`` for the two writes after it. A call
whose share is spent is not made (:class:`BudgetSpent`); a cleanup call gets at least ``MIN_CALL``.
See scheduler_extender/HANDOFF.md, section "Bind".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tf_shell.kube.api import GatewayError

CLEANUP_SHARE: Final = 1 / 6  # of bind_timeout, kept after the forward steps for the re-read and the rollback
CALLS_SHARE: Final = 1 / 6  # of bind_timeout, kept after the gate wait for the annotation patch and the Binding
MIN_CALL: Final = 0.05  # seconds: a call given less could not be answered anyway


def max_gate_wait(bind_timeout: float) -> float:
    """The longest hand-off wait that fits in a bind of ``bind_timeout`` seconds with its calls."""
    return round(bind_timeout * (1 - CLEANUP_SHARE - CALLS_SHARE), 9)  # 6 -> 4, not 4.000000000000001


class BudgetSpent(GatewayError):
    """The bind's forward budget ran out before an API call could be made (so the call was not made)."""


@dataclass(frozen=True, slots=True)
class Deadline:
    """One bind's deadline on ``clock`` (monotonic seconds)."""

    end: float
    budget: float
    clock: Callable[[], float]

    @classmethod
    def starting_now(cls, budget: float, clock: Callable[[], float]) -> Deadline:
        return cls(end=clock() + budget, budget=budget, clock=clock)

    def left(self) -> float:
        return self.end - self.clock()

    def forward(self, step: str) -> float:
        """The timeout of a forward call; raises BudgetSpent (naming ``step``) when none is left."""
        left = self.left() - self.budget * CLEANUP_SHARE
        if left < MIN_CALL:
            raise BudgetSpent(f"the bind's {self.budget:g}s budget was spent before it could {step}")
        return left

    def gate_wait(self, handoff_wait: float) -> float:
        """How long the gate may be waited for: ``handoff_wait``, less if the writes after it would not fit."""
        return max(0.0, min(handoff_wait, self.left() - self.budget * (CLEANUP_SHARE + CALLS_SHARE)))

    def cleanup(self, share: float = 1.0) -> float:
        """The timeout of a cleanup call: ``share`` of what is left to the deadline, at least MIN_CALL."""
        return max(MIN_CALL, self.left() * share)
