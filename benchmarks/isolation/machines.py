"""What the isolation benchmark's runs are made on: the machine's GPU (nvidia-smi, the tenant load built with
nvcc) or the emulated one (benchmarks/isolation/emulated), soft's HAMi-core built for it, and where the
benchmark puts what the device plugin mounts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu_check.hami_build import build_hami
from benchmarks.gpu_check.hami_runs import nvcc_build
from benchmarks.gpu_check.report import say
from benchmarks.gpu_check.smi import smi_xml
from benchmarks.isolation import bench
from benchmarks.isolation.emulated import build as emulated
from benchmarks.isolation.plan import Plan
from benchmarks.isolation.tenants import Gpu, gpu_facts
from device_plugin.enforcement.envs import EnforcementPaths
from vgpu.names import IsolationMode


def paths_for(lib: Path | None) -> EnforcementPaths:
    """Where the benchmark put what the plugin mounts: HAMi-core and its preload list, MPS's pipe folder."""
    preload = bench.WORK / "ld.so.preload"
    preload.write_text(f"{lib}\n" if lib else "")
    return EnforcementPaths(
        hami_library=str(lib or EnforcementPaths().hami_library),
        hami_preload=str(preload),
        mps_pipe_host=str(bench.WORK / "mps" / "pipe"),
    )


@dataclass(frozen=True, slots=True)
class Machine:
    """What the runs are made on: the GPU, the tenant load built for it, soft's HAMi-core (None: not built or
    not asked), and what every tenant's environment needs besides its grant."""

    gpu: Gpu
    binary: Path
    lib: Path | None
    env: dict[str, str]


def real_gpu(made: Plan, hami_src: Path, out: Path) -> Machine:
    """The machine's GPU (nvidia-smi), the tenant load built with nvcc, HAMi-core from ``hami_src``."""
    gpu = gpu_facts(smi_xml())
    say(f"GPU {gpu.index}: {gpu.name} ({gpu.uuid}), driver {gpu.driver}, CUDA {gpu.cuda}, MIG {gpu.mig}")
    binary = nvcc_build(bench.HERE / "tenant_load.cu", bench.WORK / "tenant_load")
    lib = build_hami(hami_src, out) if IsolationMode.SOFT in made.modes else None
    return Machine(gpu, binary, lib, {})


def emulated_gpu(made: Plan, hami_src: Path, out: Path) -> Machine:
    """The emulated GPU (benchmarks/isolation/emulated), fresh: its driver, the tenant load built with g++
    against it, HAMi-core linked against it."""
    driver = emulated.driver(bench.WORK / "emulated")
    state = bench.WORK / "emulated" / "gpu.state"
    state.unlink(missing_ok=True)
    gpu = emulated.gpu(driver)
    say(f"GPU {gpu.index}: {gpu.name}")
    binary = emulated.tenant(bench.HERE / "tenant_load.cu", driver, bench.WORK / "tenant_load")
    lib = build_hami(hami_src, out, driver) if IsolationMode.SOFT in made.modes else None
    return Machine(gpu, binary, lib, emulated.tenant_env(driver, state))
