"""A tenant cannot lift its own limits through the live-limits directory, on the real kubelet node (issue "A tenant
cannot lift its own limits", part 3; docs/security.md, "Tampering with live limits").

A GPU pod runs on the kubelet node (the cluster's device plugin uses the hami-core backend and this cluster's own
``--live-limits-dir``); its container's directory is found on the host as docs/live-limits.md says, at
``<live-limits-dir>/<pod UID>/main``, the directory the fake runtime was asked to mount at
/run/tensor-fusion/limits. The container's first CUDA call is played as HAMi-core makes it (one byte past the
struct, then the header and the limits from the container's environment through a shared mapping). Then the
files are tampered with as the container could, on the host path it sees, and the time until the plugin puts
each back is measured (printed with ``-s``; docs/live-limits.md, "Tampering", has the figures):

* the region through a mapping held open, as the container's CUDA processes hold HAMi-core's (raises no change
  notification: the periodic pass, 5 s by default, finds it): ``limit[0]`` lifted; lifted with the initialised
  flag cleared; lifted with the layout version set to 1.1;
* the same through a fresh mapping then closed, ``limit[0]`` lifted with ``write(2)``, and ``limits.json``
  replaced with other limits or with garbage (each raises a notification: well under a second);
* the region truncated: not restorable, reset to an empty file, and reported by Warning Events on the pod and on
  the node naming it, and in ``tf_device_plugin_errors_total{where="live_limits_tamper"}``.
"""

from __future__ import annotations

import mmap
import os
import random
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes.client import CoreV1Api

from device_plugin.enforcement.hami_region import LIMIT_OFFSET, MAGIC, REGION_SIZE, SM_LIMIT_OFFSET
from vgpu.names import HAMI_REGION_FILE, LIVE_LIMITS_DIR, LIVE_LIMITS_FILE, Annotation, Env

from .cluster import REAL_NODE, Cluster
from .kube import emptied, eventually, wait_running
from .pods import created_env, gpu_pod, rewrite_as_tenant

NAMESPACE = "e2e-live-limits-tamper"
SHARE = {
    Annotation.TFLOPS_REQUEST: "10",
    Annotation.TFLOPS_LIMIT: "20",
    Annotation.VRAM_REQUEST: "1Gi",
    Annotation.VRAM_LIMIT: "2Gi",
}
PASS_S = 5.0  # the plugin's --live-limits-interval (its default; the cluster does not set it)
# The bounds asserted (docs/live-limits.md): a mapped write waits for the next pass (at most PASS_S) and the pass
# itself; a notified one only for the pass the notification starts. Slack for a loaded machine.
MAPPED_BOUND_S = PASS_S + 2.0
NOTIFIED_BOUND_S = 1.0
ROUNDS = 3
LIFTED = 64 << 30


def mapped_store(path: Path, writes: list[tuple[int, str, int]]) -> None:
    """Stores through a fresh shared mapping, then unmapped and closed: the close of a file opened for writing
    raises a change notification (IN_CLOSE_WRITE), the stores themselves none."""
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, REGION_SIZE, mmap.MAP_SHARED) as mapped:
            for offset, fmt, value in writes:
                struct.pack_into(fmt, mapped, offset, value)
    finally:
        os.close(fd)


class Held:
    """The region mapped once and kept, as every CUDA process of the container keeps HAMi-core's mapping: stores
    through it raise no change notification at all, only the periodic pass finds them."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR)
        self._mapped = mmap.mmap(self._fd, REGION_SIZE, mmap.MAP_SHARED)

    def store(self, writes: list[tuple[int, str, int]]) -> None:
        for offset, fmt, value in writes:
            struct.pack_into(fmt, self._mapped, offset, value)

    def close(self) -> None:
        self._mapped.close()
        os.close(self._fd)


def header_and_slot(path: Path) -> tuple[int, int, int, int, int]:
    with path.open("rb") as f:
        flag, major, minor = struct.unpack("=iII", f.read(12))
        f.seek(LIMIT_OFFSET)
        (limit,) = struct.unpack("=Q", f.read(8))
        f.seek(SM_LIMIT_OFFSET)
        (sm,) = struct.unpack("=Q", f.read(8))
    return flag, major, minor, limit, sm


def first_cuda_call(path: Path, env: dict[str, str]) -> tuple[int, int, int, int, int]:
    """HAMi-core's try_create_shrreg on the file the plugin prepared: one byte past the struct, then (under its
    lock) the version, limit[0] and sm_limit[0] from the container's environment, the initialised flag last."""
    limit = int(env[f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0"].rstrip("m")) << 20
    sm = int(env[f"{Env.HAMI_SM_LIMIT}_0"])
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"\0", REGION_SIZE)
    finally:
        os.close(fd)
    mapped_store(path, [(4, "=I", 1), (8, "=I", 2), (LIMIT_OFFSET, "=Q", limit), (SM_LIMIT_OFFSET, "=Q", sm)])
    mapped_store(path, [(0, "=i", MAGIC)])
    return MAGIC, 1, 2, limit, sm


def restored_after(what: str, tamper: Callable[[], None], done: Callable[[], bool], bound: float) -> float:
    """Seconds from ``tamper()`` until ``done()``, polled every 5 ms; fails past ``bound``."""
    tamper()
    began = time.monotonic()
    while not done():
        waited = time.monotonic() - began
        assert waited < bound, f"{what}: not restored after {waited:.2f}s (bound {bound}s)"
        time.sleep(0.005)
    return time.monotonic() - began


def events(core: CoreV1Api, namespace: str, kind: str, name: str, reason: str) -> list[Any]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name},reason={reason}"
    return list(core.list_namespaced_event(namespace, field_selector=selector).items)


