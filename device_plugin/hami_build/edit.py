"""One anchored replacement in HAMi-core's source, and the error when its anchor is not there exactly once: a
HAMi-core whose code moved is not patched blind."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


class ChangeError(ValueError):
    """The source is not the one a change was written for: the message says what was found."""


@dataclass(frozen=True, slots=True)
class Edit:
    """One replacement in one file of the source: ``pattern`` must match exactly once."""

    path: Path
    what: str  # what the anchor is, for the message when it is not found once
    pattern: re.Pattern[str]
    replacement: str

    def apply(self, text: str, change: str) -> str:
        found = len(self.pattern.findall(text))
        if found != 1:
            raise ChangeError(
                f"{self.path}: expected {self.what} exactly once, found it {found} times; this HAMi-core is not the "
                f"one the change {change} was written for (leave that change out)"
            )
        return self.pattern.sub(lambda _: self.replacement, text)
