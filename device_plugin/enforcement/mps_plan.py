"""What the device plugin does with NVIDIA's MPS control daemon under ``--backend=mps``, as plain decisions.

MPS enforces nothing unless its control daemon runs: a client whose ``CUDA_MPS_PIPE_DIRECTORY`` leads to no
daemon runs on the GPU directly, without its limits. So the plugin runs one daemon for the whole GPUs it
serves (a GPU in MIG mode and its instances are left out). This module decides, without processes, files or
clocks, so that each decision is a table test: which GPUs are served, the daemon's environment and command
lines, the defaults sent through its control pipe after each start, the ceiling that follows the node's grants
(:func:`ceiling`), what a compute mode that cannot be set means, the restart backoff, and each GPU's health
problem. :mod:`device_plugin.enforcement.mps_daemon` runs
it. What a tenant can and cannot gain under MPS: docs/isolation-mps.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from device_plugin.enforcement.envs import granted_percents, hami_mib
from device_plugin.gpus.probe import ComputeMode
from vgpu.contract.allocation import PodAllocation
from vgpu.contract.inventory import GpuInfo
from vgpu.names import Env
from vgpu.quantity import MIB

# Names NVIDIA's tools read or write (docs.nvidia.com/deploy/mps, "Appendix: Tools and Interface Reference").
PID_FILE: Final = "nvidia-cuda-mps-control.pid"  # written by the control daemon in its pipe directory
VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"  # the GPUs the daemon's servers may use, by UUID
LOG_DIRECTORY: Final = "CUDA_MPS_LOG_DIRECTORY"  # where the daemon writes control.log and server.log
QUIT: Final = "quit"
SERVER_LIST: Final = "get_server_list"  # the running servers' PIDs, one a line
# NVIDIA's own default: a client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE only lowers what the daemon allows.
DEFAULT_THREAD_PERCENTAGE: Final = 100
BACKOFF_CAP_S: Final = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MpsConfig:
    """The plugin's MPS settings: the control binary and the directories it shares with clients."""

    control: str
    pipe_dir: str
    log_dir: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MpsPlan:
    """One daemon for ``gpus`` (UUIDs, in the order its servers number them): ``start`` runs it, ``command``
    (commands on its standard input) talks to it, ``defaults`` are sent after each start, both with ``env``."""

    gpus: tuple[str, ...]
    memory_mib: tuple[int, ...]  # each GPU's whole memory, in the order of ``gpus``
    env: Mapping[str, str]
    start: tuple[str, ...]
    command: tuple[str, ...]
    pipe_dir: str
    log_dir: str

    @property
    def defaults(self) -> tuple[str, ...]:
        """The control commands sent after each start, until the :func:`ceiling` of the node's grants replaces
        them (at once where the plugin knows its pods): NVIDIA's own ceiling, every SM and each GPU's whole
        memory. Devices are numbered as the daemon's servers see them: their place in ``CUDA_VISIBLE_DEVICES``."""
        return ceiling_commands(Ceiling(DEFAULT_THREAD_PERCENTAGE, self.memory_mib), ())

    @property
    def pid_file(self) -> str:
        return f"{self.pipe_dir}/{PID_FILE}"


def served(gpus: Iterable[GpuInfo]) -> tuple[GpuInfo, ...]:
    """The GPUs the daemon serves: whole GPUs not in MIG mode (MPS on MIG instances is left out)."""
    return tuple(g for g in gpus if not g.mig and g.parent is None)


