"""What the isolation benchmark needs on the machine, checked first and said plainly: each need, whether it
is there, and the modes that cannot run without it. A missing need skips only those modes.

Programs are looked up on PATH and the GPU asked through nvidia-smi (the lookup, the runner and the user
id are parameters, so that the tests check it with fake commands)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu_check.hami_build import cuda_home, include_dirs
from benchmarks.gpu_check.procs import run as run_command
from benchmarks.isolation.plan import EMULATED_ORDER
from device_plugin.hami_build.changes import check_source
from vgpu.names import IsolationMode

Which = Callable[[str], str | None]
Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]
WHOLE_GPU = frozenset({IsolationMode.SHARED, IsolationMode.SOFT, IsolationMode.HARD})
ALL = frozenset(IsolationMode)
EMULATED = frozenset(EMULATED_ORDER)


@dataclass(frozen=True, slots=True)
class Need:
    """One prerequisite: what, whether it is there, what was found (or what to do), who needs it."""

    what: str
    ok: bool
    detail: str
    modes: frozenset[IsolationMode]

    def line(self) -> str:
        who = ", ".join(m for m in IsolationMode if m in self.modes)
        return f"{'ok     ' if self.ok else 'MISSING'}  {self.what}: {self.detail} (needed by: {who})"


def on_path(which: Which, program: str, modes: frozenset[IsolationMode], why: str) -> Need:
    found = which(program)
    return Need(f"{program} ({why})", found is not None, found or "not on PATH", modes)


def gpu_needs(which: Which, run: Runner) -> list[Need]:
    """nvidia-smi, a GPU answering it, its MIG mode (enabled: the whole GPU is not reachable; this version
    measures no MIG instance, so partitioned is never run) and its compute mode (an exclusive one, left by
    an interrupted run, would refuse a second tenant)."""
    smi = on_path(which, "nvidia-smi", ALL, "the GPU's facts, the compute mode")
    if not smi.ok:
        return [smi]
    listed = run(["nvidia-smi", "--query-gpu=name,mig.mode.current,compute_mode", "--format=csv,noheader"])
    rows = [line.split(", ") for line in listed.stdout.strip().splitlines() if line.strip()]
    answers = Need(
        "a GPU answering nvidia-smi",
        listed.returncode == 0 and bool(rows),
        rows[0][0] if listed.returncode == 0 and rows else f"rc {listed.returncode}: {listed.stderr.strip()[:300]}",
        ALL,
    )
    if not answers.ok:
        return [smi, answers]
    mig, mode = (rows[0] + ["?", "?"])[1:3]
    enabled = mig == "Enabled"
    return [
        smi,
        answers,
        Need("MIG disabled (the whole GPU reachable)", not enabled, f"MIG mode {mig}", WHOLE_GPU),
        Need(
            "compute mode Default (tenants side by side)",
            mode == "Default",
            "Default" if mode == "Default" else f"{mode}: put it back with nvidia-smi -i 0 -c DEFAULT",
            WHOLE_GPU,
        ),
        Need(
            "MIG instances to measure",
            False,
            "MIG is enabled, but this version measures no MIG instance"
            if enabled
            else f"MIG mode {mig}: enabling it needs a GPU reset, which this benchmark never does",
            frozenset({IsolationMode.PARTITIONED}),
        ),
    ]


def check(
    modes: Sequence[IsolationMode],
    hami_src: Path,
    changes: Sequence[str] = (),
    *,
    which: Which = shutil.which,
    run: Runner = run_command,
    euid: Callable[[], int] = os.geteuid,
    emulated: bool = False,
    headers: Callable[[], list[Path]] = lambda: include_dirs(cuda_home()),
) -> list[Need]:
    """Every need of ``modes``, in the order said; on the emulated GPU (``emulated``), its builds' instead of
    the GPU's and nvcc."""
    if emulated:
        needs = [
            on_path(which, "gcc", EMULATED, "builds the emulated GPU's driver, fake_gpu.c"),
            on_path(which, "g++", EMULATED, "builds the tenant load's host code, tenant_load.cu"),
        ]
        if IsolationMode.SOFT in modes:
            found = {h for d in headers() for h in ("cuda.h", "nvml.h") if (d / h).exists()}
            needs.append(
                Need(
                    "cuda.h and nvml.h (HAMi-core's build)",
                    len(found) == 2,
                    "found"
                    if len(found) == 2
                    else "pip install -e '.[dev]' (nvidia-cuda-runtime-cu12, nvidia-nvml-dev-cu12)",
                    frozenset({IsolationMode.SOFT}),
                )
            )
    else:
        needs = gpu_needs(which, run)
        needs.append(on_path(which, "nvcc", WHOLE_GPU, "builds the tenant load, tenant_load.cu"))
    if IsolationMode.SOFT in modes:
        soft = frozenset({IsolationMode.SOFT})
        source = hami_src / "src" / "libvgpu.c"
        needs.append(
            Need(
                "HAMi-core source",
                source.exists(),
                str(hami_src) if source.exists() else f"no {source}: export it there (benchmarks/gpu_check docstring)",
                soft,
            )
        )
        if changes and source.exists():
            why = check_source(hami_src, changes)
            named = ", ".join(changes)
            needs.append(Need(f"HAMi-core changes (--hami-change {named})", why is None, why or "they apply", soft))
        builders = [p for p in ("cmake", "gcc") if which(p)]
        needs.append(Need("cmake or gcc (builds HAMi-core)", bool(builders), ", ".join(builders) or "neither", soft))
    if IsolationMode.HARD in modes:
        hard = frozenset({IsolationMode.HARD})
        needs.append(on_path(which, "nvidia-cuda-mps-control", hard, "the MPS control daemon"))
        root = euid() == 0
        needs.append(Need("root (sets the compute mode)", root, "uid 0" if root else f"uid {euid()}", hard))
    return [n for n in needs if n.modes & set(modes)]


def blocked(needs: Sequence[Need], mode: IsolationMode) -> list[str]:
    """Why ``mode`` cannot run: each missing need of it, with its detail."""
    return [f"{n.what}: {n.detail}" for n in needs if not n.ok and mode in n.modes]
