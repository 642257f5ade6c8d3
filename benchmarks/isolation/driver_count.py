"""What the driver counts of one tenant's GPU memory, read as the device plugin's VRAM guard reads it.

The guard (device_plugin/enforcement/vram_guard.py) judges a container by NVML's per-process memory, which
includes what the limiter inside the container does not see; its tolerance is how much that may be. The
benchmark measures it: a tenant held at its limit, and the plugin's own probe
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

QUERY = """
import json, sys
from device_plugin.gpus.nvml_backend import NvmlProbe
probe = NvmlProbe()
try:
    print(json.dumps({p.pid: p.memory_used for p in probe.processes(sys.argv[1], 0).processes}))
finally:
    probe.close()
"""


def counted(uuid: str, pid: int, env: dict[str, str]) -> dict[str, Any]:
    """``driver_mib``: the driver's count of process ``pid`` on GPU ``uuid`` (None: not read), and how it was
    matched (``matched``): by its PID, or as the only process listed (NVML names host PIDs, which another PID
    namespace does not see), else why not."""
    said = subprocess.run(
        [sys.executable, "-c", QUERY, uuid],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if said.returncode != 0:
        return {"driver_mib": None, "matched": f"NVML not read: {said.stderr.strip().splitlines()[-1:]}"}
    seen = {int(k): int(v) for k, v in json.loads(said.stdout).items()}
    if pid in seen:
        return {"driver_mib": seen[pid] // MIB, "matched": "pid"}
    if len(seen) == 1:
        return {"driver_mib": next(iter(seen.values())) // MIB, "matched": "the only process listed"}
    return {"driver_mib": None, "matched": f"PID {pid} not among those listed ({sorted(seen)})"}
