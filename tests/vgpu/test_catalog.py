"""GPU model names: normalisation, aliases, capacities and operator overrides."""

from __future__ import annotations

import pytest

from vgpu.catalog import builtin, parse_overrides, tokens
from vgpu.errors import DomainError

CATALOG = builtin()


@pytest.mark.parametrize(
    ("name", "key", "tflops"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", 312_000),
        ("A100-SXM4-80GB", "A100-SXM4-80GB", 312_000),  # older drivers drop the prefix
        ("NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB", 312_000),  # GPU Feature Discovery label
        ("Tesla T4", "T4", 65_000),
        ("Tesla-T4", "T4", 65_000),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756_000),  # vendor dense, not TensorFusion's 835
        ("NVIDIA H100 NVL", "H100 NVL", 835_000),
        ("Tesla V100-PCIE-32GB", "V100-PCIE-32GB", 112_000),
        ("NVIDIA RTX A6000", "RTX A6000", 154_800),  # TensorFusion's 38.71 is the shader rate
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 165_000),
        ("GeForce RTX 2080 Ti", "RTX 2080 Ti", 54_000),
        ("NVIDIA L40S", "L40S", 362_000),
    ],
)
def test_lookup_by_any_spelling(name: str, key: str, tflops: int) -> None:
    model = CATALOG.lookup(name)
    assert model is not None
    assert (model.key, model.tflops_milli) == (key, tflops)


def test_unknown_model_is_none_not_an_error() -> None:
    assert CATALOG.lookup("NVIDIA Quantum Z9000") is None


@pytest.mark.parametrize(
    ("requested", "product", "expected"),
    [
        ("A100", "NVIDIA A100-SXM4-80GB", True),
        ("a100-80gb", "NVIDIA A100-SXM4-80GB", True),
        ("a100-80gb", "NVIDIA A100 80GB PCIe", True),
        ("a100-80gb", "NVIDIA A100-SXM4-40GB", False),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", True),
        ("A10", "NVIDIA A100-SXM4-80GB", False),
        ("A100", "NVIDIA A10", False),
        ("L40s", "NVIDIA L40S", True),
        ("L40", "NVIDIA L40S", False),
        ("H100", "NVIDIA H100 80GB HBM3", True),
        ("H100", "NVIDIA H100 NVL", True),
        ("V100", "Tesla V100S-PCIE-32GB", False),
        ("V100S", "Tesla V100S-PCIE-32GB", True),
        ("4090", "NVIDIA GeForce RTX 4090", True),
        ("RTX 4090", "NVIDIA GeForce RTX 4090", True),
        ("V100M16", "Tesla V100-SXM2-16GB", True),
        ("T4", "Tesla T4", True),
        ("", "Tesla T4", False),
        ("G2", "G2", True),  # unknown models still match themselves
    ],
)
def test_requested_model_matching(requested: str, product: str, expected: bool) -> None:
    assert CATALOG.matches(requested, product) is expected


def test_tokens_ignore_vendor_words_case_and_separators() -> None:
    assert tokens("NVIDIA GeForce RTX_4090") == tokens("rtx-4090") == ("rtx", "4090")


def test_overrides_replace_and_add() -> None:
    overrides = parse_overrides(
        [
            {"key": "A10G", "tflops": "70", "memoryMiB": 22731, "nvmlNames": ["NVIDIA A10G"]},
            {"key": "G2", "tflops": "120", "aliases": ["openb-g2"]},
        ]
    )
    catalog = CATALOG.with_overrides(overrides)
    a10g = catalog.lookup("NVIDIA A10G")
    g2 = catalog.lookup("G2")
    assert a10g is not None and a10g.tflops_milli == 70_000
    assert g2 is not None and g2.tflops_milli == 120_000
    assert catalog.matches("openb-g2", "G2")
    assert len(catalog.models) == len(CATALOG.models) + 1


def test_bad_overrides_name_each_field() -> None:
    with pytest.raises(DomainError) as caught:
        parse_overrides(
            [
                {"key": "X", "tflops": "fast"},
                {"key": "", "tflops": "1"},
                "nope",
                {"key": "Y", "tflops": "1", "memoryMiB": -1},
            ]
        )
    text = str(caught.value)
    assert "gpu catalog[0].tflops 'fast'" in text
    assert "gpu catalog[1].key" in text
    assert "gpu catalog[2]" in text
    assert "gpu catalog[3].memoryMiB" in text


def test_every_builtin_row_has_positive_capacity_and_unique_names() -> None:
    seen: dict[tuple[str, ...], str] = {}
    for model in CATALOG.models:
        assert model.tflops_milli > 0 and model.memory_mib > 0, model.key
        for name in model.nvml_names:
            assert seen.setdefault(tokens(name), model.key) == model.key, name
