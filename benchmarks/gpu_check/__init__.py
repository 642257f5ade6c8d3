"""Verify on a real NVIDIA GPU what the tests cannot: the NVML probe, per-process sampling, HAMi-core's limits.

The test suite runs without a GPU (a fake probe stands in for NVML), so this check, run by hand on a GPU
machine and never in the tests, is what shows that the device plugin's NVML side and the limits it hands
containers hold on a real driver. Each section goes through the project's own code:

1. Probe: ``python -m device_plugin.main --probe`` (and ``tf-device-plugin --probe`` where it is on PATH),
   and :class:`device_plugin.gpus.nvml_backend.NvmlProbe` with :func:`device_plugin.gpus.board.discover`,
   compared field by field with ``nvidia-smi -q``.
2. Sampling: a PyTorch load (``load.py`` here: memory held, a matmul loop at full and at about half duty)
   sampled by ``NvmlProbe.processes`` and a real :class:`device_plugin.usage.sampler.UsageSampler` pass,
   against what the load reports; and what a sampling call and pass cost on the real driver.
3. Limits: HAMi-core (its source exported beforehand into ``--hami-src``, default ``.gpu/hami-core``, an
   ignored folder) built as its ``build.sh`` builds it and preloaded into ``hami_check.cu`` and the PyTorch
   load with the environment :func:`device_plugin.enforcement.envs.build` gives a container (4 GiB VRAM,
   20 % TFLOPS): the memory limit, throughput under the SM limit (logged at LIBCUDA_LOG_LEVEL=3), and a
   live limit change through :mod:`device_plugin.enforcement.hami_region` on HAMi-core's real region.

Needs torch, the project's dependencies and the project installed (``pip install -e .``: the plugin reads
its distribution metadata); nvidia-smi, nvcc, cmake (gcc as a fallback). Writes ``report.md``,
``report.json`` and the raw logs to ``--out``; builds go to /tmp/gpu-check. Exit status 1 when a section
failed to run (not when a figure is poor: the figures are for a person to read).

    scripts/gpu-check [--out DIR] [--hami-src .gpu/hami-core] [--skip-hami] [--budget SECONDS]

HAMi-core's source, once, into the ignored folder (``/.gpu/`` in .git/info/exclude)::

    mkdir -p .gpu/hami-core && git -C HAMI_CORE_CLONE archive HEAD | tar -x -C .gpu/hami-core
"""
