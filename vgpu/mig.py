"""MIG instances as schedulable units: how one is named, sized and asked for.

A GPU in MIG mode is split by the driver into instances, each a hard-isolated device with its own
UUID (``MIG-…``); the parent's UUID gives a container no usable CUDA device. So the device plugin
publishes the parent as not schedulable and every instance as a unit of its own, and every binary
that names, sizes or matches units does it here:

- **Profile name**: ``<compute slices>g.<memory>gb`` with the memory in GiB rounded up, NVIDIA's
  spelling (``1g.5gb`` is 1 compute slice and 4864 MiB on an A100-40GB; ``3g.40gb`` on an
  A100-80GB, 40192 MiB).
- **Product name**: the parent's model and the profile, ``A100-SXM4-40GB MIG 1g.5gb``.
- **TFLOPS**: the parent's catalog TFLOPS × compute slices ÷ the parent's compute slices (7 on an
  A100 or H100, 4 on an A30), rounded down to a thousandth. A compute slice is an equal share of the
  SMs, so this is the unit's SM share of the parent's dense TFLOPS (1g on an A100: 312 / 7 = 44.571).
- **Matching**: a ``gpu-model`` names a profile (``1g.5gb``, ``mig-1g.5gb``, ``a100-1g.5gb``,
  ``A100 MIG 1g.5gb``, ``nvidia.com/mig-1g.5gb``), optionally with a model that the parent must match.
  A unit is chosen only by a request naming its profile — never by a plain model or no model: a MIG
  profile is an operator's and a user's deliberate choice — and a request naming a profile never gets
  a whole GPU. A unit is granted whole to one pod (its hard isolation is the point of MIG).
"""

from __future__ import annotations

import math
import re
from typing import Final

MARK: Final = "MIG"
_PROFILE: Final = r"\d+g\.\d+gb"
_PRODUCT = re.compile(rf"(?P<parent>.+) {MARK} (?P<profile>{_PROFILE})")
_REQUEST = re.compile(rf"(?:(?P<model>.*?)[\s_\-]+)?(?P<profile>{_PROFILE})")
_MIB = 1024 * 1024


def profile_name(compute_slices: int, memory_bytes: int) -> str:
    """NVIDIA's profile spelling for an instance of ``compute_slices`` and ``memory_bytes``."""
    return f"{compute_slices}g.{math.ceil(memory_bytes / (1024 * _MIB))}gb"


def unit_product(parent_model: str, profile: str) -> str:
    """The product name a unit is published under."""
    return f"{parent_model} {MARK} {profile}"


def unit_tflops(parent_tflops_milli: int, compute_slices: int, parent_slices: int) -> int:
    """The unit's share of its parent's TFLOPS (milli), rounded down."""
    return parent_tflops_milli * compute_slices // parent_slices


def split_product(product: str) -> tuple[str, str] | None:
    """(parent model, profile) of a unit's product name; None for a whole GPU."""
    found = _PRODUCT.fullmatch(product)
    return None if found is None else (found["parent"], found["profile"])


def split_request(requested: str) -> tuple[str, str] | None:
    """(model, profile) of a ``gpu-model`` value naming a MIG profile (model '' when it names none);
    None when it names no profile."""
    text = requested.strip().casefold().removeprefix("nvidia.com/")
    found = _REQUEST.fullmatch(text)
    if found is None:
        return None
    words = [w for w in re.split(r"[\s_\-]+", found["model"] or "") if w]
    while words and words[-1] == MARK.casefold():
        words.pop()
    return " ".join(words), found["profile"]
