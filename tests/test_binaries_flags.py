"""Every binary answers --version, and its --help shows plain defaults (no enum reprs, no reST markup)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib.metadata import version

import pytest

from device_plugin.main import parser as plugin_parser
from scheduler_extender.cli import parser as tfctl_parser
from scheduler_extender.main import parser as extender_parser
from scheduler_extender.webhook.main import parse_args as webhook_args
from vgpu.names import DISTRIBUTION


def _webhook(argv: list[str]) -> object:
    return webhook_args(argv)


@pytest.mark.parametrize(
    ("prog", "run"),
    [
        ("tf-extender", lambda argv: extender_parser().parse_args(argv)),
        ("tf-webhook", _webhook),
        ("tf-device-plugin", lambda argv: plugin_parser().parse_args(argv)),
        ("tfctl", lambda argv: tfctl_parser().parse_args(argv)),
    ],
)
def test_version(prog: str, run: Callable[[list[str]], object], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        run(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"{prog} {version(DISTRIBUTION)}\n"


@pytest.mark.parametrize("make", [extender_parser, plugin_parser, tfctl_parser])
def test_help_is_plain_text(make: Callable[[], argparse.ArgumentParser]) -> None:
    text = make().format_help()
    assert "<" + "PlacementPolicy" not in text and "``" not in text and ":class:" not in text
    if make is extender_parser:
        assert "(default: binpack)" in " ".join(text.split())
