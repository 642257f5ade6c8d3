"""Request bodies decoded strictly, so that nothing an encoder cannot write back gets past the door.

Why: the standard ``json`` module accepts a lone UTF-16 surrogate escape (``"\\ud800"``) and,
through ``surrogatepass``, UTF-8-encoded surrogates, and yields ``str`` values that no UTF-8
encoder will write back out. A verb that echoed one (a node name, a pod name in a message) crashed
while serialising its reply, an HTTP 500, after it had already reserved GPU space. orjson refuses
such input, as it refuses invalid UTF-8, numbers beyond a double and nesting deeper than 1,024; it is
also faster on the 30-60 KB verb bodies. The extender's routes and the webhook decode with
:func:`loads`, whose error says in one line what is wrong and where.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(body: bytes) -> Any:
    """The JSON document in ``body``, or :class:`json.JSONDecodeError` whose ``msg`` names the problem."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise json.JSONDecodeError(_problem(body, exc), "", exc.pos) from None


def _problem(body: bytes, exc: orjson.JSONDecodeError) -> str:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"the body is not valid UTF-8: byte {bad.start} (0x{body[bad.start]:02x}): {bad.reason}"
    if "surrogate" in exc.msg:
        return (
            f"the body holds a lone UTF-16 surrogate escape near character {exc.pos} ({exc.msg}): "
            "\\ud800-\\udfff are not characters unless a high one is followed by a low one"
        )
    return f"the body is not valid JSON: {exc.msg} at character {exc.pos}"
