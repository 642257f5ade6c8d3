"""How a bind's deadline is shared: forward calls, the gate wait, and the cleanup kept for last."""

from __future__ import annotations

import pytest

from scheduler_extender.deadline import MIN_CALL, BudgetSpent, Deadline, max_gate_wait
from scheduler_extender.settings import Settings


def deadline_at(now: list[float], budget: float = 6.0) -> Deadline:
    return Deadline.starting_now(budget, lambda: now[0])


def test_forward_calls_end_a_sixth_before_the_deadline_and_cleanup_gets_the_rest() -> None:
    now = [100.0]
    deadline = deadline_at(now)
    assert deadline.forward("read the pod") == pytest.approx(5.0)
    now[0] = 104.5
    assert deadline.forward("post the Binding") == pytest.approx(0.5)
    now[0] = 105.0
    with pytest.raises(BudgetSpent, match="6s budget was spent before it could post the Binding"):
        deadline.forward("post the Binding")
    assert deadline.cleanup(0.5) == pytest.approx(0.5) and deadline.cleanup() == pytest.approx(1.0)
    now[0] = 107.0  # past the deadline: a cleanup call is still tried, briefly
    assert deadline.cleanup() == MIN_CALL


def test_the_gate_wait_leaves_room_for_the_writes_after_it() -> None:
    now = [0.0]
    deadline = deadline_at(now)
    assert deadline.gate_wait(3.0) == 3.0  # handoff_wait fits
    assert deadline.gate_wait(5.0) == pytest.approx(4.0)  # 1 s for patch + Binding, 1 s for cleanup
    now[0] = 3.5
    assert deadline.gate_wait(3.0) == pytest.approx(0.5)
    now[0] = 5.0
    assert deadline.gate_wait(3.0) == 0.0


def test_handoff_wait_must_fit_in_bind_timeout() -> None:
    assert max_gate_wait(6.0) == 4.0 and max_gate_wait(7.5) == 5.0
    assert Settings().handoff_wait <= max_gate_wait(Settings().bind_timeout)
    with pytest.raises(ValueError, match=r"handoff_wait 5s does not fit in bind_timeout 6s: it may be at most 4s"):
        Settings(handoff_wait=5, bind_timeout=6)
