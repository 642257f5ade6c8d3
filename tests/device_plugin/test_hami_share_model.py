"""share_model.c, compiled alone and driven against a simulated GPU.

The simulation is HAMi-core's limiter as its watcher runs it: a refill of thread-block tokens every 120 ms, a
process that launches while it has tokens and looks again every 10 ms while it has none, NVML's utilisation as
the busy share of the last second. With HAMi-core's own correction (delta(), with the change linear-step) it
reproduces, second by second, what an H200 measured (data/h200_linear_step.json): that is what makes its
verdict on share-model worth having before a GPU measures it. Loads of long and of short blocks, and a graph
charged all its kernels' blocks, must each settle at their cap within seconds, and a pause must not let the
load run past it, as it lets HAMi-core's own correction."""

from __future__ import annotations

import ctypes
import json
import subprocess
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from device_plugin.hami_build.changes import SHARE_MODEL_C

TICK_S = 0.12  # the watcher's g_wait
POLL_S = 0.010  # rate_limiter's g_cycle, between looks at an empty budget
WINDOW_S = 1.0  # the utilisation NVML reports: the last second's
SMS, THREADS = 132, 2048  # an H100's or H200's SMs and threads per SM
FLOOR = SMS * THREADS * 5 // 2560  # delta()'s smallest step, linear in SMs
TOTAL = SMS * THREADS * 32  # the pool: SMs x threads x FACTOR
BUCKET_TICKS = 2  # idle-hold's bucket: two ticks of the refill
MEASURED = json.loads((Path(__file__).parent / "data" / "h200_linear_step.json").read_text())

# The refill for the next tick from (this tick's refill, limit, utilisation, waited since the last tick).
Refill = Callable[[int, int, int, int], int]


class Window(ctypes.Structure):
    _fields_ = [
        ("refills", ctypes.c_int64 * 8),
        ("waited", ctypes.c_int * 8),
        ("next", ctypes.c_int),
        ("filled", ctypes.c_int),
    ]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = tmp_path_factory.mktemp("share-model") / "libshare_model.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", str(SHARE_MODEL_C), "-o", str(lib)], check=True
    )
    loaded = ctypes.CDLL(str(lib))
    loaded.tf_next_refill.restype = ctypes.c_int64
    loaded.tf_next_refill.argtypes = [
        ctypes.POINTER(Window),
        *(ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64),
    ]
    return loaded


def share_model(model: ctypes.CDLL) -> Refill:
    """The change share-model's refill, one process's window."""
    window = Window()
    return lambda refill, limit, used, waited: int(
        model.tf_next_refill(ctypes.byref(window), refill, limit, used, waited, FLOOR, TOTAL)
    )


def linear_step(refill: int, limit: int, used: int, _waited: int) -> int:
    """HAMi-core's delta() with the change linear-step (one SM factor in the step), as its C has it."""
    diff = max(abs(limit - used), 5)
    step = SMS * THREADS * diff // 2560
    if diff > limit // 2:
        step = step * diff * 2 // (limit + 1)
    return min(TOTAL, refill + step) if used <= limit else max(0, refill - step)


@dataclass(frozen=True)
class Load:
    """One launch: the blocks it is charged, and how long it runs on the whole GPU."""

    blocks: int
    seconds: float


LOADS = {
    "compute": Load(2112, 1.7e-3),  # tenant_load compute: 16 blocks an SM, 1.7 ms
    "memory": Load(1056, 0.15e-3),  # tenant_load memory: 8 blocks an SM, 512 MB moved in 0.15 ms
    "graph": Load(16 * 2112, 1.7e-3),  # tenant_load graph: 16 short kernels, charged all their blocks at once
}


