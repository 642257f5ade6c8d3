"""The autoscaling recommender's cost: CPU per workload per evaluation, and memory at 10,000 pods.

Runs the pure core (:mod:`vgpu.autoscale`) as a controller will:

* one workload's state — the requests layer's TFLOPS histogram and VRAM peak histogram (24 h aggregation
  period), the limits layer's one-minute windows for TFLOPS and VRAM and the replicas layer's 15-second
  window — fed a week of 5-second samples (120,960 per resource) of a daily TFLOPS cycle with noise and a
  slowly growing VRAM, timing every sample fed;
* then, at the week's end, evaluation after evaluation of all three layers: the windows' stats, the limits
  decision for TFLOPS and VRAM, the requests decision for TFLOPS and VRAM (two percentiles of histograms
  holding the week) and the replicas decision;
* and 10,000 pods' state, each fed samples spread over the week, measured with tracemalloc, plus the size of
  a pod's two histogram checkpoints as JSON.

Prints the figures and the hardware.

    .venv/bin/python -m benchmarks.recommender [--days 7] [--interval 5] [--evaluations 5000] [--pods 10000]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
import tracemalloc
from dataclasses import dataclass

from benchmarks.hardware import describe
from vgpu.autoscale.config import AutoScalingConfig, Resource, parse
from vgpu.autoscale.histogram import DecayingHistogram, PeakHistogram, sample_weight, tflops_history, vram_history
from vgpu.autoscale.recommend import limit_ceiling, recommend_limit, recommend_replicas, recommend_request
from vgpu.autoscale.window import UsageWindow

DAY = 86400.0
GI = 1024**3
START = 1_700_000_000.0
REQUEST, LIMIT, CAPACITY = 10_000, 20_000, 312_000  # milli-TFLOPS: 10 requested, 20 limit, an A100
VRAM_REQUEST, VRAM_CAPACITY = 8 * GI, 80 * GI


@dataclass
class PodState:
    """What the controller keeps per pod (here one workload of one pod): two histograms, two windows."""

    tflops: DecayingHistogram
    vram: PeakHistogram
    tflops_window: UsageWindow
    vram_window: UsageWindow


def new_state(config: AutoScalingConfig) -> PodState:
    period = config.requests.aggregation_period_s
    window = config.limits.evaluation_period_s
    return PodState(tflops_history(period), vram_history(period), UsageWindow(window), UsageWindow(window))


def usage_at(t: float, rng: random.Random) -> tuple[float, float]:
    """A daily TFLOPS cycle between 4 and 16 TFLOPS with ±10 % noise, and VRAM growing from 4 to 6 GiB a week."""
    phase = math.sin(2 * math.pi * (t - START) / DAY)
    tflops = (10_000 + 6_000 * phase) * rng.uniform(0.9, 1.1)
    vram = 4 * GI + 2 * GI * (t - START) / (7 * DAY) + rng.uniform(0, 256 * 1024**2)
    return tflops, vram


def feed(state: PodState, t: float, tflops: float, vram: float) -> None:
    state.tflops.add_sample(tflops, sample_weight(REQUEST), t)
    state.vram.add_sample(vram, t)
    state.tflops_window.add_sample(tflops, t)
    state.vram_window.add_sample(vram, t)


def evaluate(config: AutoScalingConfig, state: PodState, replicas: UsageWindow, now: float, interval: float) -> int:
    """Every layer's decision for one workload (one pod) at ``now``; returns the number of changes."""
    tflops_use = state.tflops_window.stats(now, interval_s=interval)
    vram_use = state.vram_window.stats(now, interval_s=interval)
    decisions = (
        recommend_limit(config.limits, Resource.TFLOPS, tflops_use, request=REQUEST, limit=LIMIT,
                        admitted_limit=LIMIT, capacity=CAPACITY),
        recommend_limit(config.limits, Resource.VRAM, vram_use, request=VRAM_REQUEST, limit=VRAM_REQUEST,
                        admitted_limit=VRAM_REQUEST, capacity=VRAM_CAPACITY),
        recommend_request(config.requests, Resource.TFLOPS, state.tflops, request=REQUEST, limit=LIMIT,
                          capacity=CAPACITY, now_s=now, sample_interval_s=interval),
        recommend_request(config.requests, Resource.VRAM, state.vram, request=VRAM_REQUEST, limit=VRAM_REQUEST,
                          capacity=VRAM_CAPACITY, now_s=now, sample_interval_s=interval),
        recommend_replicas(config.replicas, replicas.stats(now, interval_s=interval), replicas=1,
                           max_limit=limit_ceiling(config.limits, request=REQUEST, capacity=CAPACITY),
                           last_scaled_s=None, now_s=now),
    )  # fmt: skip
    return sum(d.changed for d in decisions)


