"""PyTorch workloads for scripts/gpu-check (benchmarks.gpu_check runs this file as a script with the
interpreter running the check); each prints one JSON object per line on stdout.

    load.py sample --gib 6 --full 12 --duty 12   hold GIB of device memory; a bf16 matmul loop at full tilt
                                                 for FULL seconds, then at about half duty for DUTY seconds
    load.py mem --held-mib 3072 --extra-mib 2048 allocate HELD, then EXTRA while holding it (an OOM expected
                                                 under a HAMi-core limit between the two)
    load.py matmul --seconds 10                  back-to-back bf16 matmuls: TFLOP/s per second and overall

Imports only torch, so it runs with or without HAMi-core preloaded, apart from the project's code. torch
is not one of the project's dependencies, so it is imported untyped (mypy passes without it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from typing import Any

torch: Any = importlib.import_module("torch")

N = 8192  # an 8192³ bf16 matmul: about 1.1 TFLOP, a millisecond and a half on an H100
FLOP = 2 * N**3


def emit(**fields: object) -> None:
    sys.stdout.write(json.dumps({"t": round(time.time(), 3), **fields}) + "\n")
    sys.stdout.flush()


def matrices() -> tuple[Any, Any]:
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    return a, torch.randn(N, N, device="cuda", dtype=torch.bfloat16)


def timed_batch(a: Any, b: Any, count: int) -> float:
    """GPU seconds of ``count`` matmuls, measured with events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        torch.mm(a, b)
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1000.0


def sample(gib: float, full_s: float, duty_s: float) -> None:
    held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    held.fill_(1)
    a, b = matrices()
    timed_batch(a, b, 5)  # warm-up: cuBLAS handle and workspace
    emit(
        phase="ready",
        pid=os.getpid(),
        held_bytes=held.numel(),
        memory_allocated=torch.cuda.memory_allocated(),
        memory_reserved=torch.cuda.memory_reserved(),
    )
    for name, seconds, pause in (("full", full_s, 0.0), ("duty", duty_s, 1.0)):
        started = time.time()
        busy = 0.0
        emit(phase=f"{name}_start")
        while time.time() - started < seconds:
            spent = timed_batch(a, b, 30)  # ~45 ms of work
            busy += spent
            if pause:
                time.sleep(spent * pause)  # as long idle as busy: about half duty
        wall = time.time() - started
        emit(
            phase=f"{name}_end",
            wall_s=round(wall, 3),
            gpu_busy_s=round(busy, 3),
            busy_percent=round(100 * busy / wall, 1),
        )
    emit(phase="done", memory_reserved=torch.cuda.memory_reserved())


def mem(held_mib: int, extra_mib: int) -> None:
    free, total = torch.cuda.mem_get_info()
    emit(step="mem_get_info", free_mib=free >> 20, total_mib=total >> 20)
    kept = []
    for step, mib in (("held", held_mib), ("extra_while_held", extra_mib)):
        try:
            kept.append(torch.empty(mib << 20, dtype=torch.uint8, device="cuda"))
            emit(step=step, mib=mib, ok=True, reserved_mib=torch.cuda.memory_reserved() >> 20)
        except RuntimeError as exc:  # torch.OutOfMemoryError expected; anything else is shown as it is
            emit(step=step, mib=mib, ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")


def matmul(seconds: float) -> None:
    a, b = matrices()
    timed_batch(a, b, 5)
    started = mark = time.time()
    done = in_second = 0
    while True:
        torch.mm(a, b)
        torch.cuda.synchronize()
        done += 1
        in_second += 1
        now = time.time()
        if now - mark >= 1.0:
            emit(step="second", tflops=round(in_second * FLOP / (now - mark) / 1e12, 1))
            mark, in_second = now, 0
        if now - started >= seconds:
            break
    wall = time.time() - started
    emit(step="matmul", ok=True, matmuls=done, seconds=round(wall, 3), tflops=round(done * FLOP / wall / 1e12, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--gib", type=float, default=6.0)
    s.add_argument("--full", type=float, default=12.0)
    s.add_argument("--duty", type=float, default=12.0)
    m = sub.add_parser("mem")
    m.add_argument("--held-mib", type=int, default=3072)
    m.add_argument("--extra-mib", type=int, default=2048)
    t = sub.add_parser("matmul")
    t.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    if args.mode == "sample":
        sample(args.gib, args.full, args.duty)
    elif args.mode == "mem":
        mem(args.held_mib, args.extra_mib)
    else:
        matmul(args.seconds)


if __name__ == "__main__":
    main()
