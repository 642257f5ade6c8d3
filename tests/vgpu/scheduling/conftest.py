"""Fixtures for the scheduling core's tests (and the extender's, which import them)."""

from __future__ import annotations

from typing import Any

import pytest

from vgpu.scheduling import filter as filter_module
from vgpu.scheduling import scoring as scoring_module


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The node of every fit check the core makes from here on, in order."""
    checked: list[str] = []
    real = filter_module.check_node

    def counted(demand: Any, node: Any, match: Any) -> Any:
        checked.append(node.name)
        return real(demand, node, match)

    monkeypatch.setattr(filter_module, "check_node", counted)
    monkeypatch.setattr(scoring_module, "check_node", counted)
    return checked