def one_workload(config: AutoScalingConfig, days: float, interval: float, evaluations: int) -> None:
    rng = random.Random(1)
    state, replicas = new_state(config), UsageWindow(config.replicas.evaluation_period_s)
    times = [START + i * interval for i in range(int(days * DAY / interval))]
    samples = [usage_at(t, rng) for t in times]
    cpu = time.process_time()
    for t, (tflops, vram) in zip(times, samples, strict=True):
        feed(state, t, tflops, vram)
        replicas.add_sample(tflops, t)
    per_sample = (time.process_time() - cpu) / len(times)
    now = times[-1]
    evaluate(config, state, replicas, now, interval)  # warm
    cpu = time.process_time()
    for _ in range(evaluations):
        evaluate(config, state, replicas, now, interval)
    per_evaluation = (time.process_time() - cpu) / evaluations
    print(f"one workload, {days:g} days of {interval:g}-s samples ({len(times):,} per resource)")
    print(f"  feeding a sample time (2 histograms, 3 windows): {per_sample * 1e6:.1f} µs CPU "
          f"= {100 * per_sample / interval:.4f} % of one core per workload at {interval:g} s")  # fmt: skip
    print(f"  one evaluation of all three layers: {per_evaluation * 1e6:.1f} µs CPU (mean of {evaluations})")
    p90s = state.tflops.percentile(0.9) / 1000, state.vram.percentile(0.9) / GI
    print(f"  the week's p90: {p90s[0]:.2f} TFLOPS, {p90s[1]:.2f} GiB VRAM peak")


def many_pods(config: AutoScalingConfig, pods: int, samples_each: int, days: float) -> None:
    rng = random.Random(2)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    states = [new_state(config) for _ in range(pods)]
    for state in states:  # samples spread over the week, so the histograms hold a week's spread of buckets
        for i in range(samples_each):
            t = START + i * days * DAY / samples_each
            feed(state, t, *usage_at(t, rng))
    total = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    histograms = sum(
        len(json.dumps(s.tflops.to_checkpoint())) + len(json.dumps(s.vram.to_checkpoint())) for s in states
    )
    print(f"{pods:,} pods' state (TFLOPS and VRAM histograms, TFLOPS and VRAM windows), {samples_each} samples each")
    print(f"  memory: {total / 2**20:.1f} MiB = {total / pods / 1024:.2f} KiB per pod")
    print(f"  checkpoints as JSON: {histograms / pods / 1024:.2f} KiB per pod (both histograms)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--interval", type=float, default=5.0, help="the device plugin's sampling interval, seconds")
    p.add_argument("--evaluations", type=int, default=5000)
    p.add_argument("--pods", type=int, default=10_000)
    p.add_argument("--samples-per-pod", type=int, default=200)
    args = p.parse_args()
    config = parse({"autoSetLimits": {"enable": True}, "autoSetRequests": {"enable": True},
                    "autoSetReplicas": {"enable": True}})  # fmt: skip
    one_workload(config, args.days, args.interval, args.evaluations)
    many_pods(config, args.pods, args.samples_per_pod, args.days)
    print(f"hardware: {describe()}")


if __name__ == "__main__":
    main()
