"""Section 1, the probe: the plugin's ``--probe`` command as an operator runs it, and the NVML probe's own
values compared field by field with ``nvidia-smi -q`` (NUMA with sysfs), with the catalog model each GPU
is published as."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.gpu_check import smi
from benchmarks.gpu_check.constants import MIB, ROOT
from benchmarks.gpu_check.procs import run
from benchmarks.gpu_check.report import REPORT, say, section

if TYPE_CHECKING:
    from device_plugin.gpus.nvml_backend import NvmlProbe
    from device_plugin.gpus.probe import GpuDevice
    from vgpu.contract.inventory import GpuInfo

Check = tuple[Any, Any, bool]  # the probe's value, the reference's, whether they match


def probe_command(out: Path) -> subprocess.CompletedProcess[str]:
    """``python -m device_plugin.main --probe``, and the console script where it is on PATH, into probe.txt."""
    cli = run([sys.executable, "-m", "device_plugin.main", "--probe"], timeout=120, cwd=ROOT)
    (out / "probe.txt").write_text(
        f"$ python -m device_plugin.main --probe  (rc {cli.returncode})\n{cli.stdout}{cli.stderr}"
    )
    script = shutil.which("tf-device-plugin")
    if script is not None:  # the console script as installed; the code from this checkout, like the -m form
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        console = run([script, "--probe"], timeout=120, cwd=ROOT, env=env)
        with (out / "probe.txt").open("a") as f:
            f.write(
                f"\n$ tf-device-plugin --probe  (rc {console.returncode}, {script})\n{console.stdout}{console.stderr}"
            )
        same = console.stdout.splitlines()[:3] == cli.stdout.splitlines()[:3]
        say(f"`tf-device-plugin --probe` ({script}) rc {console.returncode}; its first lines as the -m form's: {same}")
    say(f"`python -m device_plugin.main --probe` rc {cli.returncode}:")
    for line in (cli.stdout or cli.stderr).splitlines()[:40]:
        say(f"    {line}")
    return cli


def field_checks(d: GpuDevice, g: ET.Element, numa_sys: int | None) -> dict[str, Check]:
    """The probed device ``d`` against nvidia-smi's ``<gpu>`` ``g`` and sysfs's NUMA node."""
    fb_total = smi.memory_mib(g)
    mig_text = smi.mig_mode(g)
    return {
        "name": (d.name, g.findtext("product_name"), d.name == g.findtext("product_name")),
        "uuid": (d.uuid, g.findtext("uuid"), d.uuid == g.findtext("uuid")),
        "memory MiB": (d.memory // MIB, fb_total, d.memory // MIB == fb_total),
        "MIG": (d.mig, mig_text, d.mig == (mig_text == "Enabled")),
        "NUMA (vs sysfs numa_node)": (
            d.numa,
            numa_sys,
            d.numa == (numa_sys if numa_sys is None or numa_sys >= 0 else None),
        ),
    }


def gpu_row(d: GpuDevice, g: ET.Element, info: GpuInfo, probe: NvmlProbe, cli_stdout: str) -> dict[str, Any]:
    """One GPU's checks, catalog entry, health check and sample; said as they are found."""
    from vgpu.catalog import builtin

    checks = field_checks(d, g, smi.sysfs_numa(smi.bus_id(g)))
    model = builtin().lookup(d.name)
    row = {
        "index": d.index,
        "checks": {k: {"probe": v[0], "reference": v[1], "match": v[2]} for k, v in checks.items()},
        "catalog model": info.model,
        "in catalog": model is not None,
        "tflops (milli)": info.tflops,
        "catalog VRAM MiB": None if model is None else model.memory_mib,
        "health check": probe.check(d.uuid),
        "sample": str(probe.sample(d.uuid)),
        "cli names model": f"published as {info.model}" in cli_stdout,
    }
    say(
        f"GPU {d.index}: catalog model {info.model!r} (in catalog: {model is not None}), "
        f"{info.tflops / 1000:g} TFLOPS, health check {row['health check'] or 'ok'}"
    )
    for key, (mine, theirs, ok) in checks.items():
        source = "sysfs" if key.startswith("NUMA") else "nvidia-smi"
        say(f"  {key}: probe {mine!r} / {source} {theirs!r}: {'MATCH' if ok else 'MISMATCH'}")
    return row


def all_match(rows: list[dict[str, Any]], cli_rc: int) -> bool:
    """Every field of every GPU matches, and the command exited 0."""
    return all(c["match"] for r in rows for c in r["checks"].values()) and cli_rc == 0


@section("probe")
def probe_check(out: Path) -> dict[str, Any]:
    from device_plugin.gpus.board import discover
    from device_plugin.gpus.nvml_backend import NvmlProbe
    from vgpu.catalog import builtin

    cli = probe_command(out)
    root = smi.smi_xml()
    probe = NvmlProbe()
    try:
        devices = probe.devices()
        gpus = {g.uuid: g for g in discover(devices, builtin(), 0)}
        rows = [
            gpu_row(d, g, gpus[d.uuid], probe, cli.stdout) for d, g in zip(devices, root.findall("gpu"), strict=False)
        ]
    finally:
        probe.close()
    result = {"cli_rc": cli.returncode, "gpus": rows, "all_match": all_match(rows, cli.returncode)}
    REPORT["probe"] = result
    say(f"probe matches nvidia-smi on every field and the command exits 0: {result['all_match']}")
    return result
