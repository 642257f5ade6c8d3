"""MIG units: NVIDIA's profile spelling, the TFLOPS share, and which gpu-model values select a unit."""

from __future__ import annotations

import pytest

from vgpu import mig
from vgpu.catalog import builtin

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("slices", "mib", "name"),
    [
        (1, 4864, "1g.5gb"),
        (1, 9728, "1g.10gb"),
        (2, 9856, "2g.10gb"),
        (3, 20096, "3g.20gb"),
        (7, 40192, "7g.40gb"),
        (7, 81152, "7g.80gb"),
    ],
)
def test_profile_names_are_nvidias(slices: int, mib: int, name: str) -> None:
    assert mig.profile_name(slices, mib * MIB) == name


def test_a_unit_gets_its_slice_share_of_the_parent_tflops_rounded_down() -> None:
    assert mig.unit_tflops(312_000, 1, 7) == 44_571
    assert mig.unit_tflops(165_000, 2, 4) == 82_500  # A30 2g of 4
    assert mig.unit_tflops(312_000, 7, 7) == 312_000


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        ("1g.5gb", ("", "1g.5gb")),
        ("MIG-1g.5gb", ("", "1g.5gb")),
        ("nvidia.com/mig-1g.5gb", ("", "1g.5gb")),
        ("a100-1g.5gb", ("a100", "1g.5gb")),
        ("A100 MIG 1g.5gb", ("a100", "1g.5gb")),
        ("A100-80GB", None),
        ("1g", None),
    ],
)
def test_requests_naming_a_profile(requested: str, expected: tuple[str, str] | None) -> None:
    assert mig.split_request(requested) == expected


CATALOG = builtin()
UNIT = mig.unit_product("A100-SXM4-40GB", "1g.5gb")


@pytest.mark.parametrize(
    ("requested", "product", "matches"),
    [
        ("1g.5gb", UNIT, True),
        ("a100-1g.5gb", UNIT, True),
        ("A100-40GB 1g.5gb", UNIT, True),
        ("h100-1g.5gb", UNIT, False),  # the parent must match the model named
        ("2g.10gb", UNIT, False),  # another profile
        ("A100", UNIT, False),  # a plain model never selects a unit
        ("A100-SXM4-40GB", UNIT, False),
        ("1g.5gb", "NVIDIA A100-SXM4-40GB", False),  # a profile never selects a whole GPU
        ("A100", "NVIDIA A100-SXM4-40GB", True),
    ],
)
def test_which_gpu_model_values_select_a_unit(requested: str, product: str, matches: bool) -> None:
    assert CATALOG.matches(requested, product) is matches