def simulate(
    refill_for: Refill, load: Load, limit: int, active: Sequence[tuple[float, float]], bucket: int
) -> list[float]:
    """The busy share of the GPU, in percent, of each whole second until the last active period ends; the
    process holds at most ``bucket`` tokens more than a tick's refill times ``bucket`` (TOTAL: HAMi-core's)."""
    end = active[-1][1]
    refill, tokens, waited = 0, 0, 0
    busy: deque[tuple[float, float]] = deque()  # the last second's launches
    seconds = [0.0] * int(end)
    now, tick = 0.0, TICK_S

    def running(at: float) -> bool:
        return any(lo <= at < hi for lo, hi in active)

    def ticks_until(at: float) -> Iterator[float]:
        nonlocal tick
        while tick <= at:
            yield tick
            tick += TICK_S

    while now < end:
        if running(now) and tokens >= 0:
            tokens -= load.blocks
            busy.append((now, now + load.seconds))
            for s in range(int(now), min(int(now + load.seconds) + 1, len(seconds))):
                seconds[s] += max(0.0, min(now + load.seconds, s + 1) - max(now, s))
            later = now + load.seconds
        elif running(now):
            waited, later = 1, now + POLL_S
        else:
            later = min([tick, *(lo for lo, _ in active if lo > now)])
        for at in ticks_until(later):
            while busy and busy[0][1] <= at - WINDOW_S:
                busy.popleft()
            used = sum(min(hi, at) - max(lo, at - WINDOW_S) for lo, hi in busy if lo < at)
            refill = refill_for(refill, limit, int(100 * used / WINDOW_S), waited)
            waited = 0
            tokens = min(tokens + refill, min(refill * bucket, TOTAL))
        now = later
    return [100 * s for s in seconds]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize("series", MEASURED["series"], ids=lambda s: f"{s['kernel']}-{s['limit']}")
def test_the_simulation_reproduces_what_an_h200_measured_of_hami_core(series: dict[str, object]) -> None:
    measured = series["shares"]
    assert isinstance(measured, list) and isinstance(series["limit"], int) and isinstance(series["kernel"], str)
    simulated = simulate(linear_step, LOADS[series["kernel"]], series["limit"], [(0.0, 17.0)], TOTAL)
    pairs = list(zip(measured, simulated, strict=False))
    assert mean([abs(m - s) for m, s in pairs]) <= 4, (measured, simulated)  # second by second
    assert abs(mean([m for m, _ in pairs]) - mean([s for _, s in pairs])) <= 3  # and over the run


@pytest.mark.parametrize("kernel", LOADS)
@pytest.mark.parametrize("limit", [10, 25, 50])
def test_every_load_settles_at_its_cap_within_seconds(model: ctypes.CDLL, kernel: str, limit: int) -> None:
    shares = simulate(share_model(model), LOADS[kernel], limit, [(0.0, 20.0)], BUCKET_TICKS)
    assert all(abs(s - limit) <= 5 for s in shares[2:]), shares  # from its third second


@pytest.mark.parametrize("kernel", LOADS)
def test_a_pause_does_not_let_the_load_past_its_cap(model: ctypes.CDLL, kernel: str) -> None:
    periods = [(0.0, 8.0), (28.0, 36.0)]
    shares = simulate(share_model(model), LOADS[kernel], 25, periods, BUCKET_TICKS)
    assert max(shares[8:28]) == 0  # idle
    assert all(s <= 25 + 10 for s in shares[28:]), shares[28:]
    assert abs(mean(shares[30:]) - 25) <= 5, shares[28:]
    # HAMi-core's own correction, its refill grown and its bucket filled while it idled: past the cap.
    theirs = simulate(linear_step, LOADS[kernel], 25, periods, TOTAL)
    assert theirs[28] >= 80, theirs[28:]


def test_the_refill_is_raised_only_after_a_second_held_back(model: ctypes.CDLL) -> None:
    def fresh() -> Callable[..., int]:
        window = Window()
        return lambda *args: int(model.tf_next_refill(ctypes.byref(window), *args, FLOOR, TOTAL))

    # Under its limit: raised (at most twice a tick) while it waited in every tick of the last second, kept from
    # the first tick it did not until eight ticks have passed, and never under the floor.
    step = fresh()
    assert [step(5000, 25, 3, w) for w in (1, 1, 0, *[1] * 7, 1)] == [10_000] * 2 + [5000] * 8 + [10_000]
    assert fresh()(0, 25, 0, 0) == FLOOR
    # Waited while NVML still saw nothing: half-way to twice, never past the pool.
    assert fresh()(5000, 25, 0, 1) == 7500
    assert fresh()(TOTAL, 25, 0, 1) == TOTAL
    # Over its limit, waited or not: half-way to the second's mean refill times limit / utilisation.
    steady = fresh()
    for _ in range(8):
        steady(40_000, 25, 25, 1)
    assert steady(40_000, 25, 50, 0) == 30_000
