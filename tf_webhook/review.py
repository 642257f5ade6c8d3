"""The AdmissionReview wire format (admission.k8s.io/v1): parse a request, build a response.

The API server needs a well-formed AdmissionReview for every call, whatever it sent us; a 5xx or
a crash is turned into the webhook's failurePolicy, which for GPU pods is Fail, so a bad body must
still get a clean, explained denial echoing whatever uid it carried.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from tf_shell import strict_json

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
MAX_MESSAGE: Final = 4000  # characters; the API server copies the message into the client's error


@dataclass(frozen=True, slots=True, kw_only=True)
class ReviewRequest:
    """The fields of ``AdmissionReview.request`` the webhook reads."""

    uid: str
    group: str
    version: str
    kind: str
    operation: str
    namespace: str
    dry_run: bool
    user: str
    object: Mapping[str, Any]


class Denial(Enum):
    """Every kind of denial the webhook answers: its HTTP code with the metav1 StatusReason the API
    server shows the client, together so that no code can go out without its reason."""

    BAD_REQUEST = (400, "BadRequest")  # the pod or the review is wrong: fix it and resubmit
    INTERNAL_ERROR = (500, "InternalError")  # a bug in the webhook
    SERVICE_UNAVAILABLE = (503, "ServiceUnavailable")  # the cluster could not be read or written: retry

    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The webhook's answer before encoding: allow (maybe with a JSONPatch) or deny with a message."""

    allowed: bool
    message: str = ""
    denial: Denial = Denial.BAD_REQUEST  # only read when not allowed
    patch: Sequence[Mapping[str, Any]] = ()
    warnings: tuple[str, ...] = field(default=())


class MalformedReview(ValueError):
    """The body is not an AdmissionReview we can decide on; ``uid`` is echoed when it was readable."""

    def __init__(self, uid: str, message: str) -> None:
        super().__init__(message)
        self.uid = uid


def allow(*, patch: Sequence[Mapping[str, Any]] = (), warnings: tuple[str, ...] = ()) -> Verdict:
    return Verdict(allowed=True, patch=tuple(patch), warnings=warnings)


def deny(message: str, *, denial: Denial = Denial.BAD_REQUEST, warnings: tuple[str, ...] = ()) -> Verdict:
    return Verdict(allowed=False, message=message, denial=denial, warnings=warnings)


def parse(body: bytes) -> ReviewRequest:
    """Parse an AdmissionReview body, or raise :class:`MalformedReview` saying what is wrong.

    Decoded strictly (``strict_json``): a lone surrogate in, say, the uid would otherwise be echoed
    into a response no encoder can write, a 500 the API server turns into the failurePolicy.
    """
    try:
        doc = strict_json.loads(body)
    except json.JSONDecodeError as exc:
        raise MalformedReview("", exc.msg) from None
    if not isinstance(doc, Mapping):
        raise MalformedReview("", "the body must be a JSON object (an AdmissionReview)")
    request = doc.get("request")
    uid = request.get("uid") if isinstance(request, Mapping) else None
    uid = uid if isinstance(uid, str) else ""
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise MalformedReview(uid, f"expected apiVersion {API_VERSION} and kind {KIND}")
    if not isinstance(request, Mapping) or not uid:
        raise MalformedReview(uid, "request.uid is missing")
    kind = request.get("kind")
    obj = request.get("object")
    if not isinstance(kind, Mapping) or not isinstance(obj, Mapping):
        raise MalformedReview(uid, "request.kind and request.object must be objects")
    user = request.get("userInfo")
    return ReviewRequest(
        uid=uid,
        group=_text(kind.get("group")),
        version=_text(kind.get("version")),
        kind=_text(kind.get("kind")),
        operation=_text(request.get("operation")),
        namespace=_text(request.get("namespace")),
        dry_run=request.get("dryRun") is True,
        user=_text(user.get("username")) if isinstance(user, Mapping) else "",
        object=obj,
    )


def respond(uid: str, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview response document for ``verdict``."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.patch:
        raw = json.dumps(list(verdict.patch), separators=(",", ":"), ensure_ascii=False).encode()
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(raw).decode("ascii")
    if not verdict.allowed:
        response["status"] = {
            "metadata": {},
            "status": "Failure",
            "code": verdict.denial.code,
            "reason": verdict.denial.reason,
            "message": clip(verdict.message),
        }
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def clip(message: str, limit: int = MAX_MESSAGE) -> str:
    return message if len(message) <= limit else message[: limit - 1] + "…"


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
