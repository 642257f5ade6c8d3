"""The emulated GPU's parts built on this machine: ``fake_gpu.c`` as the driver and NVML libraries, the
tenant load's host code against ``cuda_runtime.h``, and what the report and every tenant are told of them."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

from benchmarks.gpu_check.procs import run
from benchmarks.isolation.tenants import UNKNOWN_TFLOPS, Gpu
from vgpu.catalog import builtin
from vgpu.quantity import MIB

HERE = Path(__file__).resolve().parent
FAKE_GPU_C = HERE / "fake_gpu.c"
STATE_VAR = "TF_FAKE_GPU_STATE"  # the state file every process on the emulated GPU shares (fake_gpu.c)
LIBRARIES = ("libcuda.so", "libcuda.so.1", "libnvidia-ml.so", "libnvidia-ml.so.1")  # what the fake answers as
# A launch as tenant_load.cu writes it, `NAME<<<GRID, BLOCK, SHARED, STREAM>>>(`, made a call cuda_runtime.h defines.
LAUNCH = re.compile(r"(\w+)<<<(.+?)>>>\(")


def driver(into: Path) -> Path:
    """The folder holding the fake driver under each name HAMi-core and the linker look for."""
    into.mkdir(parents=True, exist_ok=True)
    lib = into / "libfakegpu.so"
    built = run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", str(FAKE_GPU_C), "-o", str(lib)], timeout=120)
    if built.returncode != 0:
        raise RuntimeError(f"gcc {FAKE_GPU_C.name}: {built.stderr[-2000:]}")
    for name in LIBRARIES:
        (into / name).unlink(missing_ok=True)
        (into / name).symlink_to(lib.name)
    return into


def host_source(cuda: str) -> str:
    """A .cu file's text with each kernel launch made a call of ``cuda_runtime.h``'s ``tf_launch_NAME``."""
    return LAUNCH.sub(r"tf_launch_\1(\2, ", cuda)


def tenant(source: Path, driver_dir: Path, output: Path) -> Path:
    """``source`` (a .cu file) built with g++ for the emulated GPU into ``output``."""
    host = output.with_suffix(".cpp")
    host.write_text(host_source(source.read_text()))
    built = run(
        ["g++", "-O2", "-Wall", "-Werror", f"-I{HERE}", str(host), f"-L{driver_dir}", "-lcuda", "-o", str(output)],
        timeout=120,
    )
    if built.returncode != 0:
        raise RuntimeError(f"g++ {host.name}: {built.stderr[-2000:]}")
    return output


def gpu(driver_dir: Path) -> Gpu:
    """The emulated GPU as the fake driver describes it (its name, UUID and memory), named emulated in the
    report; its catalog TFLOPS are what grants are shares of."""
    lib = ctypes.CDLL(str(driver_dir / "libnvidia-ml.so.1"))
    device, text, memory = ctypes.c_void_p(), ctypes.create_string_buffer(96), ctypes.c_size_t()
    lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device))
    lib.nvmlDeviceGetName(device, text, len(text))
    name = text.value.decode()
    lib.nvmlDeviceGetUUID(device, text, len(text))
    lib.cuDeviceTotalMem_v2(ctypes.byref(memory), 0)
    model = builtin().lookup(name)
    return Gpu(
        index=0,
        uuid=text.value.decode(),
        name=f"{name}, emulated (HAMi-core's own code; the GPU a model: benchmarks/isolation/emulated)",
        memory_mib=memory.value // MIB,
        mig="n/a",
        compute_mode="Default",
        driver="none (fake_gpu.c)",
        cuda="none",
        tflops=model.tflops_milli if model is not None else UNKNOWN_TFLOPS,
        in_catalog=model is not None,
    )


def tenant_env(driver_dir: Path, state: Path) -> dict[str, str]:
    """What every process on the emulated GPU needs: the fake driver first on the library path, the shared state."""
    return {"LD_LIBRARY_PATH": str(driver_dir), STATE_VAR: str(state)}
