"""``nvidia-smi -q -x``, the reference the probe is checked against: the command, and the fields read from
each ``<gpu>`` of its XML (kept apart from the command so that they are tested without a GPU)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from benchmarks.gpu_check.procs import run

SYS_PCI = Path("/sys/bus/pci/devices")


def parse(xml: str) -> ET.Element:
    return ET.fromstring(xml)


def smi_xml() -> ET.Element:
    done = run(["nvidia-smi", "-q", "-x"], timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi -q -x: rc {done.returncode}: {done.stderr.strip()}")
    return parse(done.stdout)


def memory_mib(gpu: ET.Element) -> int:
    """The framebuffer's total, in MiB (``81559 MiB``; 0 when absent)."""
    return int((gpu.findtext("fb_memory_usage/total") or "0 MiB").split()[0])


def mig_mode(gpu: ET.Element) -> str:
    """The current MIG mode as written (``Enabled``, ``Disabled``; ``N/A`` when absent)."""
    return (gpu.findtext("mig_mode/current_mig") or "N/A").strip()


def bus_id(gpu: ET.Element) -> str:
    """The PCI bus id as sysfs names it: nvidia-smi pads the domain to 8 digits, sysfs to 4."""
    return (gpu.findtext("pci/pci_bus_id") or "").lower()[-12:]


def sysfs_numa(bus: str, root: Path = SYS_PCI) -> int | None:
    """The device's ``numa_node`` in sysfs (-1 there when it has none), or None without that file."""
    numa_path = root / bus / "numa_node"
    return int(numa_path.read_text()) if numa_path.exists() else None
