"""HAMi-core's ``libvgpu.so`` built from its exported source as its ``build.sh`` builds it (CMake, target
vgpu), with a direct gcc build of the same sources as the fallback, and the CUDA toolkit's folders that
both need found on this machine."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from benchmarks.gpu_check.constants import WORK
from benchmarks.gpu_check.procs import run
from benchmarks.gpu_check.report import REPORT, say

FEATURES = ("MULTIPROCESS_LIMIT_ENABLE", "DLSYM_HOOK_ENABLE", "HOOK_MEMINFO_ENABLE", "HOOK_NVML_ENABLE")
SOURCES = (  # under src/: libvgpu.so's sources, as its CMake target vgpu lists them
    "libvgpu.c",
    "utils.c",
    "log_utils.c",
    "nvml/nvml_entry.c",
    "nvml/hook.c",
    "cuda/context.c",
    "cuda/device.c",
    "cuda/event.c",
    "cuda/graph.c",
    "cuda/hook.c",
    "cuda/memory.c",
    "cuda/stream.c",
    "allocator/allocator.c",
    "multiprocess/multiprocess_memory_limit.c",
    "multiprocess/multiprocess_utilization_watcher.c",
)


def cuda_home() -> Path:
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parent.parent if nvcc else Path("/usr/local/cuda")


def link_dir(home: Path) -> tuple[Path, list[str]]:
    """A folder where ``-lcuda`` and ``-lnvidia-ml`` resolve: the toolkit's stubs where it has them, else the
    driver's own libraries (often present only as ``.so.1``, which the linker does not look for)."""
    folder = WORK / "link"
    folder.mkdir(parents=True, exist_ok=True)
    known = run(["ldconfig", "-p"]).stdout
    chosen = []
    for name in ("libcuda.so", "libnvidia-ml.so"):
        candidates = [
            home / "lib64" / "stubs" / name,
            home / "targets" / "x86_64-linux" / "lib" / "stubs" / name,
            Path("/usr/local/cuda/lib64/stubs") / name,
            *[Path(line.split(" => ")[-1].strip()) for line in known.splitlines() if f"{name}.1 " in line],
        ]
        found = next((c for c in candidates if c.exists()), None)
        if found is not None:
            link = folder / name
            link.unlink(missing_ok=True)
            link.symlink_to(found)
            chosen.append(f"{name} -> {found}")
        else:
            chosen.append(f"{name}: not found")
    return folder, chosen


