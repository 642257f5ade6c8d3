"""Hostile JSON bodies: a well-formed body with a lone UTF-16 surrogate, invalid UTF-8 or a huge
number put into one of its strings.

Why shared: the extender's and the webhook's fuzz tests and the end-to-end scenario against the
running extender poison bodies the same way, string by string (keys included), so that "every
string position" means the same thing in all three. kube-scheduler and the API server never send
these (Go's encoder writes U+FFFD instead of a lone surrogate); anyone else on the wire can.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff")  # the ends of the high and the low range
SURROGATE = st.characters(categories=["Cs"])  # U+D800-U+DFFF: never a character on its own
HOSTILE_TEXT = st.builds("{}{}{}".format, st.text(max_size=3), SURROGATE, st.text(max_size=3))
INVALID_UTF8 = (b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80")
HUGE_NUMBERS = ("9" * 4300, "-" + "9" * 400, "1e999", "-1e999", "1" + "0" * 5000, "1.5e-999")
_MARK = "\x00hostile-number"


def string_slots(doc: Any) -> int:
    """How many strings ``doc`` holds, keys included."""
    if isinstance(doc, dict):
        return sum(1 + string_slots(v) for v in doc.values())
    if isinstance(doc, list):
        return sum(string_slots(v) for v in doc)
    return 1 if isinstance(doc, str) else 0


def poisoned(doc: Any, slot: int, extra: str) -> Any:
    """``doc`` with ``extra`` appended to its ``slot``-th string (keys and values, depth first)."""
    left = [slot]

    def hit(text: str) -> str:
        left[0] -= 1
        return text + extra if left[0] == -1 else text

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {hit(key): walk(value) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return hit(node) if isinstance(node, str) else node

    return walk(doc)


def escaped(doc: Any) -> bytes:
    """A lone surrogate as a JSON escape (``\\ud800``): valid UTF-8, not a character."""
    return json.dumps(doc).encode()


def raw(doc: Any) -> bytes:
    """A lone surrogate as the bytes UTF-8 would give the code point (ED A0 80): not UTF-8."""
    return json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")


def with_number(doc: Any, slot: int, number: str) -> bytes:
    """``doc`` encoded with its ``slot``-th string replaced by the JSON number ``number``."""
    text = json.dumps(poisoned(doc, slot, _MARK))
    return re.sub(r'"(?:[^"\\]|\\.)*\\u0000hostile-number"', number, text).encode()


def invalid_utf8(body: bytes, junk: bytes) -> Iterator[tuple[int, bytes]]:
    """``body`` with ``junk`` put just inside each of its strings: (where it starts, the bytes)."""
    for at in (i + 1 for i, byte in enumerate(body) if byte == ord('"')):
        yield at, body[:at] + junk + body[at:]


def every_hostile_body(doc: Any) -> Iterator[tuple[str, bytes]]:
    """Every poisoning of ``doc``, each as (words its refusal must hold, the body); the words are ''
    for a huge number, which may also parse (1.5e-999 is 0.0) and then fail as the wrong type."""
    for slot in range(string_slots(doc)):
        for surrogate in SURROGATES:
            yield "lone UTF-16 surrogate", escaped(poisoned(doc, slot, surrogate))
        yield "not valid UTF-8", raw(poisoned(doc, slot, SURROGATES[0]))
        for number in HUGE_NUMBERS:
            yield "", with_number(doc, slot, number)
    for junk in INVALID_UTF8:
        for at, body in invalid_utf8(escaped(doc), junk):
            yield f"byte {at} (0x{junk[0]:02x})", body
