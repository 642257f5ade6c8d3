"""What the driver counts of one tenant, read as the device plugin's guards read it: its GPU memory, and its
share of the SMs.

The VRAM guard (device_plugin/enforcement/vram_guard.py) judges a container by NVML's per-process memory,
which includes what the limiter inside the container does not see; its tolerance is how much that may be. The
compute report (device_plugin/enforcement/compute_guard.py) judges a pod by NVML's per-process SM share, the
figure HAMi-core's own limiter steers by; its margin is how far an honest tenant may stray from its cap. The
benchmark measures both: a tenant held at its limit (or running at its cap), and the plugin's own probe
(:class:`~device_plugin.gpus.nvml_backend.NvmlProbe`) asked about it from a child with the tenants'
environment, so that on the emulated GPU its fake NVML is the library loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from benchmarks.gpu_check.constants import MIB

# argv: the GPU's UUID, then "memory", or "sm" and the seconds its utilisation samples are taken over.
QUERY = """
import json, sys, time
from device_plugin.gpus.nvml_backend import NvmlProbe
probe = NvmlProbe()
try:
    uuid, what = sys.argv[1], sys.argv[2]
    if what == "memory":
        print(json.dumps({p.pid: p.memory_used for p in probe.processes(uuid, 0).processes}))
    else:
        since = probe.processes(uuid, 0).until_us
        time.sleep(float(sys.argv[3]))
        print(json.dumps({p.pid: p.sm_percent for p in probe.processes(uuid, since).processes}))
finally:
    probe.close()
"""


def _listed(uuid: str, env: dict[str, str], *args: str) -> dict[int, int] | str:
    """What the probe lists of GPU ``uuid`` by PID, or why it listed nothing."""
    said = subprocess.run(
        [sys.executable, "-c", QUERY, uuid, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if said.returncode != 0:
        return f"NVML not read: {said.stderr.strip().splitlines()[-1:]}"
    return {int(k): int(v) for k, v in json.loads(said.stdout).items()}


def _match(seen: dict[int, int] | str, pid: int) -> tuple[int | None, str]:
    """Process ``pid``'s figure, and how it was matched: by its PID, or as the only process listed (NVML names
    host PIDs, which another PID namespace does not see), else why not."""
    if isinstance(seen, str):
        return None, seen
    if pid in seen:
        return seen[pid], "pid"
    if len(seen) == 1:
        return next(iter(seen.values())), "the only process listed"
    return None, f"PID {pid} not among those listed ({sorted(seen)})"


def counted(uuid: str, pid: int, env: dict[str, str]) -> dict[str, Any]:
    """``driver_mib``: the driver's count of process ``pid``'s memory on GPU ``uuid`` (None: not read), and how
    it was matched (``matched``)."""
    value, matched = _match(_listed(uuid, env, "memory"), pid)
    return {"driver_mib": None if value is None else value // MIB, "matched": matched}


def sm_share(uuid: str, pid: int, env: dict[str, str], seconds: float) -> dict[str, Any]:
    """``driver_sm``: the driver's SM share of process ``pid`` on GPU ``uuid`` in percent, over the next
    ``seconds`` (None: not read), and how it was matched (``matched``)."""
    value, matched = _match(_listed(uuid, env, "sm", f"{seconds:g}"), pid)
    return {"driver_sm": value, "matched": matched}