def include_dirs(home: Path) -> list[Path]:
    """Folders holding cuda.h and nvml.h: the toolkit's, else the first other one that has them."""
    roots = [home / "include", home / "targets" / "x86_64-linux" / "include", Path("/usr/local/cuda/include")]
    roots += sorted(Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/*/include"))
    dirs = []
    for header in ("cuda.h", "nvml.h"):
        found = next((r for r in roots if (r / header).exists()), None)
        if found is not None and found not in dirs:
            dirs.append(found)
    return dirs


def static_config(template: str) -> str:
    """HAMi-core's ``static_config.h`` from its ``.in`` template as CMake would configure it: the four
    feature switches defined, every other ``#cmakedefine`` left undefined, the git fields filled."""
    header = template
    for name in FEATURES:
        header = header.replace(f"#cmakedefine {name}\n", f"#define {name}\n")
    return header.replace("#cmakedefine ", "// #undef ").replace("@GIT_HASH@", "x").replace("@GIT_BRANCH@", "x")


def cmake_build(src: Path, build: Path, home: Path, env: dict[str, str], log: list[str]) -> bool:
    """build.sh's configuration (Debug, its four feature switches), target vgpu only (HAMi-core's own test
    programs are not what is checked here)."""
    configure = run(
        [
            "cmake",
            "-S",
            str(src),
            "-B",
            str(build),
            "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
            "-DDLSYM_HOOK_ENABLE=1",
            "-DMULTIPROCESS_LIMIT_ENABLE=1",
            "-DHOOK_MEMINFO_ENABLE=1",
            "-DHOOK_NVML_ENABLE=1",
            "-DCMAKE_BUILD_TYPE=Debug",
            "-DTEST_DEVICE_ID=0",
            f"-DCUDA_TOOLKIT_ROOT_DIR={home}",
        ],
        env=env,
        timeout=180,
    )
    log.append(f"$ cmake configure: rc {configure.returncode}\n{configure.stdout}{configure.stderr}")
    if configure.returncode != 0:
        return False
    made = run(
        ["cmake", "--build", str(build), "--target", "vgpu", "-j", str(os.cpu_count() or 8)], env=env, timeout=240
    )
    log.append(f"$ cmake --build --target vgpu: rc {made.returncode}\n{made.stdout[-4000:]}{made.stderr[-6000:]}")
    return made.returncode == 0 and (build / "libvgpu.so").exists()


def gcc_build(src: Path, build: Path, includes: list[Path], libs: Path, env: dict[str, str], log: list[str]) -> bool:
    """The same sources compiled directly with build.sh's Debug flags."""
    (build / "config").mkdir(parents=True, exist_ok=True)
    (build / "config" / "static_config.h").write_text(static_config((src / "src" / "static_config.h.in").read_text()))
    lib = build / "libvgpu.so"
    gcc = run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-g",
            "-D_GNU_SOURCE",
            "-Wall",
            *[f"-I{d}" for d in includes],
            f"-I{src / 'src'}",
            f"-I{build / 'config'}",
            *[str(src / "src" / p) for p in SOURCES],
            f"-L{libs}",
            "-Wl,--no-as-needed",
            "-lcuda",
            "-lnvidia-ml",
            "-lpthread",
            "-ldl",
            "-o",
            str(lib),
        ],
        env=env,
        timeout=240,
    )
    log.append(f"$ gcc fallback: rc {gcc.returncode}\n{gcc.stderr[-6000:]}")
    return gcc.returncode == 0 and lib.exists()


def build_hami(src: Path, out: Path, driver: Path | None = None) -> Path | None:
    """libvgpu.so, by CMake or else by gcc, its log in hami-build.log; None (said) when neither built it. With
    ``driver`` (a folder holding libcuda.so and libnvidia-ml.so: the emulated GPU's), by gcc against those."""
    home = cuda_home()
    libs, chosen = (driver, [f"the driver in {driver}"]) if driver is not None else link_dir(home)
    includes = include_dirs(home)
    env = {
        **os.environ,
        "CUDA_HOME": str(home),
        "LIBRARY_PATH": ":".join([str(libs), os.environ.get("LIBRARY_PATH", "")]),
        "CPATH": ":".join([*map(str, includes), os.environ.get("CPATH", "")]),
    }
    build = WORK / "hami-build"
    shutil.rmtree(build, ignore_errors=True)
    log = [
        f"CUDA_HOME={home}; link with {chosen}; headers from {includes}",
        run(["sh", "-c", "ldconfig -p | grep -E 'libcuda\\.|libnvidia-ml'"]).stdout,
    ]
    lib = build / "libvgpu.so"
    how = None
    if driver is None and cmake_build(src, build, home, env, log):
        how = "cmake (build.sh's options, target vgpu)"
    elif gcc_build(src, build, includes, libs, env, log):
        how = f"gcc{'' if driver else ' fallback'} (build.sh's Debug flags)"
    (out / "hami-build.log").write_text("\n".join(log))
    REPORT.setdefault("hami", {})["build"] = how or "FAILED"
    if how is None:
        tail = [line for line in "\n".join(log).splitlines() if "rror" in line][:12]
        say("HAMi-core did not build; first error lines:\n    " + "\n    ".join(tail))
        return None
    needed = run(["sh", "-c", f"objdump -p {lib} | grep NEEDED"]).stdout.split()
    say(f"HAMi-core built by {how}: {lib} ({lib.stat().st_size} bytes; NEEDED {needed[1::2]})")
    return lib
