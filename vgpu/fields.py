"""Small validators shared by the request model, the profile parser and the contracts.

Each returns a value or appends a :class:`FieldError` naming the key, the value and what is
accepted, so that a caller can report every problem of an input at once instead of the first.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Final

from vgpu.errors import DomainError, FieldError
from vgpu.quantity import parse_bytes, parse_milli

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_RATIO = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(%?)$")
_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h|d|w))+$")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h|d|w)")
_SECONDS: Final = {
    "ns": Fraction(1, 10**9), "us": Fraction(1, 10**6), "µs": Fraction(1, 10**6), "ms": Fraction(1, 1000),
    "s": Fraction(1), "m": Fraction(60), "h": Fraction(3600), "d": Fraction(86400), "w": Fraction(604800),
}  # fmt: skip
# Longer than any real ratio or duration; Python refuses to convert >4300-digit integers (ValueError).
_MAX_NUMBER_TEXT = 32

MAX_GPU_COUNT: Final = 128
MAX_REPLICAS: Final = 1_000_000
MAX_SHOWN = 120  # characters of a bad value quoted back; annotations can be huge


def shown(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "…"


def boolean(key: str, raw: str, errors: list[FieldError]) -> bool | None:
    if raw in ("true", "false"):
        return raw == "true"
    errors.append(FieldError(key, shown(raw), 'must be "true" or "false"'))
    return None


def integer(key: str, raw: str, low: int, high: int, errors: list[FieldError]) -> int | None:
    text = raw.strip()
    digits = text.lstrip("+")  # ASCII only: "²" is a digit to str.isdigit, and int() refuses it
    if digits.isascii() and digits.isdigit() and len(text) <= 12 and low <= int(text) <= high:
        return int(text)
    errors.append(FieldError(key, shown(raw), f"must be a whole number from {low} to {high}"))
    return None


def choice(key: str, raw: str, accepted: tuple[str, ...], errors: list[FieldError]) -> str | None:
    if raw in accepted:
        return raw
    errors.append(FieldError(key, shown(raw), f"must be one of {', '.join(accepted)}"))
    return None


def dns_name(key: str, raw: str, errors: list[FieldError], *, label: bool = False) -> str | None:
    pattern, limit = (_DNS_LABEL, 63) if label else (_DNS_SUBDOMAIN, 253)
    if len(raw) <= limit and pattern.match(raw):
        return raw
    kind = "DNS-1123 label" if label else "DNS-1123 subdomain"
    errors.append(FieldError(key, shown(raw), f"must be a Kubernetes name (a {kind}: lower-case a-z, 0-9, '-')"))
    return None


def milli(key: str, raw: str, errors: list[FieldError]) -> int | None:
    try:
        return parse_milli(raw, key=key)
    except DomainError as exc:
        errors.extend(_shorten(exc.errors))
        return None


def byte_count(key: str, raw: str, errors: list[FieldError]) -> int | None:
    try:
        return parse_bytes(raw, key=key)
    except DomainError as exc:
        errors.extend(_shorten(exc.errors))
        return None


def ratio(
    key: str, raw: str, errors: list[FieldError], accepted: str, within: Callable[[Fraction], bool]
) -> Fraction | None:
    """A decimal (``0.2``, ``5.0``) or a percentage (``20%``), exactly; ``within`` says which values fit."""
    match = _RATIO.fullmatch(raw) if len(raw) <= _MAX_NUMBER_TEXT else None
    value = None if match is None else Fraction(match[1]) / (100 if match[2] else 1)
    if value is not None and within(value):
        return value
    errors.append(FieldError(key, shown(raw), f"must be {accepted}"))
    return None


def duration(
    key: str, raw: str, errors: list[FieldError], accepted: str, within: Callable[[Fraction], bool]
) -> Fraction | None:
    """Seconds, exactly, from Go's duration units plus days and weeks (``30s``, ``1h30m``, ``7d``)."""
    value = None
    if len(raw) <= _MAX_NUMBER_TEXT and _DURATION.fullmatch(raw):
        value = sum((Fraction(n) * _SECONDS[unit] for n, unit in _DURATION_PART.findall(raw)), Fraction(0))
    if value is not None and within(value):
        return value
    errors.append(FieldError(key, shown(raw), f"must be {accepted}"))
    return None


def _shorten(errors: tuple[FieldError, ...]) -> list[FieldError]:
    return [FieldError(e.key, None if e.value is None else shown(e.value), e.problem) for e in errors]
