"""What every Kubernetes adapter of the project speaks: raw objects, one error taxonomy, lists and watch events.

Objects travel as the API's own JSON (``RawObject``), never as the client's models. Every failed call
is a :class:`GatewayError` with the HTTP status where there was one; a watch from a version the
server no longer has is :class:`GoneError` (410); no answer within the call's timeout is
:class:`GatewayTimeout`. Callers branch on these types and statuses, never on message strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

RawObject = dict[str, Any]
EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]


class GatewayError(Exception):
    """A Kubernetes API call failed. ``status`` is the HTTP status when there was a response."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GatewayTimeout(GatewayError):
    """The API server did not answer within the call's timeout: it is stalled, overloaded or unreachable.

    Whether a write took effect is then unknown: the request may still be applied after the answer is lost.
    """


class GoneError(GatewayError):
    """The watch's resourceVersion is too old (HTTP 410): list again."""

    def __init__(self, message: str = "resourceVersion too old") -> None:
        super().__init__(message, 410)


@dataclass(frozen=True, slots=True)
class Listing:
    """The result of a list: the objects and the collection's resourceVersion to watch from."""

    items: list[RawObject]
    resource_version: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    object: RawObject


def precondition_failed(exc: GatewayError) -> bool:
    """A conditional write refused because the object is not as the condition said: 409 Conflict (UID or
    resourceVersion) or 422 (a JSON patch ``test`` that failed, or a path that is no longer there)."""
    return exc.status in (409, 422)
