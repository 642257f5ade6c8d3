"""Compute as a percentage of one GPU (TensorFusion v2's ``compute-percent-request``/``-limit``).

A percent means the same share of every GPU: 50 is 156 TFLOPS of an A100 and 60.5 of an L4. So it is
kept as a percentage until the pod meets a GPU, and converted there, by :func:`tflops_on`, for the
fit, the score, the grant and the preemption alike (vgpu/scheduling/compute_share.py). Before that,
at admission, a pod is *charged* the share of the largest GPU it may land on (:func:`charge_base`):
the TFLOPS its resource requests, its namespace quota and kube-scheduler's node totals count, so that
asking in percent never buys more than its quota (TensorFusion's own percent skips quota checks).

Values are kept in thousandths of a percent (``50`` is 50,000), so the conversion is exact integer
arithmetic, rounded up: a grant never falls short of its share.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final

from vgpu import fields
from vgpu.catalog import Catalog
from vgpu.errors import FieldError

UNIT: Final = 1000  # per percent
WHOLE: Final = 100 * UNIT  # 100 %
_PERCENT = re.compile(r"^([0-9]{1,3})(?:\.([0-9]{1,3}))?%?$")
ACCEPTED: Final = "a percentage of one GPU's compute above 0 and at most 100, such as 50 or 12.5"


def parse(key: str, raw: str, errors: list[FieldError]) -> int | None:
    """Thousandths of a percent from ``50``, ``12.5`` or ``50%``; above 0, at most 100, three decimals at most."""
    match = _PERCENT.fullmatch(raw.strip())
    value = None if match is None else int(match[1]) * UNIT + int((match[2] or "").ljust(3, "0"))
    if value is not None and 0 < value <= WHOLE:
        return value
    errors.append(FieldError(key, fields.shown(raw), f"must be {ACCEPTED}"))
    return None


def show(percent: int) -> str:
    """``50%``, ``12.5%``: thousandths of a percent as a user writes them."""
    whole, part = divmod(percent, UNIT)
    return f"{whole}.{str(part).rjust(3, '0').rstrip('0')}%" if part else f"{whole}%"


def tflops_on(percent: int, gpu_tflops: int) -> int:
    """The milli-TFLOPS a share of ``percent`` is of a GPU of ``gpu_tflops`` milli-TFLOPS, rounded up."""
    return -(-gpu_tflops * percent // WHOLE)


def charge_base(sizes: Mapping[str, int], model: str | None, catalog: Catalog) -> int | None:
    """The GPU TFLOPS (milli) a percent pod is charged against at admission: the largest it may land on.

    ``sizes``: the pool's GPU products and their TFLOPS (its status). With ``model``, the largest of
    the products it matches, or, where the pool has none (yet), the catalog's size of that model; without,
    the pool's largest. None when nothing says (an empty pool, and no model or one the catalog does not know).
    """
    matching = [t for product, t in sizes.items() if model is None or catalog.matches(model, product)]
    if matching:
        return max(matching)
    if model is not None:
        known = [m.tflops_milli for m in catalog.models if catalog.matches(model, m.key)]
        return max(known, default=None)
    return None


def largest(sizes: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Product -> its largest TFLOPS (milli) among the given GPUs: what a pool's status publishes."""
    out: dict[str, int] = {}
    for product, tflops in sizes:
        out[product] = max(tflops, out.get(product, 0))
    return out