def plan(gpus: Iterable[GpuInfo], config: MpsConfig) -> MpsPlan:
    """The daemon for the served ones of ``gpus``."""
    mine = served(gpus)
    env = {
        VISIBLE_DEVICES: ",".join(g.uuid for g in mine),
        str(Env.MPS_PIPE_DIRECTORY): config.pipe_dir,
        LOG_DIRECTORY: config.log_dir,
    }
    return MpsPlan(
        gpus=tuple(g.uuid for g in mine),
        memory_mib=tuple(g.vram // MIB for g in mine),
        env=env,
        start=(config.control, "-d"),
        command=(config.control,),
        pipe_dir=config.pipe_dir,
        log_dir=config.log_dir,
    )


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The most any client of the daemon may set for itself: a client's own variables only lower it. The
    compute cap is one setting per server, so it is the widest cap granted on the node; the memory limit is
    per device (the daemon's numbering), the largest VRAM limit granted on that GPU, in MiB (a GPU without a
    grant keeps its whole memory: no container is given its device)."""

    percent: int
    mib: tuple[int, ...]


def ceiling(plan: MpsPlan, grants: Iterable[PodAllocation]) -> Ceiling | None:
    """The ceiling for ``grants`` (the node's hard grants) on the daemon's GPUs; None when none of them is
    on one (nothing to hold: the ceiling in force stays until a grant comes)."""
    index = {uuid: i for i, uuid in enumerate(plan.gpus)}
    percent, mib = 0, [0] * len(plan.gpus)
    for alloc in grants:
        caps = granted_percents(alloc)
        for g in alloc.gpus:
            i = index.get(g.uuid)
            if i is not None:
                percent = max(percent, caps[g.uuid])
                mib[i] = max(mib[i], hami_mib(g.vram_limit))
    if percent == 0:
        return None
    return Ceiling(percent, tuple(m or whole for m, whole in zip(mib, plan.memory_mib, strict=True)))


def ceiling_commands(held: Ceiling, servers: Sequence[int]) -> tuple[str, ...]:
    """The control commands that put ``held`` in force: as the default for servers started later, and on
    each running server (``servers``: their PIDs), for the clients that connect to it from now on."""
    mem = [(i, f"{m}M") for i, m in enumerate(held.mib)]
    out = [
        f"set_default_active_thread_percentage {held.percent}",
        *(f"set_default_device_pinned_mem_limit {i} {m}" for i, m in mem),
    ]
    for pid in servers:
        out += [
            f"set_active_thread_percentage {pid} {held.percent}",
            *(f"set_device_pinned_mem_limit {pid} {i} {m}" for i, m in mem),
        ]
    return tuple(out)


def server_pids(listing: str) -> tuple[int, ...]:
    """The PIDs ``get_server_list`` printed (anything else on its output is ignored)."""
    return tuple(int(word) for word in listing.split() if word.isdecimal())


@dataclass(frozen=True, slots=True)
class ModeVerdict:
    """What a GPU's compute mode means for it: a health ``problem`` (None: fine) and a ``warning`` to log."""

    problem: str | None = None
    warning: str | None = None


def compute_mode_verdict(error: str | None, now: ComputeMode | None) -> ModeVerdict:
    """After setting ``EXCLUSIVE_PROCESS``: ``error`` is why the driver refused (None: it did not), ``now``
    the mode read back (None: unreadable). A refusal is only a warning where the mode is already right;
    otherwise a process could hold the GPU without MPS, beyond any limit, so the GPU is unhealthy."""
    if error is None:
        return ModeVerdict()
    if now is ComputeMode.EXCLUSIVE_PROCESS:
        return ModeVerdict(warning=f"setting compute mode Exclusive_Process failed ({error}); it already is")
    mode = "unreadable" if now is None else now.value
    return ModeVerdict(
        problem=f"compute mode cannot be set to Exclusive_Process for MPS ({error}); it is {mode}, so a process "
        "could use the GPU without MPS's limits"
    )


def backoff(failures: int, first_s: float, cap_s: float = BACKOFF_CAP_S) -> float:
    """Seconds before the next start after ``failures`` (≥ 1) failed starts or deaths in a row: doubling."""
    return min(cap_s, first_s * 2.0 ** max(0, failures - 1))


def problems(gpus: Iterable[str], daemon: str | None, modes: Mapping[str, str | None]) -> dict[str, str | None]:
    """Each served GPU's health problem: its compute mode's, else the daemon's (None: healthy)."""
    return {u: modes.get(u) or daemon for u in gpus}
