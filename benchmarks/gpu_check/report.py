"""The check's findings: the report every section fills, the summary lines it prints as it goes, the
section decorator (a failing section is recorded and the next one still runs) and the report files."""

from __future__ import annotations

import functools
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

REPORT: dict[str, Any] = {}  # report.json: each section's figures, and "errors" by section name
SUMMARY: list[str] = []  # report.md: every line said, in order


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    SUMMARY.append(line)


def section(name: str) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
    """A decorator: the section's heading and time are said; an exception is recorded with its traceback
    under ``errors`` and the section returns None, so the next one still runs."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R | None]:
        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R | None:
            say(f"\n## {name}")
            started = time.time()
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # recorded with its traceback: the report says what broke
                REPORT.setdefault("errors", {})[name] = traceback.format_exc()
                say(f"FAILED: {type(exc).__name__}: {exc}")
                return None
            finally:
                say(f"({name}: {time.time() - started:.1f} s)")

        return inner

    return wrap


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=1, default=str)


def render_markdown(summary: list[str]) -> str:
    return "# gpu-check\n" + "\n".join(summary) + "\n"


def write_report(out: Path, report: dict[str, Any] = REPORT, summary: list[str] = SUMMARY) -> None:
    (out / "report.json").write_text(render_json(report))
    (out / "report.md").write_text(render_markdown(summary))


def exit_status(report: dict[str, Any] = REPORT) -> int:
    """1 when a section failed to run, else 0."""
    return 1 if report.get("errors") else 0
