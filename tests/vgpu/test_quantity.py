"""Kubernetes quantities to exact units, and back."""

from __future__ import annotations

import contextlib
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu import quantity
from vgpu.errors import DomainError


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10", Fraction(10)),
        ("2.5", Fraction(5, 2)),
        ("500m", Fraction(1, 2)),
        ("4Gi", Fraction(4 * 1024**3)),
        ("4096Mi", Fraction(4 * 1024**3)),
        ("4G", Fraction(4 * 10**9)),
        ("1e3", Fraction(1000)),
        ("1E-3", Fraction(1, 1000)),
        ("165160m", Fraction(16516, 100)),
        (".5", Fraction(1, 2)),
        ("5.", Fraction(5)),
        ("+3", Fraction(3)),
        ("-0", Fraction(0)),
        ("1Ki", Fraction(1024)),
        ("2k", Fraction(2000)),
        ("7n", Fraction(7, 10**9)),
        (" 3 ", Fraction(3)),
    ],
)
def test_parse_is_exact(text: str, value: Fraction) -> None:
    assert quantity.parse(text) == value


@pytest.mark.parametrize(
    "text", ["", "abc", "4GiB", "1.2.3", "10 Gi", "Gi", "e3", "1e", "0x10", "4gi", "1e1.5", "1e99", "1e1.0", "0E0."]
)
def test_garbage_is_rejected_with_the_value_quoted(text: str) -> None:
    with pytest.raises(DomainError) as caught:
        quantity.parse(text, key="tensor-fusion.ai/vram-limit")
    assert caught.value.errors[0].key == "tensor-fusion.ai/vram-limit"
    assert repr(text) in str(caught.value)


def test_negative_is_rejected() -> None:
    with pytest.raises(DomainError, match="must not be negative"):
        quantity.parse("-4Gi")


def test_milli_and_bytes_round_up_never_down() -> None:
    assert quantity.parse_milli("165160m") == 165160
    assert quantity.parse_milli("0.0001") == 1  # a request is never silently made smaller
    assert quantity.parse_milli("0.1") + quantity.parse_milli("0.2") == quantity.parse_milli("0.3")
    assert quantity.parse_bytes("1.5") == 2
    assert quantity.parse_bytes("1.5Ki") == 1536


def test_humanize() -> None:
    assert quantity.humanize_tflops(2500) == "2.5"
    assert quantity.humanize_tflops(10000) == "10"
    assert quantity.humanize_bytes(4 * 1024**3) == "4Gi"
    assert quantity.humanize_bytes(1536 * 1024**2) == "1.5Gi"
    assert quantity.humanize_bytes(12) == "12B"


@given(st.integers(min_value=0, max_value=10**15))
def test_milli_round_trips(milli: int) -> None:
    assert quantity.parse_milli(quantity.format_milli(milli)) == milli


@given(st.integers(min_value=0, max_value=2**60))
def test_bytes_round_trip(count: int) -> None:
    text = quantity.format_bytes(count)
    assert quantity.parse_bytes(text) == count
    assert len(text) <= len(str(count))  # canonical form is never longer than plain bytes


DIGITS = st.text(alphabet="0123456789", min_size=1, max_size=12)
NUMBERS = st.one_of(
    DIGITS, st.builds("{}.{}".format, DIGITS, DIGITS), DIGITS.map("{}.".format), DIGITS.map(".{}".format)
)
SUFFIXES = st.one_of(
    st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"]),
    st.builds("{}{}".format, st.sampled_from("eE"), st.integers(-30, 30).map(str)),
    st.builds("e+{}".format, st.integers(0, 30)),
)
VALID_QUANTITIES = st.builds("{}{}{}".format, st.sampled_from(["", "+"]), NUMBERS, SUFFIXES)


@given(VALID_QUANTITIES)
def test_any_valid_quantity_parses_formats_and_parses_back_to_the_same_value(text: str) -> None:
    milli = quantity.parse_milli(text)
    assert quantity.parse_milli(quantity.format_milli(milli)) == milli
    count = quantity.parse_bytes(text)
    assert quantity.parse_bytes(quantity.format_bytes(count)) == count


@given(st.text(max_size=40))
def test_arbitrary_text_parses_or_raises_domain_error(text: str) -> None:
    with contextlib.suppress(DomainError):
        assert quantity.parse(text) >= 0


def test_absurdly_long_numbers_are_rejected_not_crashing() -> None:
    with pytest.raises(DomainError, match="not a Kubernetes quantity"):
        quantity.parse("9" * 10_000)
