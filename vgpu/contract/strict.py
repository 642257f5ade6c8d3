"""A strict reader over decoded JSON: every field present (optional ones may be null), no unknown fields.

Errors name the document and the JSON path (``gpu-inventory: gpus[2].uuid: missing``), so that a
corrupt annotation is reported precisely and never crashes the reader.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from vgpu.errors import DomainError
from vgpu.fields import shown

T = TypeVar("T")


class Reader:
    """Reads one JSON object; call :meth:`done` after the last field to reject unknown keys."""

    def __init__(self, raw: object, path: str) -> None:
        if not isinstance(raw, Mapping):
            raise DomainError.one(path, shown(raw), "must be a JSON object")
        self.raw: Mapping[str, Any] = raw
        self.path = path
        self.seen: set[str] = set()

    def _get(self, key: str, kind: type | tuple[type, ...], what: str, optional: bool) -> Any:
        self.seen.add(key)
        if key not in self.raw:
            raise DomainError.one(f"{self.path}.{key}", None, "missing")
        value = self.raw[key]
        if value is None and optional:
            return None
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            raise DomainError.one(f"{self.path}.{key}", shown(value), f"must be {what}")
        return value

    def text(self, key: str) -> str:
        value: str = self._get(key, str, "a string", False)
        return value

    def opt_text(self, key: str) -> str | None:
        value: str | None = self._get(key, str, "a string", True)
        return value

    def added_text(self, key: str) -> str | None:
        """A string field added to a version after it shipped: absent in what older writers wrote (None)."""
        if key not in self.raw:
            self.seen.add(key)
            return None
        return self.text(key)

    def added_choice(self, key: str, accepted: tuple[str, ...]) -> str | None:
        """A choice added to a version after it shipped: absent in what older writers wrote (None)."""
        value = self.added_text(key)
        return None if value is None else self._accepted(key, value, accepted)

    def added_integer(self, key: str, low: int, high: int) -> int | None:
        """A whole number added to a version after it shipped: absent in what older writers wrote (None)."""
        if key not in self.raw:
            self.seen.add(key)
            return None
        return self.integer(key, low, high)

    def added_integers(self, key: str, low: int, high: int) -> tuple[int, ...] | None:
        """A list of whole numbers added to a version after it shipped: absent in what older writers wrote."""
        if key not in self.raw:
            self.seen.add(key)
            return None
        values: list[Any] = self._get(key, list, "a list of whole numbers", False)
        if not all(isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in values):
            raise DomainError.one(f"{self.path}.{key}", shown(values), f"must be whole numbers from {low} to {high}")
        return tuple(values)

    def added_flag(self, key: str) -> bool:
        """A flag added to a version after it shipped: absent in what older writers wrote (False)."""
        if key not in self.raw:
            self.seen.add(key)
            return False
        return self.flag(key)

    def added_items(self, key: str, parse: Callable[[Reader], T]) -> tuple[T, ...] | None:
        """A list of objects added to a version after it shipped: absent in what older writers wrote (None)."""
        if key not in self.raw:
            self.seen.add(key)
            return None
        return self.items(key, parse)

    def positive_number(self, key: str) -> float:
        value: int | float = self._get(key, (int, float), "a number above 0", False)
        if not 0 < value < math.inf:  # JSON's NaN and Infinity are refused too
            raise DomainError.one(f"{self.path}.{key}", shown(value), "must be a number above 0")
        return float(value)

    def number(self, key: str, *, low: float = 0.0) -> float:
        value = self.opt_number(key, low=low)
        if value is None:
            raise DomainError.one(f"{self.path}.{key}", None, f"must be a number ≥ {low:g}")
        return value

    def opt_number(self, key: str, *, low: float = 0.0) -> float | None:
        value: int | float | None = self._get(key, (int, float), f"a number ≥ {low:g} or null", True)
        if value is not None and not low <= value < math.inf:
            raise DomainError.one(f"{self.path}.{key}", shown(value), f"must be a number ≥ {low:g}")
        return None if value is None else float(value)

    def integer(self, key: str, low: int = 0, high: int | None = None) -> int:
        value: int = self._get(key, int, "a whole number", False)
        return self._within(key, value, low, high)

    def opt_integer(self, key: str, bounds: tuple[int, int] | None = None) -> int | None:
        value: int | None = self._get(key, int, "a whole number or null", True)
        return value if value is None or bounds is None else self._within(key, value, *bounds)

    def _within(self, key: str, value: int, low: int, high: int | None) -> int:
        if high is not None and not low <= value <= high:
            raise DomainError.one(f"{self.path}.{key}", str(value), f"must be a whole number from {low} to {high}")
        if value < low:
            raise DomainError.one(f"{self.path}.{key}", str(value), f"must be ≥ {low}")
        return value

    def flag(self, key: str) -> bool:
        value: bool = self._get(key, bool, "true or false", False)
        return value

    def opt_flag(self, key: str) -> bool | None:
        value: bool | None = self._get(key, bool, "true, false or null", True)
        return value

    def opt_choice(self, key: str, accepted: tuple[str, ...]) -> str | None:
        value = self.opt_text(key)
        return None if value is None else self._accepted(key, value, accepted)

    def obj(self, key: str, optional: bool = False) -> Mapping[str, Any] | None:
        value: Mapping[str, Any] | None = self._get(key, Mapping, "an object", optional)
        return value

    def items(self, key: str, parse: Callable[[Reader], T]) -> tuple[T, ...]:
        values: list[Any] = self._get(key, list, "a list", False)
        return tuple(parse(Reader(v, f"{self.path}.{key}[{i}]")) for i, v in enumerate(values))

    def strings(self, key: str) -> tuple[str, ...]:
        values: list[Any] = self._get(key, list, "a list of strings", False)
        if not all(isinstance(v, str) for v in values):
            raise DomainError.one(f"{self.path}.{key}", shown(values), "must be a list of strings")
        return tuple(values)

    def choice(self, key: str, accepted: tuple[str, ...]) -> str:
        return self._accepted(key, self.text(key), accepted)

    def _accepted(self, key: str, value: str, accepted: tuple[str, ...]) -> str:
        if value not in accepted:
            raise DomainError.one(f"{self.path}.{key}", value, f"must be one of {', '.join(accepted)}")
        return value

    def quantity(self, key: str, parse: Callable[..., int]) -> int:
        return parse(self.text(key), key=f"{self.path}.{key}")

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self.seen)
        if unknown:
            raise DomainError.one(f"{self.path}.{unknown[0]}", None, "unknown field")


def load(text: str, name: str, versions: tuple[str, ...]) -> Reader:
    """Parse the JSON text of a contract document and check its version first."""
    try:
        raw = json.loads(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise DomainError.one(name, shown(text), f"not valid JSON ({exc.__class__.__name__})") from None
    reader = Reader(raw, name)
    version = reader.text("version")
    if version not in versions:
        raise DomainError.one(f"{name}.version", version, f"unsupported; this build reads {', '.join(versions)}")
    return reader


def dump(document: Mapping[str, Any]) -> str:
    """Compact, key-sorted JSON: the same value always encodes to the same bytes (patch only on change)."""
    return json.dumps(document, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
