"""The status writer's pure core: metav1.Conditions with their transition times, and when a patch is due."""

from __future__ import annotations

from typing import Any

from scheduler_extender.status import Condition, Status, status_patch

T0, T1, T2 = "2027-01-15T08:00:00Z", "2027-01-15T08:00:05Z", "2027-01-15T08:00:10Z"
READY = Condition("Ready", True, "PodsHoldGPUs", "2 of 2 pods hold GPUs")
PENDING = Condition("Ready", False, "PodsPending", "1 of 2 pods hold GPUs; pending: b")


def listed(status: dict[str, Any] | None = None, generation: int | None = 1) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"namespace": "team-a", "name": "train"}, "spec": {}}
    if generation is not None:
        obj["metadata"]["generation"] = generation
    if status is not None:
        obj["status"] = status
    return obj


def applied(obj: dict[str, Any], patch: dict[str, Any] | None) -> dict[str, Any]:
    """``obj`` after the API server applied the merge patch to its status (a list is replaced whole)."""
    assert patch is not None
    return {**obj, "status": {**obj.get("status", {}), **patch["status"]}}


def test_a_first_status_carries_fields_conditions_and_times() -> None:
    patch = status_patch(listed(), Status({"replicas": 2}, (READY,)), T0)
    assert patch == {
        "status": {
            "replicas": 2,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "PodsHoldGPUs",
                    "message": "2 of 2 pods hold GPUs",
                    "lastTransitionTime": T0,
                    "observedGeneration": 1,
                }
            ],
            "lastUpdateTime": T0,
        }
    }


def test_nothing_is_written_while_the_status_says_it_already() -> None:
    desired = Status({"replicas": 2, "allocatedTflops": "20"}, (READY,))
    obj = applied(listed(), status_patch(listed(), desired, T0))
    assert status_patch(obj, desired, T1) is None


def test_a_new_message_keeps_the_transition_time_and_a_flip_moves_it() -> None:
    obj = applied(listed(), status_patch(listed(), Status({}, (PENDING,)), T0))
    other = Condition("Ready", False, "PodsPending", "0 of 2 pods hold GPUs; pending: a, b")
    obj = applied(obj, status_patch(obj, Status({}, (other,)), T1))
    (condition,) = obj["status"]["conditions"]
    assert (condition["message"], condition["lastTransitionTime"], obj["status"]["lastUpdateTime"]) == (
        other.message,
        T0,
        T1,
    )
    obj = applied(obj, status_patch(obj, Status({}, (READY,)), T2))
    (condition,) = obj["status"]["conditions"]
    assert (condition["status"], condition["reason"], condition["lastTransitionTime"]) == ("True", READY.reason, T2)


def test_a_changed_field_reason_or_generation_is_written() -> None:
    desired = Status({"replicas": 2}, (READY,))
    obj = applied(listed(), status_patch(listed(), desired, T0))
    assert status_patch(obj, Status({"replicas": 3}, (READY,)), T1) is not None
    renamed = Condition("Ready", True, "NoPods", READY.message)
    assert status_patch(obj, Status({"replicas": 2}, (renamed,)), T1) is not None
    respecced = {**obj, "metadata": {**obj["metadata"], "generation": 2}}  # spec edited: conditions re-stamped
    patch = status_patch(respecced, desired, T1)
    assert patch is not None and patch["status"]["conditions"][0]["observedGeneration"] == 2
    assert patch["status"]["conditions"][0]["lastTransitionTime"] == T0


def test_an_object_without_a_generation_gets_conditions_without_one() -> None:
    patch = status_patch(listed(generation=None), Status({}, (READY,)), T0)
    assert patch is not None and "observedGeneration" not in patch["status"]["conditions"][0]


def test_a_status_written_by_hand_or_garbled_is_rewritten() -> None:
    desired = Status({"replicas": 2}, (READY,))
    for status in ({"replicas": 2}, {"replicas": 2, "conditions": "Ready"}, {"replicas": 2, "conditions": [7]}):
        patch = status_patch(listed(status), desired, T0)
        assert patch is not None and patch["status"]["conditions"][0]["lastTransitionTime"] == T0
