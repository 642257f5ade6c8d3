"""The pure domain never reads the clock: what import-linter cannot see (datetime is allowed for its arithmetic)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import vgpu

ROOT = Path(vgpu.__file__).parent
CLOCK_READS = frozenset({"now", "utcnow", "today"})
MODULES = sorted(ROOT.rglob("*.py"))


def clock_reads(source: str) -> list[str]:
    """Every ``<something>.now()``, ``.utcnow()`` or ``.today()`` call in ``source``."""
    return [
        f"line {node.lineno}: .{node.func.attr}()"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCK_READS
    ]


def test_the_check_sees_a_clock_read() -> None:
    assert clock_reads("from datetime import datetime\nx = datetime.now()\n") == ["line 2: .now()"]
    assert clock_reads("import datetime\nd = datetime.date.today()\n") == ["line 2: .today()"]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_domain_module_reads_the_clock(path: Path) -> None:
    assert clock_reads(path.read_text()) == []
