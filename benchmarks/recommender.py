"""The autoscaling recommender's cost: CPU per workload per evaluation, and memory at 10,000 pods.

Runs the pure core (:mod:`vgpu.autoscale`) as a controller will:

* one workload's state — the requests layer's TFLOPS histogram and VRAM peak histogram (24 h aggregation
  period), the limits layer's one-minute windows for TFLOPS and VRAM and the replicas layer's 15-second
  window — fed a week of 5-second samples (120,960 per resource) of a daily TFLOPS cycle with noise and a
  slowly growing VRAM, timing every sample fed;
* then, at the week's end, evaluation after evaluation of all three layers: the windows' stats, the limits
  decision for TFLOPS and VRAM, the requests decision for TFLOPS and VRAM (two percentiles of histograms
  holding the week) and the replicas decision;
* 10,000 pods' state, each fed samples spread over the week, measured with tracemalloc, plus the size of
  a pod's two histogram checkpoints as JSON;
* and the controller's state as the extender runs it: one :class:`~vgpu.autoscale.evaluate.Autoscaler`
  holding 1,000 workloads of 10 one-GPU pods, all three layers on (defaults, except that every layer's
  evaluation period is the sampling interval, so each pass evaluates every layer: the worst pass), fed one
  pass of samples per interval for a simulated hour. Only the last passes evaluate (an evaluation changes
  no history, and evaluating all 720 would take nine minutes here); they are timed — ``feed`` of every pod's
  sample plus ``evaluate`` of every workload — and then the whole state's memory and the size of every
  workload's checkpoint as JSON are measured. The memory is a pickle copy's under tracemalloc (tracing the
  hour itself would triple its time): an upper bound, since the copy owns the pod UIDs and GPU names that
  the state in place shares with the controller's workloads — at 1,000 pods, 5.5 MiB copied against 4.9 MiB
  traced in place.

Prints the figures and the hardware.

    .venv/bin/python -m benchmarks.recommender [--days 7] [--interval 5] [--evaluations 5000] [--pods 10000]
        [--workloads 1000] [--pods-per-workload 10] [--minutes 60] [--timed-passes 24]
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import random
import time
import tracemalloc
from dataclasses import dataclass

from benchmarks.hardware import describe
from vgpu.autoscale.config import AutoScalingConfig, Resource, parse
from vgpu.autoscale.evaluate import Autoscaler, Grant, Member, Sample, Workload
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


def controller_workloads(config: AutoScalingConfig, workloads: int, pods_each: int) -> list[Workload]:
    """What the controller finds each pass: workloads of one-GPU pods, each pod on a GPU of its own."""
    found = []
    for w in range(workloads):
        members = tuple(
            Member(uid=f"uid-{w}-{p}", name=f"w{w}-{p}", admitted_tflops_limit=LIMIT, admitted_vram_limit=VRAM_REQUEST,
                   grants=(Grant(gpu=f"GPU-{w}-{p}", tflops_request=REQUEST, tflops_limit=LIMIT,
                                 vram_request=VRAM_REQUEST, vram_limit=VRAM_REQUEST, tflops_capacity=CAPACITY,
                                 vram_capacity=VRAM_CAPACITY),))
            for p in range(pods_each)
        )  # fmt: skip
        found.append(Workload(namespace=f"team-{w % 20}", name=f"w{w}", config=config, members=members,
                              tflops_request=REQUEST, tflops_limit=LIMIT, vram_request=VRAM_REQUEST,
                              vram_limit=VRAM_REQUEST, gpu_count=1, replicas=pods_each, min_replicas=1,
                              max_replicas=2 * pods_each))  # fmt: skip
    return found


def controller_state(workloads: int, pods_each: int, minutes: float, interval: float, timed: int) -> None:
    every = f"{interval:g}s"
    config = parse({"autoSetLimits": {"enable": True, "evaluationPeriod": every},
                    "autoSetRequests": {"enable": True, "evaluationPeriod": every},
                    "autoSetReplicas": {"enable": True, "evaluationPeriod": every}})  # fmt: skip
    found = controller_workloads(config, workloads, pods_each)
    pods = workloads * pods_each
    rng = random.Random(3)
    state = Autoscaler()
    passes = int(minutes * 60 / interval)
    feed_cpu = evaluate_cpu = 0.0
    for n in range(passes):
        t = START + n * interval
        samples = []
        for w, workload in enumerate(found):
            at = t + w * DAY / workloads  # each workload at its own point of the daily cycle
            for m in workload.members:
                tflops, vram = usage_at(at, rng)
                g = m.grants[0]
                samples.append(
                    Sample(m.uid, g.gpu, int(tflops), int(vram), True, t, interval, g.tflops_limit, g.vram_limit)
                )
        cpu = time.process_time()
        state.feed(samples, found)
        if n < passes - timed:
            continue
        fed = time.process_time()
        for workload in found:
            state.evaluate(workload, t)
        feed_cpu += fed - cpu
        evaluate_cpu += time.process_time() - fed
    full = (feed_cpu + evaluate_cpu) / timed
    print(
        f"the controller's state: {workloads:,} workloads × {pods_each} one-GPU pods = {pods:,} pods, "
        f"{passes} passes of {interval:g}-s samples ({minutes:g} simulated minutes), every layer due every pass"
    )
    print(
        f"  one full pass (feed {pods:,} samples, evaluate {workloads:,} workloads): {full * 1e3:.0f} ms CPU "
        f"(feed {feed_cpu / timed * 1e3:.0f} ms, evaluate {evaluate_cpu / timed * 1e3:.0f} ms; "
        f"mean of the last {timed})"
    )
    print(
        f"  per workload per evaluation: {full / workloads * 1e6:.0f} µs CPU with its feed, "
        f"{evaluate_cpu / timed / workloads * 1e6:.0f} µs the evaluation alone"
    )
    copied = pickle.dumps(state)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = pickle.loads(copied)
    total = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert held.streams() == pods
    print(
        f"  memory of the whole Autoscaler (a pickle copy: an upper bound): {total / 2**20:.1f} MiB "
        f"= {total / pods / 1024:.2f} KiB per pod"
    )
    sizes = [len(json.dumps(state.checkpoint(w.key))) for w in found]
    print(
        f"  checkpoints as JSON: {sum(sizes) / 2**20:.2f} MiB in all, {sum(sizes) / len(sizes) / 1024:.2f} KiB "
        f"per workload (largest {max(sizes) / 1024:.2f} KiB)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--interval", type=float, default=5.0, help="the device plugin's sampling interval, seconds")
    p.add_argument("--evaluations", type=int, default=5000)
    p.add_argument("--pods", type=int, default=10_000)
    p.add_argument("--samples-per-pod", type=int, default=200)
    p.add_argument("--workloads", type=int, default=1000, help="the controller's state: autoscaled workloads")
    p.add_argument("--pods-per-workload", type=int, default=10)
    p.add_argument("--minutes", type=float, default=60.0, help="the controller's state: simulated minutes fed")
    p.add_argument("--timed-passes", type=int, default=24, help="the controller's last passes, evaluated and timed")
    args = p.parse_args()
    config = parse({"autoSetLimits": {"enable": True}, "autoSetRequests": {"enable": True},
                    "autoSetReplicas": {"enable": True}})  # fmt: skip
    one_workload(config, args.days, args.interval, args.evaluations)
    many_pods(config, args.pods, args.samples_per_pod, args.days)
    controller_state(args.workloads, args.pods_per_workload, args.minutes, args.interval, args.timed_passes)
    print(f"hardware: {describe()}")


if __name__ == "__main__":
    main()
