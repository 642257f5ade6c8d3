"""Kubernetes quantity grammar, parsed to exact integers: milli-TFLOPS and bytes.

TFLOPS and VRAM travel as quantity strings (``'10'``, ``500m``, ``165160m``, ``4Gi``, ``1e3``).
We parse them with :class:`fractions.Fraction`, never floats, so ``0.1 + 0.2`` style drift cannot
leak into capacity arithmetic. Finer-than-unit values round up, as Kubernetes' ``MilliValue`` and
``Value`` do, so a request is never silently made smaller.
"""

from __future__ import annotations

import re
from fractions import Fraction
from math import ceil

from vgpu.errors import DomainError

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_GRAMMAR = re.compile(
    rf"^(?P<sign>[+-]?)(?P<number>{_NUMBER})"
    rf"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]+))?$"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# Kubernetes caps exponents far below this; the cap keeps a hostile '1e999999999' from hanging us.
_MAX_EXPONENT = 30
# Far longer than any real quantity; Python refuses to convert >4300-digit integers (ValueError).
_MAX_LENGTH = 64

MIB = 1024 * 1024
ACCEPTED = "a Kubernetes quantity such as 10, 2.5, 500m, 4Gi, 4096Mi, 4G or 1e3"


def parse(text: str, *, key: str = "quantity") -> Fraction:
    """Parse a quantity to an exact, non-negative Fraction in base units."""
    match = _GRAMMAR.match(text.strip()) if isinstance(text, str) and len(text) <= _MAX_LENGTH else None
    if match is None:
        raise DomainError.one(key, str(text), f"not {ACCEPTED}")
    value = Fraction(match["number"])
    if match["binary"]:
        value *= 1024 ** _BINARY[match["binary"]]
    elif match["decimal"]:
        value *= Fraction(10) ** _DECIMAL[match["decimal"]]
    elif match["exp"] is not None:
        exponent = int(match["exp"])
        if abs(exponent) > _MAX_EXPONENT:
            raise DomainError.one(key, text, f"exponent must be within ±{_MAX_EXPONENT}")
        value *= Fraction(10) ** exponent
    if match["sign"] == "-" and value != 0:
        raise DomainError.one(key, text, "must not be negative")
    return value


def parse_milli(text: str, *, key: str = "quantity") -> int:
    """Parse to thousandths of the unit (milli-TFLOPS), rounding sub-milli values up."""
    return ceil(parse(text, key=key) * 1000)


def parse_bytes(text: str, *, key: str = "quantity") -> int:
    """Parse to whole bytes, rounding fractional bytes up."""
    return ceil(parse(text, key=key))


def format_milli(milli: int) -> str:
    """The shortest canonical quantity for a milli value: ``10`` or ``500m``."""
    if milli < 0:
        raise ValueError(f"negative quantity {milli}")
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def format_bytes(count: int) -> str:
    """The shortest exact binary quantity for a byte count: ``4Gi``, ``1536Mi`` or ``1000``."""
    if count < 0:
        raise ValueError(f"negative quantity {count}")
    for suffix, power in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
        unit = 1024**power
        if count and count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


def humanize_tflops(milli: int) -> str:
    """Human form of milli-TFLOPS for messages: ``10``, ``2.5``, ``0.001``."""
    whole, frac = divmod(milli, 1000)
    return str(whole) if frac == 0 else f"{whole}.{frac:03d}".rstrip("0")


def humanize_bytes(count: int) -> str:
    """Human form of bytes for messages, in the largest binary unit that keeps it readable."""
    for suffix, power in (("Ti", 4), ("Gi", 3), ("Mi", 2), ("Ki", 1)):
        unit = 1024**power
        if count >= unit:
            value = Fraction(count, unit)
            shown = str(value.numerator) if value.denominator == 1 else f"{float(value):.1f}"
            return f"{shown}{suffix}"
    return f"{count}B"
