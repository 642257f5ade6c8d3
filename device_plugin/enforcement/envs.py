"""The Allocate answer for one container: environment and mounts, as a pure function of the grant.

Every container gets its granted GPUs (its own share of the pod's, where the pod asked for GPUs per
container: :meth:`~vgpu.contract.allocation.PodAllocation.gpus_of`) the way the node's toolkit reads them
(:class:`~vgpu.names.DeviceDelivery`: ``NVIDIA_VISIBLE_DEVICES`` with their UUIDs, ``/dev/null`` mounted under
:data:`~vgpu.names.NVIDIA_DEVICE_MOUNT_ROOT` per UUID, or NVIDIA's CDI device per UUID) and
TensorFusion-style per-UUID JSON limits; the node's enforcement backend adds its own knobs
(HAMi-core's limits and preload mounts, or NVIDIA MPS client limits and the pipe directory), and a
multi-GPU container's shared SM percent is the largest of its GPUs'. Where the node keeps live limits
(:mod:`device_plugin.enforcement.live_files`), the container also gets its own directory at
:data:`~vgpu.names.LIVE_LIMITS_DIR`. Kept pure so that every backend is a table test.
Why the largest percent, and the rest: docs/design-notes.md, section ``device_plugin/enforcement/envs.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from vgpu.contract.allocation import GpuGrant, PodAllocation
from vgpu.names import (
    HAMI_POLICY_FORCE,
    HAMI_REGION_FILE,
    LIVE_LIMITS_DIR,
    LIVE_LIMITS_FILE,
    NVIDIA_CDI_KIND,
    NVIDIA_DEVICE_MOUNT_ROOT,
    DeviceDelivery,
    EnforcementBackend,
    Env,
    IsolationMode,
)
from vgpu.quantity import MIB, humanize_tflops


@dataclass(frozen=True, slots=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class EnforcementPaths:
    """Host paths the backends mount; configurable per node (plugin flags)."""

    hami_library: str = "/usr/local/vgpu/libvgpu.so"
    hami_preload: str = "/usr/local/vgpu/ld.so.preload"
    mps_pipe_host: str = "/run/nvidia/mps/pipe"
    mps_pipe_container: str = "/run/nvidia/mps/pipe"
    mps_shm_host: str = "/run/nvidia/mps/shm"  # the MPS server's /dev/shm, which its clients share


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Who the answer is for; shown to the workload through TensorFusion's identity env vars."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    """The Allocate answer for one container. ``cdi_devices``: fully qualified names of CDI devices carrying
    the same envs and mounts, applied by the runtime after the container's own environment
    (:mod:`device_plugin.enforcement.cdi`); empty where CDI is off."""

    envs: Mapping[str, str]
    mounts: tuple[MountSpec, ...]
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LiveMount:
    """The host directory holding this container's live limits (prepared before the answer)."""

    host_dir: str


MPS_SHM_DIR = "/dev/shm"  # where an MPS client and its server share memory (docs/isolation-mps.md)


