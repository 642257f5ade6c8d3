"""share_model.c, compiled alone and driven against a simulated GPU.

The simulation is HAMi-core's limiter as its watcher runs it: a refill of thread-block tokens every 120 ms, a
process that launches while it has tokens and looks again every 10 ms while it has none, NVML's utilisation as
the busy share of the last second. With HAMi-core's own correction (delta(), with the change linear-step) it
reproduces, second by second, what an H200 measured (data/h200_linear_step.json): that is what makes its
verdict on share-model worth having before a GPU measures it. Loads of long and of short blocks, and a graph
charged all its kernels' blocks, must each settle at their cap within seconds, two busy tenants must split the
GPU as HAMi-core's own correction splits it, and a pause must not let the load run past its cap, as HAMi-core's
own correction does."""

from __future__ import annotations

import ctypes
import json
import subprocess
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from device_plugin.hami_build.watcher_edits import SHARE_MODEL_C

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


@dataclass
class Tenant:
    """One process under HAMi-core's limiter: its refill, load and limit, when it runs, and what it did."""

    refill_for: Refill
    load: Load
    limit: int
    active: Sequence[tuple[float, float]]
    refill: int = 0
    tokens: int = 0
    waited: int = 0
    at: float = 0.0  # when it next launches or looks at its budget
    busy: deque[tuple[float, float]] = field(default_factory=deque)  # its launches of the last second
    seconds: list[float] = field(default_factory=list)  # its busy time in each whole second

    def running(self, at: float) -> bool:
        return any(lo <= at < hi for lo, hi in self.active)

    def ran(self, lo: float, hi: float) -> None:
        self.busy.append((lo, hi))
        for s in range(int(lo), min(int(hi) + 1, len(self.seconds))):
            self.seconds[s] += max(0.0, min(hi, s + 1) - max(lo, s))

    def tick(self, at: float, bucket: int) -> None:
        """The watcher's tick: NVML's utilisation of the last second, the next refill, the budget topped up."""
        while self.busy and self.busy[0][1] <= at - WINDOW_S:
            self.busy.popleft()
        used = sum(min(hi, at) - max(lo, at - WINDOW_S) for lo, hi in self.busy if lo < at)
        self.refill = self.refill_for(self.refill, self.limit, int(100 * used / WINDOW_S), self.waited)
        self.waited = 0
        self.tokens = min(self.tokens + self.refill, min(self.refill * bucket, TOTAL))


def simulate_all(tenants: Sequence[Tenant], bucket: int) -> list[list[float]]:
    """Each tenant's busy share of the GPU, in percent, in each whole second until the last one stops. The GPU
    runs one launch at a time, in the order they come (two processes' kernels are time-sliced, not run side by
    side); a launch returns when its kernel ends. Each process holds at most ``bucket`` ticks of its refill."""
    end = max(t.active[-1][1] for t in tenants)
    for tenant in tenants:
        tenant.seconds = [0.0] * int(end)
    gpu_free, tick = 0.0, TICK_S
    while (actor := min(tenants, key=lambda t: t.at)).at < end:
        now = actor.at
        while tick <= now:
            for tenant in tenants:
                tenant.tick(tick, bucket)
            tick += TICK_S
        if actor.running(now) and actor.tokens >= 0:
            actor.tokens -= actor.load.blocks
            start = max(now, gpu_free)
            gpu_free = actor.at = start + actor.load.seconds
            actor.ran(start, gpu_free)
        elif actor.running(now):
            actor.waited, actor.at = 1, now + POLL_S
        else:
            actor.at = min([end, *(lo for lo, _ in actor.active if lo > now)])
    return [[100 * s for s in t.seconds] for t in tenants]


def simulate(
    refill_for: Refill, load: Load, limit: int, active: Sequence[tuple[float, float]], bucket: int
) -> list[float]:
    """One tenant alone on the GPU: :func:`simulate_all`."""
    return simulate_all([Tenant(refill_for, load, limit, active)], bucket)[0]


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


@pytest.mark.parametrize("split", MEASURED["splits"], ids=lambda s: "/".join(map(str, s["limits"])))
def test_two_busy_tenants_split_the_gpu_as_with_hami_cores_own_correction(
    model: ctypes.CDLL, split: dict[str, list[float]]
) -> None:
    limits = [int(x) for x in split["limits"]]
    compute = LOADS["compute"]

    def shares(refill: Callable[[], Refill], bucket: int) -> list[float]:
        run = simulate_all([Tenant(refill(), compute, limit, [(0.0, 60.0)]) for limit in limits], bucket)
        return [mean(seconds[2:]) for seconds in run]

    theirs = shares(lambda: linear_step, TOTAL)
    # Two processes time-sliced are the simulation's roughest part: within 6 points of the H200's split.
    assert all(abs(s - m) <= 6 for s, m in zip(theirs, split["shares"], strict=True)), (theirs, split)
    ours = shares(lambda: share_model(model), BUCKET_TICKS)
    assert all(abs(s - t) <= 2 for s, t in zip(ours, theirs, strict=True)), (ours, theirs)
    assert all(abs(s - limit) <= 5 for s, limit in zip(ours, limits, strict=True)), ours


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
