"""The GPU catalog a node runs with: the built-in models plus the operator's ``--gpu-catalog`` file.

The shared catalog (:mod:`vgpu.catalog`) is pure and only parses entries; reading the file is I/O
and belongs to the node. The file is a YAML or JSON list of entries ``{key, tflops, memoryMiB,
nvmlNames, aliases}``, each added, or replacing the built-in model with the same key. A file that
cannot be used stops the plugin with an error naming the file (and the entry and field), rather
than letting it advertise TFLOPS the operator did not intend.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from vgpu.catalog import Catalog, builtin, parse_overrides
from vgpu.errors import DomainError


class CatalogFileError(ValueError):
    """The ``--gpu-catalog`` file cannot be read or is not a valid list of models; names the file."""


def load(path: Path | None) -> Catalog:
    """The built-in catalog, with the models in ``path`` (when given) added or overriding."""
    if path is None:
        return builtin()
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise CatalogFileError(f"{path}: not valid YAML or JSON ({exc})") from None
    if not isinstance(entries, list):
        raise CatalogFileError(
            f"{path}: must be a list of models {{key, tflops, memoryMiB, nvmlNames, aliases}}, "
            f"not {type(entries).__name__}"
        )
    try:
        return builtin().with_overrides(parse_overrides(entries, source=str(path)))
    except DomainError as exc:
        raise CatalogFileError(str(exc)) from None
