"""Stopping one GPU process of a container, and only that one: the seam the VRAM guard acts through.

NVML names a process by PID, and a PID can be reused between the driver's list and the signal. So the
process is pinned first (``pidfd_open``), its owner read again from ``/proc/<pid>/cgroup`` through the same
:class:`~device_plugin.usage.process_owner.ProcessResolver` the usage pass used, and the signal sent through
the pidfd only when the owner is still the one judged: a reused PID names another process, and the pidfd
then holds that one, whose owner does not match. The fake GPU file's scripted processes are stopped by the
fake probe behind the same :class:`ProcessKiller` (they leave its reports).
"""

from __future__ import annotations

import os
import signal
from typing import Protocol

from device_plugin.usage.process_owner import ProcessOwner, ProcessResolver


class KillRefused(RuntimeError):
    """The process could not be signalled (no ``CAP_KILL``, another owner by now); the message says why."""


class ProcessKiller(Protocol):
    def kill(self, pid: int, owner: ProcessOwner) -> bool:
        """Sends SIGKILL to ``pid`` if it still belongs to ``owner``: True when sent, False when the process
        has exited; :class:`KillRefused` otherwise. May block."""
        ...


class PidfdKiller:
    """A :class:`ProcessKiller` for the host's processes (the plugin runs with ``hostPID``)."""

    def __init__(self, resolver: ProcessResolver) -> None:
        self._resolver = resolver

    def kill(self, pid: int, owner: ProcessOwner) -> bool:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError as exc:
            raise KillRefused(f"cannot pin process {pid}: {exc.strerror}") from None
        try:
            now = self._resolver.owner(pid)
            if now is None:
                return False
            if now != owner:
                raise KillRefused(f"process {pid} belongs to another container by now (PID reused)")
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            raise KillRefused(
                f"not permitted to signal process {pid}: the device plugin needs the KILL capability"
            ) from None
        except OSError as exc:
            raise KillRefused(f"cannot signal process {pid}: {exc.strerror}") from None
        finally:
            os.close(pidfd)
