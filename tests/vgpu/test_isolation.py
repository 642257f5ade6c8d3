"""The modes a GPU serves and whose limiter its containers get: one table, the one every component reads."""

from __future__ import annotations

import pytest

from vgpu.isolation import enforcing, served
from vgpu.names import EnforcementBackend as B
from vgpu.names import IsolationMode as M


@pytest.mark.parametrize(
    ("backend", "mig_unit", "modes", "limiter"),
    [
        (B.NONE, False, {M.SHARED}, B.NONE),
        (B.HAMI_CORE, False, {M.SHARED, M.SOFT}, B.HAMI_CORE),
        (B.MPS, False, {M.HARD}, B.MPS),
        (B.NONE, True, {M.PARTITIONED}, B.NONE),
        (B.HAMI_CORE, True, {M.PARTITIONED}, B.HAMI_CORE),  # HAMi-core still caps memory inside the unit
        (B.MPS, True, {M.PARTITIONED}, B.NONE),  # no MPS daemon serves MIG units
    ],
)
def test_served_modes_and_limiter(backend: B, mig_unit: bool, modes: set[M], limiter: B) -> None:
    assert served(backend, mig_unit=mig_unit) == modes
    assert enforcing(backend, mig_unit=mig_unit) is limiter
