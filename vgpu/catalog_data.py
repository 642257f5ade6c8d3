"""The built-in GPU table: NVML product names, dense FP16 tensor TFLOPS and memory.

Source: ``reference/gpu-catalog.md``. Where TensorFusion's table and NVIDIA's datasheet disagree we
take NVIDIA's *dense* (no sparsity) figure and say so in ``note``; for GeForce/L40 parts that have
two dense figures we take the FP32-accumulate rate (what mixed-precision training runs at).
Pre-Volta parts have no tensor cores: their figure is the FP16 or FP32 shader rate, as noted.
Operators add or override models through configuration, parsed by :func:`vgpu.catalog.parse_overrides`
and applied with :meth:`vgpu.catalog.Catalog.with_overrides` (the device plugin's ``--gpu-catalog`` file).
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Row(NamedTuple):
    key: str  # canonical model key, also what a node label shows
    nvml_names: tuple[str, ...]  # product names NVML reports (any driver generation)
    tflops: str  # dense FP16 tensor TFLOPS as a decimal string (exact)
    memory_mib: int  # NVML total MiB where known, else marketing GB x 1024
    aliases: tuple[str, ...] = ()  # extra short names users type
    note: str = ""


ROWS: Final[tuple[Row, ...]] = (
    Row("K80", ("Tesla K80",), "4.4", 11441, note="no tensor cores; FP32 shader rate per GPU"),
    Row("M40", ("Tesla M40", "Tesla M40 24GB"), "7", 11448, note="no tensor cores; FP32 shader rate"),
    Row("P4", ("Tesla P4",), "5.5", 7611, note="no tensor cores; FP32 shader rate"),
    Row("P40", ("Tesla P40",), "11.8", 24576, note="no tensor cores; FP32 shader rate"),
    Row("P100-PCIE-16GB", ("Tesla P100-PCIE-16GB",), "18.7", 16280, ("P100",), "FP16 shader rate"),
    Row("P100-PCIE-12GB", ("Tesla P100-PCIE-12GB",), "18.7", 12198, note="FP16 shader rate"),
    Row("P100-SXM2-16GB", ("Tesla P100-SXM2-16GB",), "21.2", 16280, note="FP16 shader rate"),
    Row("V100-SXM2-16GB", ("Tesla V100-SXM2-16GB",), "125", 16160, ("V100M16",)),
    Row("V100-SXM2-32GB", ("Tesla V100-SXM2-32GB", "Tesla V100-SXM3-32GB"), "125", 32510, ("V100M32",)),
    Row(
        "V100-PCIE-16GB",
        ("Tesla V100-PCIE-16GB",),
        "112",
        16160,
        ("V100M16",),
        "vendor dense 112; TensorFusion uses the SXM2 figure 125",
    ),
    Row(
        "V100-PCIE-32GB",
        ("Tesla V100-PCIE-32GB",),
        "112",
        32510,
        ("V100M32",),
        "vendor dense 112; TensorFusion uses the SXM2 figure 125",
    ),
    Row("V100S-PCIE-32GB", ("Tesla V100S-PCIE-32GB",), "130", 32510, ("V100S", "V100M32")),
    Row("T4", ("Tesla T4",), "65", 15109),
    Row(
        "RTX 2080 Ti",
        ("GeForce RTX 2080 Ti",),
        "54",
        11019,
        ("2080Ti",),
        "vendor dense FP32-accumulate ≈54; TensorFusion's 26.9 is the shader rate",
    ),
    Row("A2", ("A2",), "18", 15356),
    Row("A10", ("A10",), "125", 22731),
    Row("A10G", ("A10G",), "125", 22731, note="no NVIDIA datasheet; TensorFusion's figure (unverified)"),
    Row("A16", ("A16",), "18", 15356, note="per GPU (unverified)"),
    Row("A30", ("A30",), "165", 24576),
    Row("A40", ("A40",), "149.7", 46068),
    Row("A100-PCIE-40GB", ("A100-PCIE-40GB", "A100 40GB PCIe"), "312", 40960, ("A100-40GB",)),
    Row("A100-SXM4-40GB", ("A100-SXM4-40GB",), "312", 40960, ("A100-40GB",)),
    Row("A100-PCIE-80GB", ("A100 80GB PCIe", "A100-PCIE-80GB"), "312", 81920, ("A100-80GB",)),
    Row("A100-SXM4-80GB", ("A100-SXM4-80GB",), "312", 81251, ("A100-80GB",)),
    Row("A800-SXM4-80GB", ("A800-SXM4-80GB", "A800 80GB PCIe"), "312", 81251, ("A800-80GB",)),
    Row("A800-SXM4-40GB", ("A800-SXM4-40GB", "A800 40GB PCIe"), "312", 40960, ("A800-40GB",)),
    Row("RTX A4000", ("RTX A4000",), "76.7", 16376, ("A4000",)),
    Row("RTX A5000", ("RTX A5000",), "111", 24564, ("A5000",)),
    Row(
        "RTX A6000",
        ("RTX A6000",),
        "154.8",
        49140,
        ("A6000",),
        "vendor dense 154.8; TensorFusion's 38.71 is the shader rate",
    ),
    Row("RTX 3090", ("GeForce RTX 3090",), "71", 24268, ("3090",), "FP32-accumulate rate"),
    Row("RTX 3090 Ti", ("GeForce RTX 3090 Ti",), "80", 24564, ("3090Ti",), "FP32-accumulate rate"),
    Row("L4", ("L4",), "121", 23034),
    Row("L20", ("L20",), "119.5", 46068),
    Row("L40", ("L40",), "181", 46068, note="FP32-accumulate rate; 362 at full rate"),
    Row("L40S", ("L40S",), "362", 46068, note="vendor dense 362; TensorFusion rounds up to 365"),
    Row("RTX 4090", ("GeForce RTX 4090",), "165", 24564, ("4090",), "FP32-accumulate rate"),
    Row(
        "RTX 6000 Ada",
        ("RTX 6000 Ada Generation",),
        "364",
        49140,
        ("6000Ada",),
        "derived from SM count and clock (unverified); TensorFusion says 323",
    ),
    Row(
        "H100 PCIe",
        ("H100 PCIe",),
        "756",
        81559,
        ("H100-PCIE",),
        "vendor dense 756; TensorFusion uses the NVL figure 835",
    ),
    Row("H100 SXM5", ("H100 80GB HBM3",), "989", 81559, ("H100-SXM", "H100-80GB")),
    Row(
        "H100 NVL",
        ("H100 NVL",),
        "835",
        95830,
        (),
        "vendor dense 835; TensorFusion uses the SXM figure 989",
    ),
    Row("H800 SXM", ("H800 80GB HBM3",), "989", 81559, (), "NVML spelling unverified"),
    Row("H800 PCIe", ("H800 PCIe",), "756", 81559, (), "vendor dense 756; TensorFusion says 835"),
    Row("H20", ("H20",), "148", 97871),
    Row("H200", ("H200",), "989", 143771, ("H200-SXM",)),
    Row("H200 NVL", ("H200 NVL",), "835", 143771),
    Row("GH200", ("GH200 480GB",), "989", 97871, note="NVML spelling unverified"),
    Row("B200", ("B200",), "2250", 184320, note="NVML spelling unverified"),
    Row("GB200", ("GB200",), "2500", 190464, note="unverified"),
    Row("RTX 5090", ("GeForce RTX 5090",), "419", 32607, ("5090",), "full-rate figure"),
)
