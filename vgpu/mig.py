"""MIG instances as schedulable units: how one is named, sized and asked for.

A GPU in MIG mode is split by the driver into hard-isolated instances with their own UUIDs
(``MIG-…``), and the parent's UUID gives a container no usable CUDA device. So the device plugin
publishes the parent as not schedulable and every instance as a unit of its own, and every binary
that names, sizes or matches units does it here: the profile name (``1g.5gb``), the product name
(``A100-SXM4-40GB MIG 1g.5gb``), the TFLOPS (the parent's, by compute slices) and the ``gpu-model``
spellings that select a profile. A unit is chosen only by a request naming its profile, and is
granted whole to one pod. The rules, with examples: deploy/README.md, section "MIG".
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
