"""How every binary takes its settings: ``--flag`` or ``TF_<BINARY>_<FLAG>``, both listed in ``--help``.

The extender, the webhook and the device plugin each describe their settings as one pydantic-settings
model (its fields are the knobs, its ``env_prefix`` names the variables). This module turns such a model
into the binary's command line, so all three read flags and environment the same way and document them
the same way: one ``--kebab-name`` flag per field, whose help gives the field's description, its
variable and its default; the environment is read first and a flag overrides it. A value that fails
validation, from either source, stops the binary with status 2 and one line naming the flag, the
variable, the value and what is accepted, never a traceback. List and dict fields are JSON in both.
A setting a model no longer has (its ``REMOVED``: name → what replaced it) is refused the same way when its
variable is still set, rather than ignored: an unknown flag argparse refuses anyway.

The one module of the shared domain that imports pydantic (the import contract names it): the three
binaries live in two packages that must not import each other.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from enum import Enum
from importlib.metadata import version
from typing import Any, Literal, NoReturn, TypeVar, get_args, get_origin

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, EnvSettingsSource

from vgpu.errors import FieldError
from vgpu.names import DISTRIBUTION

S = TypeVar("S", bound=BaseSettings)


def settings_from(model: type[S], prog: str, description: str, argv: Sequence[str] | None = None) -> S:
    """``model`` read from its environment variables, overridden by the flags in ``argv``.

    ``--help`` and ``--version`` print and exit 0; a bad flag or variable exits 2 with one line.
    """
    parser = _parser(model, prog, description)
    flags = {name: value for name, value in vars(parser.parse_args(argv)).items() if value is not None}
    removed: dict[str, str] = getattr(model, "REMOVED", {})
    stale = [
        (name, os.environ[_variable(model, name)], why)
        for name, why in removed.items()
        if _variable(model, name) in os.environ
    ]
    if stale:
        _refuse(parser, model, stale)
    env = EnvSettingsSource(model)
    given: dict[str, Any] = {}  # what each field was set to, the variable's value replaced by the flag's
    for name, info in model.model_fields.items():
        value = flags[name] if name in flags else env.get_field_value(info, name)[0]
        if value is not None:
            given[name] = value
    values = dict(given)
    for name, text in given.items():
        if env.field_is_complex(model.model_fields[name]):
            try:
                values[name] = json.loads(text)
            except ValueError as exc:
                _refuse(parser, model, [(name, text, f"not JSON ({exc})")])
    try:
        return model(**values)
    except ValidationError as exc:
        _refuse(parser, model, [_problem(error, given) for error in exc.errors(include_url=False)])


def _parser(model: type[BaseSettings], prog: str, description: str) -> argparse.ArgumentParser:
    """A flag per field of ``model``, none with a default of its own: a flag not given leaves the field to
    its variable, then to the model's default."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=f"{description} Every flag can also be set as the environment variable its help names; "
        "a flag overrides the variable.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version(DISTRIBUTION)}")
    for name, info in model.model_fields.items():
        kind: dict[str, Any] = (
            {"action": argparse.BooleanOptionalAction} if info.annotation is bool else {"metavar": _metavar(name, info)}
        )
        about = f"{info.description} (env {_variable(model, name)}, default: {_shown(info)})"
        parser.add_argument(_flag(name), dest=name, default=None, help=about.replace("%", "%%"), **kind)
    return parser


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _variable(model: type[BaseSettings], name: str) -> str:
    return (str(model.model_config.get("env_prefix", "")) + name).upper()


def _metavar(name: str, info: FieldInfo) -> str:
    """The values a field accepts, where they are few; JSON for a list or dict; else its name."""
    kind = info.annotation
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "{" + ",".join(str(member.value) for member in kind) + "}"
    if get_origin(kind) is Literal:
        return "{" + ",".join(map(str, get_args(kind))) + "}"
    if get_origin(kind) in (list, dict):
        return "JSON"
    return name.upper()


def _shown(info: FieldInfo) -> str:
    """The default as an operator would type it: an enum's value, JSON for a list or dict, none for None."""
    value = info.get_default(call_default_factory=True, validated_data={})
    if isinstance(value, Enum):
        return str(value.value)
    if value is None:
        return "none"
    if isinstance(value, list | dict | bool) or value == "":
        return json.dumps(value)
    return str(value)


def _problem(error: ErrorDetails, given: dict[str, Any]) -> tuple[str | None, str | None, str]:
    """(field, value as given, what is wrong) of one validation error; no field for a model-wide one."""
    ctx = error.get("ctx", {})
    problem = str(ctx["error"]) if error["type"] == "value_error" else error["msg"]
    if not error["loc"]:
        return None, None, problem
    name, *inside = error["loc"]
    if inside:
        problem = "".join(f"[{part}]" for part in inside) + ": " + problem
    value = given.get(str(name))
    return str(name), None if value is None else str(value), problem


def _refuse(
    parser: argparse.ArgumentParser, model: type[BaseSettings], problems: Sequence[tuple[str | None, str | None, str]]
) -> NoReturn:
    lines = [
        problem if name is None else str(FieldError(f"{_flag(name)} (env {_variable(model, name)})", value, problem))
        for name, value, problem in problems
    ]
    parser.exit(2, f"{parser.prog}: error: {'; '.join(lines)}\n")
