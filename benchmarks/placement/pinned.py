"""Model-pinned variants of the openb traces, rebuilt from (trace, share, seed) in memory.

None of the shared openb traces pins a GPU model (their ``gpu_spec`` column is empty), yet real
clusters do, and a policy tuned without such demand can fall behind FGD once it appears. This
module derives a family of variants from any trace instead of keeping files (so that the policy
cannot be tuned to one): ``share`` of the GPU pods — chosen at random — get a ``gpu_spec``.

Each pinned pod's model is drawn with probability proportional to the GPUs that could host the pod
(GPUs on nodes of that model with enough GPUs, CPU and memory for it), so every model's pinned
demand is plausible for the GPUs it has and no pod is pinned where it can never run; with
probability :data:`LIST_SHARE` a second such model is added, giving a ``|`` list as openb writes
it (``V100M16|V100M32``). Everything random comes from ``random.Random(seed)`` over the
name-sorted pods, so a (trace, share, seed) is the same variant on every machine; the protocol's
own seed then orders and inflates it as usual. ``--pin-skew 0`` draws the models uniformly instead (a
second, harsher family: the scarce models get as many pins as the plentiful ones).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from benchmarks.placement.traces import TraceNode, TracePod

SHARES: Final = (0.0, 0.10, 0.20, 0.25, 0.33, 0.35)  # the range: none to ~35 % of the GPU pods
LIST_SHARE: Final = 0.25  # of the pinned pods accept two models


def hosts(pod: TracePod, nodes: Sequence[TraceNode]) -> dict[str, int]:
    """GPUs per model on the nodes that could take ``pod`` on their own (GPU count, CPU, memory)."""
    out: dict[str, int] = {}
    for n in nodes:
        if n.gpus >= pod.num_gpu and n.cpu >= pod.cpu and n.memory_mib >= pod.memory_mib:
            out[n.model] = out.get(n.model, 0) + n.gpus
    return out


def _draw(rng: random.Random, weights: dict[str, float]) -> str:
    models = sorted(weights)
    return rng.choices(models, weights=[weights[m] for m in models])[0]


def pin(
    pods: Sequence[TracePod], nodes: Sequence[TraceNode], share: float, seed: int, skew: float = 1.0
) -> list[TracePod]:
    """The trace with ``share`` of its GPU pods pinned to one model or two (name-sorted order).

    ``skew`` shapes where the pins go: a model is drawn with weight (GPUs that could host the pod) ** skew —
    1 in proportion to each model's GPUs (the family's default), 0 uniformly over the models that could host
    the pod, which piles pinned demand onto the scarce models far beyond their share of the GPUs."""
    rng = random.Random(seed)
    out = sorted(pods, key=lambda p: p.name)
    gpu_pods = [i for i, p in enumerate(out) if p.num_gpu > 0 and p.gpu_milli > 0]
    for i in sorted(rng.sample(gpu_pods, round(share * len(gpu_pods)))):
        weights = {m: g**skew for m, g in hosts(out[i], nodes).items()}
        if not weights:
            continue  # fits no node at all: nothing to pin it to
        models = {_draw(rng, weights)}
        if rng.random() < LIST_SHARE and len(weights) > 1:
            models.add(_draw(rng, {m: w for m, w in weights.items() if m not in models}))
        out[i] = replace(out[i], gpu_spec=tuple(sorted(models)))
    return out


def label(trace: str, share: float, seed: int, skew: float = 1.0) -> str:
    """The row name of a variant in reports: ``default+pin25/7`` (``default+pin25/7^0`` when skewed)."""
    return f"{trace}+pin{round(100 * share)}/{seed}" + ("" if skew == 1.0 else f"^{skew:g}")
