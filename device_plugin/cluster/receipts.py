"""The node-local record of hand-off receipts: which device IDs each of this node's pods got, kept on disk.

The receipt once lived on the pod (annotation ``handoff``), a pod write per GPU pod that only this plugin
reads back: the extender's gate opens on the kubelet's own status write (scheduler_extender/HANDOFF.md,
"Release"). With ``--receipts-file`` the plugin keeps them here instead: one JSON object (pod UID ->
the encoded :class:`~vgpu.contract.allocation.Handoff`) in a host directory that survives the plugin's
restarts and the node's reboots (after a reboot the kubelet allocates every pod again, and the lookup
finds each one by its receipt). Written whole to a temporary file and renamed over the old one, so a
crash leaves the old record or the new one, never half of either.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)


class ReceiptFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, str]:
        """The receipts on record; none when the file is missing or unreadable (said in the log: the
        reconcile loop writes a missing receipt again from the kubelet's PodResources)."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("hand-off receipts in %s are unreadable (%s); starting from none", self.path, exc)
            return {}
        if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
            log.warning("hand-off receipts in %s are not a map of pod UIDs to receipts; starting from none", self.path)
            return {}
        return raw

    def save(self, receipts: Mapping[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        partial.write_text(json.dumps(dict(sorted(receipts.items())), separators=(",", ":")), encoding="utf-8")
        os.replace(partial, self.path)