def test_each_tampering_of_a_containers_live_limits_is_put_back_within_its_bound(
    cluster: Cluster, core: CoreV1Api
) -> None:
    assert cluster.node is not None
    ns = cluster.namespace(NAMESPACE)
    try:
        core.create_namespaced_pod(ns, gpu_pod("tenant", SHARE))
        pod = wait_running(core, ns, "tenant")
        uid = pod.metadata.uid
        home = cluster.live_limits_dir / uid / "main"
        (record,) = [r for r in cluster.node.creates() if r["podUid"] == uid and r["container"] == "main"]
        assert {"containerPath": LIVE_LIMITS_DIR, "hostPath": str(home), "readOnly": False} in record["mounts"]
        region, document = home / HAMI_REGION_FILE, home / LIVE_LIMITS_FILE
        kept = document.read_text()
        assert region.stat().st_size == 0  # prepared at Allocate, for HAMi-core to fill

        env = created_env(cluster.node, pod, "main")
        ours = first_cuda_call(region, env)
        assert ours == (MAGIC, 1, 2, 2 << 30, 7)  # 2 GiB, ceil(20 / 312 × 100) %
        time.sleep(PASS_S + 1)  # a full pass has seen it initialised, whatever the notification's pass saw
        assert header_and_slot(region) == ours

        def region_back() -> bool:
            return header_and_slot(region) == ours

        windows: dict[str, list[float]] = {}
        vectors = {
            "limit[0]": [(LIMIT_OFFSET, "=Q", LIFTED)],
            "limit[0] + flag cleared": [(LIMIT_OFFSET, "=Q", LIFTED), (0, "=i", 0)],
            "limit[0] + version 1.1": [(LIMIT_OFFSET, "=Q", LIFTED), (8, "=I", 1)],
        }
        held = Held(region)
        try:
            pace = random.Random(7)
            for what, writes in vectors.items():
                for _ in range(ROUNDS):
                    time.sleep(pace.uniform(0, PASS_S))  # anywhere in the pass's period
                    windows.setdefault(f"region {what}, held mapping", []).append(
                        restored_after(what, lambda w=writes: held.store(w), region_back, MAPPED_BOUND_S)
                    )
        finally:
            held.close()

        def written_limit() -> None:
            fd = os.open(region, os.O_WRONLY)
            try:
                os.pwrite(fd, struct.pack("=Q", LIFTED), LIMIT_OFFSET)
            finally:
                os.close(fd)

        def replace_document(text: str) -> Callable[[], None]:
            return lambda: rewrite_as_tenant(document, text)

        other = kept.replace(f'"vramLimitBytes": {2 << 30}', f'"vramLimitBytes": {LIFTED}')
        assert other != kept
        notified = {
            **{
                f"region {what}, fresh mapping": (lambda w=writes: mapped_store(region, w), region_back)
                for what, writes in vectors.items()
            },
            "region limit[0], write(2)": (written_limit, region_back),
            "limits.json replaced, other limits": (replace_document(other), lambda: document.read_text() == kept),
            "limits.json replaced, garbage": (replace_document("{not json"), lambda: document.read_text() == kept),
        }
        for what, (tamper, done) in notified.items():
            for _ in range(ROUNDS):
                windows.setdefault(what, []).append(restored_after(what, tamper, done, NOTIFIED_BOUND_S))
        # Truncated: what the container's processes map is gone. Reset to an empty file, reported, counted.
        before = cluster.tamper_count()
        windows["region truncated (reset to empty)"] = [
            restored_after(
                "truncated", lambda: os.truncate(region, 4096), lambda: region.stat().st_size == 0, NOTIFIED_BOUND_S
            )
        ]
        print("\nlive-limits tampering, seconds until restored (min / max of each):")
        for what, seconds in windows.items():
            print(f"  {what:48s} {min(seconds):6.3f} / {max(seconds):6.3f}   {[round(s, 3) for s in seconds]}")
        pod_reset = eventually(
            "a LiveLimitsReset Event on the pod", lambda: events(core, ns, "Pod", "tenant", "LiveLimitsReset"), 10
        )
        assert pod_reset[0].type == "Warning" and "truncated to 4096 bytes" in pod_reset[0].message
        node_reset = eventually(
            "a LiveLimitsReset Event on the node naming the pod",
            lambda: [
                e
                for e in events(core, "default", "Node", REAL_NODE, "LiveLimitsReset")
                if f"pod {ns}/tenant (uid {uid})" in e.message
            ],
            10,
        )
        assert node_reset[0].type == "Warning"
        restored = events(core, ns, "Pod", "tenant", "LiveLimitsRestored")
        assert {e.type for e in restored} == {"Warning"} and len(restored) >= 3  # slots, flag, version, limits...
        assert cluster.tamper_count() >= before + 1
        assert document.read_text() == kept
        # The container's next CUDA process initialises it again; the plugin keeps it from then on.
        assert first_cuda_call(region, env) == ours
    finally:
        emptied(core, ns)