def hami_mib(vram_limit: int) -> int:
    """A VRAM limit in whole MiB as HAMi-core and MPS take it; 0 means "no limit" there, so at least 1."""
    return max(1, vram_limit // MIB)


def sm_percent(tflops_limit: int, gpu_tflops: int) -> int:
    """ceil(limit / capacity × 100) clamped to 1..100; an unknown capacity (0) means no cap."""
    if gpu_tflops <= 0:
        return 100
    return max(1, min(100, -(-tflops_limit * 100 // gpu_tflops)))


def granted_percents(alloc: PodAllocation) -> dict[str, int]:
    """Each granted GPU's compute cap in percent: its TFLOPS limit's share of the GPU, or 100 (uncapped, as
    HAMi-core and MPS read it) under isolation shared, where VRAM alone is limited (docs/isolation.md)."""
    uncapped = alloc.isolation is IsolationMode.SHARED
    return {g.uuid: 100 if uncapped else sm_percent(g.tflops_limit, g.gpu_tflops) for g in alloc.gpus}


def _per_uuid(gpus: tuple[GpuGrant, ...], value: Mapping[str, str]) -> str:
    """A JSON object keyed by UUID whose values are already-valid JSON number literals."""
    return "{" + ",".join(f"{json.dumps(g.uuid)}:{value[g.uuid]}" for g in gpus) + "}"


# What NVIDIA_VISIBLE_DEVICES says under each delivery: the device list itself, where the toolkit finds it
# (NVIDIA's device plugin sets the mount root in its volume-mounts mode), or "void" (no device by variable:
# NVIDIA's CDI spec sets it too, and it replaces any value the container brought).
def _visible(delivery: DeviceDelivery, gpus: tuple[GpuGrant, ...]) -> str:
    if delivery is DeviceDelivery.VOLUME_MOUNTS:
        return NVIDIA_DEVICE_MOUNT_ROOT
    if delivery is DeviceDelivery.CDI:
        return "void"
    return ",".join(g.uuid for g in gpus)


def _device_mounts(delivery: DeviceDelivery, gpus: tuple[GpuGrant, ...]) -> tuple[MountSpec, ...]:
    if delivery is not DeviceDelivery.VOLUME_MOUNTS:
        return ()
    return tuple(MountSpec(f"{NVIDIA_DEVICE_MOUNT_ROOT}/{g.uuid}", "/dev/null", True) for g in gpus)


def _nvidia_cdi(delivery: DeviceDelivery, gpus: tuple[GpuGrant, ...]) -> tuple[str, ...]:
    """NVIDIA's CDI devices for the granted GPUs (named by UUID) under CDI delivery; none otherwise."""
    if delivery is not DeviceDelivery.CDI:
        return ()
    return tuple(f"{NVIDIA_CDI_KIND}={g.uuid}" for g in gpus)


def build(
    alloc: PodAllocation,
    target: Target,
    backend: EnforcementBackend,
    paths: EnforcementPaths,
    live: LiveMount | None = None,
    delivery: DeviceDelivery = DeviceDelivery.ENVVAR,
) -> ContainerGrant:
    gpus = alloc.gpus_of(target.container)
    percent = granted_percents(alloc)
    envs: dict[str, str] = {
        Env.NVIDIA_VISIBLE_DEVICES: _visible(delivery, gpus),
        Env.TF_MEM_LIMIT: _per_uuid(gpus, {g.uuid: str(g.vram_limit) for g in gpus}),
        Env.TF_UP_LIMIT: _per_uuid(gpus, {u: str(p) for u, p in percent.items()}),
        Env.TF_UP_LIMIT_TFLOPS: _per_uuid(gpus, {g.uuid: humanize_tflops(g.tflops_limit) for g in gpus}),
        Env.TF_POD_NAME: target.pod,
        Env.TF_POD_NAMESPACE: target.namespace,
        Env.TF_CONTAINER_NAME: target.container,
        Env.TF_POOL_NAME: alloc.pool,
    }
    mounts = _device_mounts(delivery, gpus)
    widest = max((percent[g.uuid] for g in gpus), default=100)
    if backend is EnforcementBackend.HAMI_CORE:
        for i, g in enumerate(gpus):
            # HAMi reads 0 as "no limit", so a sub-MiB limit still caps at 1 MiB.
            envs[f"{Env.HAMI_MEMORY_LIMIT_PREFIX}{i}"] = f"{hami_mib(g.vram_limit)}m"
            envs[f"{Env.HAMI_SM_LIMIT}_{i}"] = str(percent[g.uuid])
        envs[Env.HAMI_SM_LIMIT] = str(widest)
        envs[Env.HAMI_UTILIZATION_POLICY] = HAMI_POLICY_FORCE
        mounts = (
            *mounts,
            MountSpec(paths.hami_library, paths.hami_library, True),
            MountSpec("/etc/ld.so.preload", paths.hami_preload, True),
        )
    elif backend is EnforcementBackend.MPS:
        envs[Env.MPS_PINNED_MEM_LIMIT] = ",".join(f"{i}={hami_mib(g.vram_limit)}M" for i, g in enumerate(gpus))
        envs[Env.MPS_ACTIVE_THREAD_PERCENTAGE] = str(widest)
        envs[Env.MPS_PIPE_DIRECTORY] = paths.mps_pipe_container
        mounts = (
            *mounts,
            MountSpec(paths.mps_pipe_container, paths.mps_pipe_host, False),
            MountSpec(MPS_SHM_DIR, paths.mps_shm_host, False),
        )
    if live is not None:
        envs[Env.TF_LIVE_LIMITS] = f"{LIVE_LIMITS_DIR}/{LIVE_LIMITS_FILE}"
        if backend is EnforcementBackend.HAMI_CORE:
            envs[Env.HAMI_SHARED_REGION] = f"{LIVE_LIMITS_DIR}/{HAMI_REGION_FILE}"
        # Read-write: HAMi-core maps its region there from inside the container.
        mounts = (*mounts, MountSpec(LIVE_LIMITS_DIR, live.host_dir, False))
    return ContainerGrant(
        envs={str(k): v for k, v in envs.items()}, mounts=mounts, cdi_devices=_nvidia_cdi(delivery, gpus)
    )
