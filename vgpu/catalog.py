"""GPU models: map any spelling of a product name to its capacity, and match user model requests.

NVML names change across drivers (``A100-SXM4-40GB`` vs ``NVIDIA A100-SXM4-40GB``), GPU Feature
Discovery replaces spaces with dashes, and users write ``A100``, ``a100-80gb`` or ``L40s``. We
compare *token lists*: case-folded, ``-``/``_``/space as one separator, vendor words dropped. A
requested model matches a GPU when its tokens are a subset of the GPU's with the same first token
(``A100`` matches every A100 but not an A10; ``a100-80gb`` matches both 80 GB A100s), or when it
names one of the GPU's aliases. An unknown model is never an error: it simply has no catalog entry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpu import mig
from vgpu.catalog_data import ROWS
from vgpu.errors import DomainError, FieldError
from vgpu.fields import shown
from vgpu.quantity import parse_milli

_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce"})
_SEPARATORS = re.compile(r"[\s_\-]+")

Tokens = tuple[str, ...]


def tokens(name: str) -> Tokens:
    """Normalise a model name to its comparable tokens."""
    parts = [p for p in _SEPARATORS.split(name.casefold().strip()) if p]
    while parts and parts[0] in _VENDOR_WORDS:
        parts.pop(0)
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One catalog entry."""

    key: str
    nvml_names: tuple[str, ...]
    tflops_milli: int
    memory_mib: int
    aliases: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True, slots=True)
class Catalog:
    """An immutable model table with lookups by product name and by requested name."""

    models: tuple[GpuModel, ...]
    _by_name: dict[Tokens, GpuModel] = field(init=False, repr=False, compare=False)
    _by_alias: dict[Tokens, tuple[GpuModel, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[Tokens, GpuModel] = {}
        by_alias: dict[Tokens, list[GpuModel]] = {}
        for model in self.models:
            for name in (model.key, *model.nvml_names):
                by_name[tokens(name)] = model
            for alias in model.aliases:
                by_alias.setdefault(tokens(alias), []).append(model)
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_by_alias", {k: tuple(v) for k, v in by_alias.items()})

    def lookup(self, product_name: str) -> GpuModel | None:
        """The entry for a product name (NVML, GFD label or our key), or None if unknown."""
        return self._by_name.get(tokens(product_name))

    def matches(self, requested: str, product_name: str) -> bool:
        """Whether a user's ``gpu-model`` value selects a GPU with this product name. A MIG unit is
        selected only by a value naming its profile, and such a value selects nothing else (vgpu.mig)."""
        unit, asked = mig.split_product(product_name), mig.split_request(requested)
        if unit is None and asked is None:
            return self._matches_model(requested, product_name)
        if unit is None or asked is None or unit[1] != asked[1]:
            return False
        return not asked[0] or self._matches_model(asked[0], unit[0])

    def _matches_model(self, requested: str, product_name: str) -> bool:
        want = tokens(requested)
        if not want:
            return False
        model = self.lookup(product_name)
        candidates = [tokens(product_name)]
        if model is not None:
            candidates.append(tokens(model.key))
            if model in self._by_alias.get(want, ()):
                return True
        return any(want[0] == have[0] and set(want) <= set(have) for have in candidates if have)

    def with_overrides(self, overrides: Iterable[GpuModel]) -> Catalog:
        """A new catalog where each override replaces the entry with the same key, or is added."""
        replaced = {m.key: m for m in self.models}
        for model in overrides:
            replaced[model.key] = model
        return Catalog(tuple(replaced.values()))


def builtin() -> Catalog:
    """The catalog compiled from :mod:`vgpu.catalog_data`."""
    return Catalog(
        tuple(
            GpuModel(
                key=row.key,
                nvml_names=tuple(n for n in row.nvml_names) + tuple(f"NVIDIA {n}" for n in row.nvml_names),
                tflops_milli=parse_milli(row.tflops),
                memory_mib=row.memory_mib,
                aliases=row.aliases,
                note=row.note,
            )
            for row in ROWS
        )
    )


def parse_overrides(entries: Sequence[Mapping[str, Any]], *, source: str = "gpu catalog") -> tuple[GpuModel, ...]:
    """Operator overrides from configuration: ``[{key, tflops, memoryMiB?, nvmlNames?, aliases?}]``."""
    errors: list[FieldError] = []
    models: list[GpuModel] = []
    for i, entry in enumerate(entries):
        where = f"{source}[{i}]"
        if not isinstance(entry, Mapping):
            errors.append(FieldError(where, shown(entry), "must be a mapping with key and tflops"))
            continue
        key = entry.get("key")
        if not isinstance(key, str) or not tokens(key):
            errors.append(
                FieldError(f"{where}.key", None if key is None else shown(key), "must be a non-empty model name")
            )
            continue
        try:
            tflops = parse_milli(str(entry.get("tflops", "")), key=f"{where}.tflops")
        except DomainError as exc:
            errors.extend(exc.errors)
            continue
        memory = entry.get("memoryMiB", 0)
        if not isinstance(memory, int) or isinstance(memory, bool) or memory < 0:
            errors.append(FieldError(f"{where}.memoryMiB", shown(memory), "must be a whole number ≥ 0"))
            continue
        names = _strings(entry.get("nvmlNames", ()), f"{where}.nvmlNames", errors)
        aliases = _strings(entry.get("aliases", ()), f"{where}.aliases", errors)
        models.append(GpuModel(key, (key, *names), tflops, memory, aliases, str(entry.get("note", ""))))
    if errors:
        raise DomainError(errors)
    return tuple(models)


def _strings(value: object, key: str, errors: list[FieldError]) -> tuple[str, ...]:
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    errors.append(FieldError(key, shown(value), "must be a list of strings"))
    return ()
