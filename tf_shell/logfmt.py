"""One JSON log line per record, the same in every binary, for log pipelines (``--log-format json``).

Operators search scheduling logs by pod, node and GPU; a text line buries them in prose. Every
binary logs through :class:`JsonFormatter` when asked: time, level, logger and message, plus the
scheduling fields a call passes as ``extra`` (:data:`FIELDS`), each under its own key. Pure: a log
record in, a string out; the binaries attach it to their handler.
"""

from __future__ import annotations

import json
import logging
from enum import StrEnum
from typing import Final, Literal

# Keys a log call may pass in ``extra=`` to be searchable: pod (namespace/name), node, gpus (UUIDs),
# container, devices (the kubelet's device IDs).
FIELDS: Final = ("pod", "node", "gpus", "container", "devices")


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


# The levels every binary's --log-level accepts.
LogLevel = Literal["debug", "info", "warning", "error"]


TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "msg", <FIELDS given>, "exc"?}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple | list | set | frozenset) else value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def formatter(kind: LogFormat) -> logging.Formatter:
    return JsonFormatter() if kind is LogFormat.JSON else logging.Formatter(TEXT_FORMAT)
