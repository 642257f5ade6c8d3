"""A tenant's environment in each isolation mode, from the device plugin's own Allocate answer.

:func:`tenant_env` is the one place a tenant's variables come from: a synthetic grant (its TFLOPS limit
the target percent of the GPU's catalog TFLOPS, its VRAM limit) through
:func:`device_plugin.enforcement.envs.build` with the mode's backend, seen from the host as the container
would see it: the values that name a path the plugin mounts point where the benchmark put that path, the
preload list the plugin mounts at ``/etc/ld.so.preload`` becomes ``LD_PRELOAD``, and the GPUs in
``NVIDIA_VISIBLE_DEVICES`` (read by the container runtime) become ``CUDA_VISIBLE_DEVICES``. So when the
plugin's answer changes, the tenants follow. :func:`tampered` is what a tenant gets by raising the limits in
its own environment; :func:`plugin_ceiling` is what the plugin's MPS daemon then holds every client to. The
GPU's facts come from ``nvidia-smi -q -x`` (:func:`gpu_facts`).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu_check import smi
from benchmarks.gpu_check.grant import one_gpu_allocation
from device_plugin.enforcement.envs import ContainerGrant, EnforcementPaths, LiveMount, Target, build
from device_plugin.enforcement.mps_plan import Ceiling, MpsConfig, ceiling, plan
from vgpu.catalog import builtin
from vgpu.contract.inventory import GpuInfo
from vgpu.names import EnforcementBackend, Env, IsolationMode
from vgpu.quantity import MIB

BACKENDS = {
    IsolationMode.SHARED: EnforcementBackend.NONE,
    IsolationMode.SOFT: EnforcementBackend.HAMI_CORE,
    IsolationMode.HARD: EnforcementBackend.MPS,
    IsolationMode.PARTITIONED: EnforcementBackend.NONE,  # the partition is the limit
}
PRELOAD_LIST = "/etc/ld.so.preload"  # where envs.build mounts HAMi-core's preload list in the container
# What the container runtime's NVIDIA_VISIBLE_DEVICES amounts to outside a container. HAMi-core reads it as
# device indexes (atoi: 0 for a UUID), right for the GPU measured here, index 0.
VISIBLE = "CUDA_VISIBLE_DEVICES"
UNKNOWN_TFLOPS = 1_000_000  # milli: a GPU the catalog lacks; only the percent of it matters here


@dataclass(frozen=True, slots=True)
class Gpu:
    """The GPU measured: as nvidia-smi names it, and its catalog TFLOPS (milli) the grants are shares of."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    mig: str
    compute_mode: str
    driver: str
    cuda: str
    tflops: int
    in_catalog: bool


def gpu_facts(root: ET.Element, index: int = 0) -> Gpu:
    """The ``index``-th GPU of ``nvidia-smi -q -x``'s document, with the driver and CUDA versions."""
    gpus = root.findall("gpu")
    if len(gpus) <= index:
        raise RuntimeError(f"nvidia-smi lists {len(gpus)} GPUs; GPU {index} is not there")
    gpu = gpus[index]
    name = (gpu.findtext("product_name") or "").strip()
    model = builtin().lookup(name)
    return Gpu(
        index=index,
        uuid=(gpu.findtext("uuid") or "").strip(),
        name=name,
        memory_mib=smi.memory_mib(gpu),
        mig=smi.mig_mode(gpu),
        compute_mode=(gpu.findtext("compute_mode") or "Default").strip(),
        driver=(root.findtext("driver_version") or "?").strip(),
        cuda=(root.findtext("cuda_version") or "?").strip(),
        tflops=model.tflops_milli if model is not None else UNKNOWN_TFLOPS,
        in_catalog=model is not None,
    )


def host_view(grant: ContainerGrant) -> dict[str, str]:
    """``grant``'s environment as its container would live it, for a process on the host."""
    mounts = sorted(grant.mounts, key=lambda m: len(m.container_path), reverse=True)
    envs: dict[str, str] = {}
    for key, value in grant.envs.items():
        mount = next((m for m in mounts if value == m.container_path or value.startswith(m.container_path + "/")), None)
        envs[key] = value if mount is None else mount.host_path + value[len(mount.container_path) :]
    preload = next((m for m in mounts if m.container_path == PRELOAD_LIST), None)
    if preload is not None:
        envs["LD_PRELOAD"] = ":".join(Path(preload.host_path).read_text().split())
    envs[VISIBLE] = envs[Env.NVIDIA_VISIBLE_DEVICES]
    return envs


def tenant_env(
    mode: IsolationMode,
    gpu: Gpu,
    *,
    percent: int | None,
    vram_limit: int,
    paths: EnforcementPaths,
    live_dir: Path,
    name: str = "tenant",
) -> dict[str, str]:
    """The variables of a tenant granted ``percent`` of the GPU (None: all of it) and ``vram_limit`` bytes
    in ``mode``, with its own live-limits directory ``live_dir`` (HAMi-core's region goes there)."""
    limit = gpu.tflops if percent is None else gpu.tflops * percent // 100
    grant = build(
        one_gpu_allocation(gpu.uuid, gpu.tflops, limit, vram_limit, node="isolation-bench"),
        Target(namespace="isolation-bench", pod=name, container="main"),
        BACKENDS[mode],
        paths,
        LiveMount(host_dir=str(live_dir)),
    )
    return host_view(grant)


def plugin_ceiling(gpu: Gpu, percent: int, vram_limit: int) -> Ceiling:
    """The ceiling the device plugin's MPS daemon holds (:func:`device_plugin.enforcement.mps_plan.ceiling`)
    when the only grant on the GPU is ``percent`` of it and ``vram_limit`` bytes."""
    info = GpuInfo(uuid=gpu.uuid, index=gpu.index, model=gpu.name, tflops=gpu.tflops, vram=gpu.memory_mib * MIB)
    daemon = plan([info], MpsConfig(control="nvidia-cuda-mps-control", pipe_dir="", log_dir=""))
    grant = one_gpu_allocation(gpu.uuid, gpu.tflops, gpu.tflops * percent // 100, vram_limit, node="isolation-bench")
    held = ceiling(daemon, [grant])
    assert held is not None  # the grant is on the daemon's GPU
    return held


def tampered(envs: dict[str, str], gpu: Gpu) -> tuple[dict[str, str], dict[str, str]]:
    """``envs`` with every compute limit raised to 100 % and every memory limit to the whole GPU, as a
    tenant could set them before starting its processes; and the variables changed (none in a mode whose
    limits are not in the environment)."""
    whole = gpu.memory_mib or max(1, 2**40 // MIB)
    sm = str(Env.HAMI_SM_LIMIT)
    raised: dict[str, str] = {}
    for key, value in envs.items():
        if key == sm or key.startswith(f"{sm}_") or key == Env.MPS_ACTIVE_THREAD_PERCENTAGE:
            raised[key] = "100"
        elif key.startswith(Env.HAMI_MEMORY_LIMIT_PREFIX):
            raised[key] = f"{whole}m"
        elif key == Env.MPS_PINNED_MEM_LIMIT:
            raised[key] = ",".join(f"{part.split('=')[0]}={whole}M" for part in value.split(","))
    return {**envs, **raised}, {k: v for k, v in raised.items() if envs[k] != v}
