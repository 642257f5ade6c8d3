"""strict_json: what the standard module lets through is refused, and the message says what and where."""

from __future__ import annotations

import json

import pytest

from tf_shell import strict_json


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"NodeNames":["\\ud800"]}',
            "the body holds a lone UTF-16 surrogate escape near character 15 (no low surrogate in string): "
            "\\ud800-\\udfff are not characters unless a high one is followed by a low one",
        ),
        (
            b'["\\udc00"]',
            "the body holds a lone UTF-16 surrogate escape near character 2 (invalid high surrogate in string): "
            "\\ud800-\\udfff are not characters unless a high one is followed by a low one",
        ),
        (b'{"a":"x\xffy"}', "the body is not valid UTF-8: byte 7 (0xff): invalid start byte"),
        (b'["\xed\xa0\x80"]', "the body is not valid UTF-8: byte 2 (0xed): invalid continuation byte"),
        (b"[" * 2000 + b"]" * 2000, "the body is not valid JSON: depth limit exceeded at character 1025"),
        (b"[1e999]", "the body is not valid JSON: number is infinity when parsed as double at character 1"),
        (b"[NaN]", "the body is not valid JSON: unexpected character, expected a JSON value at character 1"),
    ],
)
def test_what_the_standard_module_accepts_is_refused_by_name(body: bytes, message: str) -> None:
    with pytest.raises(json.JSONDecodeError) as refused:
        strict_json.loads(body)
    assert refused.value.msg == message


def test_a_surrogate_pair_and_plain_json_decode() -> None:
    assert strict_json.loads(b'{"a":["\\ud83d\\ude00",1,2.5,null]}') == {"a": ["\U0001f600", 1, 2.5, None]}
