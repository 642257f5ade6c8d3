"""How well each isolation mode holds a tenant to its share of a real NVIDIA GPU (issue 28): measured, not
assumed.

Modes (``vgpu.names.IsolationMode``): **shared** (no compute limit: the device plugin's ``none`` backend),
**soft** (HAMi-core preloaded), **hard** (NVIDIA MPS: the benchmark starts its own control daemon with a
private pipe folder and EXCLUSIVE_PROCESS compute mode, and puts both back at the end, even on error),
**partitioned** (MIG: reported, not measured in this version). Every tenant is one process of
``tenant_load.cu`` whose environment comes from the device plugin's own Allocate answer
(:func:`benchmarks.isolation.tenants.tenant_env`). Measured in each mode:

- one tenant capped at 10, 25 and 50 %: its rate as a share of the same load uncapped, for a compute-bound
  FMA kernel, a memory-bound copy and a CUDA Graph replay (soft and hard: shared has no cap);
- two saturating tenants at 30/70 and 10/90: each one's share against its limit in points, and their
  total against one uncapped tenant (100 %: work-conserving);
- latency: the p99 of a small kernel stream beside a saturating neighbour, against the stream alone;
- memory: an allocation past the 4 GiB VRAM limit, refused or not;
- tampering: what a tenant gains by raising the limits in its own environment (soft and hard), beside what the
  plugin runs against it (hard: its MPS ceiling; soft: its guard, which puts the region back).

Asked for by name: ``burst`` (a pause), ``live`` (a limit lowered in a running process), ``pod`` (two processes
under one grant), ``switch`` (a 0 written into the HAMi-core region's limiter switch).

Run by hand on a machine with one NVIDIA GPU (H100/H200; root for the compute mode; nvcc; HAMi-core's
source for soft, as for benchmarks.gpu_check), or with ``--emulated`` on one without (shared and soft, the GPU
a model: ``benchmarks.isolation.emulated``), never in the tests; everything in ``--budget`` seconds
(default 480), planned first (``--dry-run`` prints the plan and touches no GPU)::

    scripts/isolation-bench [--out DIR] [--budget SECONDS] [--modes shared,soft,hard,partitioned]
                            [--hami-src .gpu/hami-core] [--dry-run]

Writes ``isolation.json``, ``isolation.md`` (one table per mode) and ``runs.log`` to ``--out``, and for soft
``hami-watcher.log``: HAMi-core's utilisation watcher at info level (what it measured and the share it set),
to read why its cap holds or not.
"""
