"""GPUs per container (TensorFusion v2's ``container-gpu-count``), and how a pod's grant is split among them.

The annotation is a JSON object of inject containers to whole GPU counts, ``{"pre-process": 1, "inference": 1}``.
As in TensorFusion, the pod's GPU count is their sum, each container is given GPUs of its own (none shared with
its siblings), and the per-GPU share (TFLOPS, VRAM) applies to every GPU as for any pod. Without it every inject
container sees every GPU of the pod, as before.

Read from the pod's own annotation only: the map names one pod spec's containers, which a WorkloadProfile or a
pool's defaults shared by pods of other shapes cannot know (TensorFusion's profile has no such field either; its
controller copies the workload's annotation onto each pod, as a Deployment's template does here).

Admission parses it (:func:`parse`) and holds it against the inject containers and ``gpu-count``
(:func:`matched`); the extender splits the GPUs it grants (:func:`split`): the containers, in the request's order,
take consecutive runs of the granted GPUs, ordered as ``gpu-indices`` lists them, else by index. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from vgpu.contract.allocation import GpuGrant
from vgpu.errors import FieldError
from vgpu.fields import MAX_GPU_COUNT, shown
from vgpu.names import Annotation

KEY = Annotation.CONTAINER_GPU_COUNT
# (container, GPUs) in the request's container order.
Counts = tuple[tuple[str, int], ...]
_ACCEPTED = 'a JSON object of inject containers to GPU counts, such as {"pre-process": 1, "inference": 1}'


class _Pairs(tuple[tuple[str, object], ...]):
    """A JSON object's members as written, duplicates kept (``json.loads`` would keep the last one silently)."""


def parse(raw: str, containers: Sequence[str], errors: list[FieldError]) -> Counts | None:
    """The map in its own order, its names checked against the pod's ``containers`` (when known); None, with
    the errors appended, when it is not one."""
    try:
        found = json.loads(raw, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError):
        return _checked(raw, None, [(True, f"not JSON; must be {_ACCEPTED}")], errors)
    if not isinstance(found, _Pairs) or not found:
        return _checked(raw, None, [(True, f"must be {_ACCEPTED}")], errors)
    names = [name for name, _ in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    absent = [n for n in dict.fromkeys(names) if containers and n not in containers]
    bad = [f"{name}: {json.dumps(n)}" for name, n in found if not _whole(n)]
    counts = tuple((name, n) for name, n in found if isinstance(n, int) and _whole(n))
    total = sum(n for _, n in counts)
    checks = [
        (bool(twice), f"names container {', '.join(twice)} more than once"),
        (bool(absent), f"no container named {', '.join(absent)}; the pod has {', '.join(containers)}"),
        (bool(bad), f"counts must be whole numbers from 1 to {MAX_GPU_COUNT} ({'; '.join(bad)})"),
        (total > MAX_GPU_COUNT, f"asks for {total} GPUs in all; a pod gets at most {MAX_GPU_COUNT}, on one node"),
    ]
    return _checked(raw, counts, checks, errors)


def _whole(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_GPU_COUNT


def _checked(
    raw: str, counts: Counts | None, checks: Sequence[tuple[bool, str]], errors: list[FieldError]
) -> Counts | None:
    """``counts``, or None with an error naming the key and its value for each failed check."""
    failed = [FieldError(KEY, shown(raw), message) for bad, message in checks if bad]
    errors.extend(failed)
    return None if failed else counts


def named(counts: Counts, containers: Sequence[str]) -> tuple[str, ...]:
    """The inject containers the map names, where ``inject-container`` does not: in the pod's order."""
    order = {c: i for i, c in enumerate(containers)}
    return tuple(sorted((name for name, _ in counts), key=lambda name: order.get(name, len(order))))


def matched(
    counts: Counts, raw: str, inject: Sequence[str], gpu_count: int | None, errors: list[FieldError]
) -> Counts | None:
    """``counts`` in the order of the ``inject`` containers, which they must name exactly, and agreeing with the
    pod's own ``gpu-count`` (``gpu_count``, None when it has none); None, with the errors appended, otherwise."""
    given = dict(counts)
    uncounted = [c for c in inject if c not in given]
    extra = [c for c in given if c not in inject]
    total = sum(given.values())
    inject_key, count_key = Annotation.INJECT_CONTAINER, Annotation.GPU_COUNT
    checks = [
        (
            bool(uncounted),
            f"gives no count to {', '.join(uncounted)}, which {inject_key} names; every inject container needs "
            "its count",
        ),
        (
            bool(extra),
            f"gives a count to {', '.join(extra)}, which {inject_key} does not name; name it there too, or drop "
            "it here",
        ),
        (
            gpu_count is not None and gpu_count != total,
            f"asks for {total} GPUs in all but {count_key} is {gpu_count}: the pod's GPUs are the sum of its "
            f"containers'; remove {count_key}, or make it {total}",
        ),
    ]
    return _checked(raw, tuple((c, given[c]) for c in inject if c in given), checks, errors)


def split(
    counts: Counts, grants: Sequence[GpuGrant], indices: Sequence[int] | None = None
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Which granted GPUs (UUIDs) each container gets: consecutive runs of ``grants`` in ``indices`` order (the
    pod's ``gpu-indices``), else by index, taken by the containers in turn. ``grants`` number the counts' sum:
    the request's GPU count is that sum (:mod:`vgpu.contract.resolved` holds it), and placement grants as many."""
    rank = {index: i for i, index in enumerate(indices or ())}
    ordered = sorted(grants, key=lambda g: (rank.get(g.index, len(rank)), g.index, g.uuid))
    out, start = [], 0
    for container, n in counts:
        out.append((container, tuple(g.uuid for g in ordered[start : start + n])))
        start += n
    return tuple(out)
