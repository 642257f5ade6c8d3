"""--log-format json and the GpuGranted event: what a bind tells log pipelines and the user about a grant."""

from __future__ import annotations

import json
import logging
import sys

from tf_shell.logfmt import JsonFormatter, LogFormat, formatter


def record(msg: str, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    rec = logging.LogRecord("tf.test", logging.WARNING, __file__, 1, msg, args, info)
    rec.__dict__.update(extra)
    return rec


def test_a_record_is_one_json_object_with_its_scheduling_fields() -> None:
    line = JsonFormatter().format(record("bound %s", "ns/p", pod="ns/p", node="n1", gpus=("GPU-a",), other="x"))
    assert "\n" not in line
    doc = json.loads(line)
    assert {k: doc[k] for k in ("level", "logger", "msg", "pod", "node", "gpus")} == {
        "level": "warning", "logger": "tf.test", "msg": "bound ns/p", "pod": "ns/p", "node": "n1", "gpus": ["GPU-a"],
    }  # fmt: skip
    assert "other" not in doc and doc["time"][:2] == "20"
    assert "ValueError: boom" in json.loads(JsonFormatter().format(record("failed", exc=True)))["exc"]
    assert isinstance(formatter(LogFormat.TEXT), logging.Formatter)
    assert not isinstance(formatter(LogFormat.TEXT), JsonFormatter)
