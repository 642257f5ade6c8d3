"""The one error type of the domain: a field, the value it had, and what would have been accepted.

Messages are shown verbatim to users by the webhook's denial and in pod events, so each one names
the key, quotes the bad value and says what is accepted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem with one input field."""

    key: str
    value: str | None
    problem: str

    def __str__(self) -> str:
        shown = "" if self.value is None else f" {self.value!r}"
        return f"{self.key}{shown}: {self.problem}"


class DomainError(ValueError):
    """Raised when an input cannot be turned into a domain value; carries every FieldError found."""

    def __init__(self, errors: Iterable[FieldError]) -> None:
        self.errors: tuple[FieldError, ...] = tuple(errors)
        super().__init__("; ".join(str(e) for e in self.errors) or "invalid input")

    @classmethod
    def one(cls, key: str, value: str | None, problem: str) -> DomainError:
        return cls([FieldError(key, value, problem)])
