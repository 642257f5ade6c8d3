"""``tfctl catalog`` with and without the operator's ``--gpu-catalog`` file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfctl.main import main


def test_catalog_match_lists_the_models_a_gpu_model_value_selects(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--match", "a100-80gb"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[0] for r in rows[1:]] == ["A100-PCIE-80GB", "A100-SXM4-80GB"]


def test_a_catalog_file_adds_models_and_overrides_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "- {key: ACME-X1, tflops: 50, memoryMiB: 32768, nvmlNames: [ACME X1 Accelerator], aliases: [x1]}\n"
        "- {key: A100-SXM4-80GB, tflops: '250.5', memoryMiB: 81920}\n"
    )
    assert main(["catalog", "--match", "x1"]) == 1  # unknown without the file
    assert main(["--gpu-catalog", str(catalog), "catalog", "--match", "x1"]) == 0
    assert main(["--gpu-catalog", str(catalog), "catalog", "--match", "a100-sxm4-80gb"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "no known model matches 'x1' (an unknown model still matches GPUs reporting that name)"
    assert out[2].split() == ["ACME-X1", "50", "32Gi"]
    assert out[4].split() == ["A100-SXM4-80GB", "250.5", "80Gi"]


@pytest.mark.parametrize("command", [["catalog"], ["plan", "pods.csv", "cluster.yaml"]])
def test_an_unusable_catalog_file_is_an_input_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("- {key: ACME-X1, tflops: fast}\n")
    assert main(["--gpu-catalog", str(catalog), *command]) == 2
    assert f"{catalog}[0].tflops 'fast'" in capsys.readouterr().err
