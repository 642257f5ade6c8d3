"""HAMi-core's ``shared_region_t``, mirrored with ctypes from its header, to build region files in tests.

Transcribed field by field from src/multiprocess/multiprocess_memory_limit.h at HAMi-core commit
8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811 (layout version 1.2), independently of the plugin's offsets
(device_plugin/enforcement/hami_region.py), so a test comparing the two catches either being wrong. ctypes lays
structures out by the platform's C rules, as the compiler does for the real library.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

CUDA_DEVICE_MAX_COUNT = 16
SHARED_REGION_MAX_PROCESS_NUM = 1024
MULTIPROCESS_SHARED_REGION_MAGIC_FLAG = 19920718


class SemT(ctypes.Union):
    """glibc's 64-bit sem_t: ``union { char __size[32]; long int __align; }``."""

    _fields_ = [("size", ctypes.c_char * 32), ("align", ctypes.c_long)]


class DeviceMemory(ctypes.Structure):
    _fields_ = [
        ("context_size", ctypes.c_uint64),
        ("module_size", ctypes.c_uint64),
        ("data_size", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("total", ctypes.c_uint64),
        ("unused", ctypes.c_uint64 * 3),
    ]


class DeviceUtil(ctypes.Structure):
    _fields_ = [
        ("dec_util", ctypes.c_uint64),
        ("enc_util", ctypes.c_uint64),
        ("sm_util", ctypes.c_uint64),
        ("unused", ctypes.c_uint64 * 3),
    ]


class ProcSlot(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_int32),
        ("hostpid", ctypes.c_int32),
        ("used", DeviceMemory * CUDA_DEVICE_MAX_COUNT),
        ("monitorused", ctypes.c_uint64 * CUDA_DEVICE_MAX_COUNT),
        ("device_util", DeviceUtil * CUDA_DEVICE_MAX_COUNT),
        ("status", ctypes.c_int32),
        ("seqlock", ctypes.c_uint64),
        ("unused", ctypes.c_uint64 * 2),
    ]


class SharedRegion(ctypes.Structure):
    _fields_ = [
        ("initialized_flag", ctypes.c_int32),
        ("major_version", ctypes.c_uint32),
        ("minor_version", ctypes.c_uint32),
        ("sm_init_flag", ctypes.c_int32),
        ("owner_pid", ctypes.c_size_t),
        ("sem", SemT),
        ("device_num", ctypes.c_uint64),
        ("uuids", (ctypes.c_char * 96) * CUDA_DEVICE_MAX_COUNT),
        ("limit", ctypes.c_uint64 * CUDA_DEVICE_MAX_COUNT),
        ("sm_limit", ctypes.c_uint64 * CUDA_DEVICE_MAX_COUNT),
        ("procs", ProcSlot * SHARED_REGION_MAX_PROCESS_NUM),
        ("proc_num", ctypes.c_int),
        ("utilization_switch", ctypes.c_int),
        ("recent_kernel", ctypes.c_int),
        ("priority", ctypes.c_int),
        ("last_kernel_time", ctypes.c_uint64),
        ("sem_postinit", SemT),
    ]


def noisy_region() -> SharedRegion:
    """A region whose every byte is set (a pattern), so a stray write anywhere shows."""
    raw = bytes((i * 7 + 3) % 251 for i in range(ctypes.sizeof(SharedRegion)))
    return SharedRegion.from_buffer_copy(raw)


def initialised(limits: list[tuple[int, int]], *, major: int = 1, minor: int = 2) -> SharedRegion:
    """As HAMi-core's first process leaves it: magic, version, ``limit[i]``/``sm_limit[i]`` from the environment."""
    region = noisy_region()
    region.initialized_flag = MULTIPROCESS_SHARED_REGION_MAGIC_FLAG
    region.major_version, region.minor_version = major, minor
    for i, (limit, sm) in enumerate(limits):
        region.limit[i], region.sm_limit[i] = limit, sm
    return region


def write_region(path: Path, region: SharedRegion) -> bytes:
    """The file as HAMi-core makes it (the struct, then the one byte it writes past it); returns its bytes."""
    data = bytes(region) + b"\0"
    path.write_bytes(data)
    return data
