#!/usr/bin/env python3
"""A stand-in for NVIDIA's ``nvidia-cuda-mps-control``, for tests of the plugin's MPS supervisor (no GPU).

It models what the supervisor relies on. ``-d`` forks the daemon and returns at once; the daemon leaves
its session, writes its PID to ``nvidia-cuda-mps-control.pid`` in ``$CUDA_MPS_PIPE_DIRECTORY`` and listens
on a socket there; a second ``-d`` while it runs fails ("already running"). Without arguments it is the
control client: each line of its standard input is one command sent to the daemon (none running: it fails);
``quit`` makes the daemon remove its PID file and exit. Every start (with the environment it got) and every
command the daemon receives is recorded, one JSON object a line, in ``fake-mps-control.jsonl`` in
``$CUDA_MPS_LOG_DIRECTORY``. A file ``fake-fail-start`` in the pipe directory makes ``-d`` fail with its text;
``get_server_list`` answers the PIDs in the file ``fake-servers`` there (none without it).
Standard library only: the e2e tier runs it on its kubelet node as ``--mps-control``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

PIPE = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
LOG = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
PID_FILE = PIPE / "nvidia-cuda-mps-control.pid"
SOCKET = PIPE / "control"
RECORD = LOG / "fake-mps-control.jsonl"
FAIL = PIPE / "fake-fail-start"
SERVERS = PIPE / "fake-servers"
SEEN_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


def record(**entry: object) -> None:
    with RECORD.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")


def running() -> int | None:
    try:
        pid = int(PID_FILE.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def serve(listener: socket.socket) -> None:
    """The daemon: answer commands until ``quit``."""
    while True:
        connection, _ = listener.accept()
        with connection:
            command = connection.makefile("r", encoding="utf-8").readline().strip()
            record(event="command", command=command)
            servers = SERVERS.read_text().split() if command == "get_server_list" and SERVERS.exists() else []
            connection.sendall(" ".join(servers).encode() + b"\n")
            if command == "quit":
                PID_FILE.unlink(missing_ok=True)
                SOCKET.unlink(missing_ok=True)
                record(event="quit")
                return


def start() -> int:
    if FAIL.exists():
        print(FAIL.read_text().strip() or "cannot start", file=sys.stderr)
        return 1
    if running() is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    SOCKET.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(SOCKET))
    listener.listen(8)
    if os.fork() != 0:  # the parent returns at once, as the real -d does
        return 0
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    record(event="start", env={k: os.environ.get(k) for k in SEEN_ENV})
    PID_FILE.write_text(f"{os.getpid()}\n")
    serve(listener)
    os._exit(0)


def control() -> int:
    for line in sys.stdin:
        command = line.strip()
        if not command:
            continue
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.connect(str(SOCKET))
                connection.sendall(f"{command}\n".encode())
                sys.stdout.write(connection.makefile("r", encoding="utf-8").readline())
        except OSError:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(start() if sys.argv[1:] == ["-d"] else control())
