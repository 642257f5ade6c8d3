"""The GPU catalog a binary runs with: the built-in models plus the operator's ``--gpu-catalog`` file.

The one module of the shared domain that does I/O (the import contract names it): the device
plugin, the extender and ``tfctl`` must read the same file the same way, or a model the operator
added would be published by the node under a name the extender cannot match. :mod:`vgpu.catalog`
stays pure and only parses entries. The file is a YAML or JSON list of entries ``{key, tflops,
memoryMiB, nvmlNames, aliases}``, each added, or replacing the built-in model with the same key. A
file that cannot be used stops the binary with an error naming the file (and the entry and field),
rather than letting it run with TFLOPS or names the operator did not intend.
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
