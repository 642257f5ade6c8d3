"""The plugin's answer as CDI devices: the spec files it writes, the Allocate answer naming them, and cleanup.

The kubelet puts a container's own environment after the plugin's ``envs``; a runtime applies a CDI device's
``containerEdits`` after both, so the spec file is what makes the grant the last word (docs/security.md).
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from device_plugin.enforcement import cdi
from device_plugin.enforcement.cdi import CdiSpecs
from device_plugin.enforcement.envs import EnforcementPaths, LiveMount, Target, build
from device_plugin.gpus.slices import slice_id
from device_plugin.metrics import PluginMetrics
from tests.device_plugin.fakes import GIB, GPU0, GPU1, FakeKube, allocation, gpu_file, grant, make_pod, uid_of
from tests.device_plugin.harness import plugin, run, until
from vgpu.contract.allocation import decode
from vgpu.names import PLUGIN_ENV_NAMES, PLUGIN_ENV_PREFIXES, EnforcementBackend, Env, SystemAnnotation

UID = "0c5e0a6e-1f6b-4d7a-9b1e-5f3c2d1a0b9e"  # a pod UID may start with a digit: CDI 0.5.0 allows it
TARGET = Target(namespace="team-a", pod="p", container="main")
HANDOFF = SystemAnnotation.HANDOFF.value
ALLOC = SystemAnnotation.ALLOCATION.value


def spec_path(root: Path, uid: str, container: str = "main") -> Path:
    return root / f"tensor-fusion.ai-vgpu_{uid}_{container}.json"


def env_of(path: Path) -> dict[str, str]:
    """The device's env edits as a map (a protobuf map, the answer's envs, has no order)."""
    return dict(e.split("=", 1) for e in edits(path)["env"])  # type: ignore[attr-defined]


def edits(path: Path) -> dict[str, object]:
    doc = json.loads(path.read_text())
    (device,) = doc["devices"]
    assert device["name"] == path.name.removeprefix("tensor-fusion.ai-vgpu_").removesuffix(".json")
    result: dict[str, object] = device["containerEdits"]
    return result


def test_the_spec_written_for_an_allocation_carries_every_variable_and_mount_of_the_answer(tmp_path: Path) -> None:
    alloc = decode(allocation(UID, gpus=[grant(GPU0, tflops=1000, vram=GIB)]))
    live = LiveMount(f"/var/lib/tensor-fusion/limits/{UID}/main")
    answer = build(alloc, TARGET, EnforcementBackend.HAMI_CORE, EnforcementPaths(), live)
    name = CdiSpecs(tmp_path, PluginMetrics()).write(UID, "main", answer)
    assert name == f"tensor-fusion.ai/vgpu={UID}_main"
    path = spec_path(tmp_path, UID)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # nothing staged left behind
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    per_gpu = f'{{"{GPU0}":%s}}'
    ro, rw = ["ro", "nosuid", "nodev", "bind"], ["rw", "nosuid", "nodev", "bind"]
    assert json.loads(path.read_text()) == {
        "cdiVersion": "0.5.0",
        "kind": "tensor-fusion.ai/vgpu",
        "devices": [
            {
                "name": f"{UID}_main",
                "containerEdits": {
                    "env": [
                        f"NVIDIA_VISIBLE_DEVICES={GPU0}",
                        "TENSOR_FUSION_CUDA_MEM_LIMIT=" + per_gpu % 1073741824,
                        "TENSOR_FUSION_CUDA_UP_LIMIT=" + per_gpu % 1,
                        "TENSOR_FUSION_CUDA_UP_LIMIT_TFLOPS=" + per_gpu % 1,
                        "TENSOR_FUSION_POD_NAME=p",
                        "TENSOR_FUSION_POD_NAMESPACE=team-a",
                        "TENSOR_FUSION_CONTAINER_NAME=main",
                        "TENSOR_FUSION_POOL_NAME=default-pool",
                        "CUDA_DEVICE_MEMORY_LIMIT_0=1024m",
                        "CUDA_DEVICE_SM_LIMIT_0=1",
                        "CUDA_DEVICE_SM_LIMIT=1",
                        "GPU_CORE_UTILIZATION_POLICY=FORCE",
                        "TENSOR_FUSION_LIVE_LIMITS=/run/tensor-fusion/limits/limits.json",
                        "CUDA_DEVICE_MEMORY_SHARED_CACHE=/run/tensor-fusion/limits/hami.cache",
                    ],
                    "mounts": [
                        {"hostPath": "/usr/local/vgpu/libvgpu.so", "containerPath": "/usr/local/vgpu/libvgpu.so",
                         "options": ro},
                        {"hostPath": "/usr/local/vgpu/ld.so.preload", "containerPath": "/etc/ld.so.preload",
                         "options": ro},
                        {"hostPath": live.host_dir, "containerPath": "/run/tensor-fusion/limits", "options": rw},
                    ],
                },
            }
        ],
    }  # fmt: skip
    # The same variables as the answer's envs, in its order: CDI replaces each same-named one after the
    # container's own environment.
    assert edits(path)["env"] == [f"{k}={v}" for k, v in answer.envs.items()]


def test_a_container_answered_again_rewrites_its_own_file_and_a_planted_link_is_replaced_not_followed(
    tmp_path: Path,
) -> None:
    specs = CdiSpecs(tmp_path / "cdi", PluginMetrics())
    first = build(decode(allocation(UID)), TARGET, EnforcementBackend.MPS, EnforcementPaths())
    specs.write(UID, "main", first)
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    path = spec_path(tmp_path / "cdi", UID)
    path.unlink()
    path.symlink_to(victim)
    raised = decode(allocation(UID, gpus=[grant(GPU0, vram=8 * GIB)]))
    specs.write(UID, "main", build(raised, TARGET, EnforcementBackend.MPS, EnforcementPaths()))
    assert victim.read_text() == "untouched"
    assert stat.S_ISREG(os.lstat(path).st_mode)
    assert f"{Env.MPS_PINNED_MEM_LIMIT}=0=8192M" in edits(path)["env"]  # type: ignore[operator]
    assert len(list((tmp_path / "cdi").iterdir())) == 1


@pytest.mark.parametrize(
    ("uid", "container"), [("", "main"), (UID, ""), ("a_b", "main"), (UID, "main/x"), (UID, "main-"), (UID, "é")]
)
def test_a_pair_cdi_cannot_name_is_refused(uid: str, container: str) -> None:
    with pytest.raises(ValueError, match="make no CDI device name"):
        cdi.device_name(uid, container)


def test_every_variable_the_plugin_sets_is_in_the_one_list_admission_reserves() -> None:
    # vgpu/names.py lists them once: the webhook removes a container's own copy of each, and nothing else.
    alloc = decode(allocation(UID, gpus=[grant(GPU0), grant(GPU1, index=1)]))
    names = {
        name
        for backend in EnforcementBackend
        for live in (None, LiveMount("/x"))
        for name in build(alloc, TARGET, backend, EnforcementPaths(), live).envs
    }
    exact = {n for n in names if not n.startswith(PLUGIN_ENV_PREFIXES)}
    assert exact == PLUGIN_ENV_NAMES
    assert names - exact == {"CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_MEMORY_LIMIT_1", "CUDA_DEVICE_SM_LIMIT_0",
                             "CUDA_DEVICE_SM_LIMIT_1"}  # fmt: skip


def test_files_of_pods_gone_go_after_the_grace_and_nothing_else_is_touched(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path, PluginMetrics(), grace_s=30.0)
    answer = build(decode(allocation(UID)), TARGET, EnforcementBackend.NONE, EnforcementPaths())
    for uid, container in ((UID, "main"), (UID, "side"), ("other", "main")):
        specs.write(uid, container, answer)
    staged = tmp_path / f".tensor-fusion.ai-vgpu_{UID}_main.json.x1y2.tmp"  # left by a crash mid-write
    vendor = tmp_path / "nvidia.yaml"
    for path in (staged, vendor):
        path.write_text("x")
    assert specs.sweep(frozenset({"other"})) == [], "just written: the watch may not show its pod yet"
    old = time.time() - 60
    for path in tmp_path.iterdir():
        os.utime(path, (old, old))
    assert sorted(specs.sweep(frozenset({"other"}))) == sorted(
        [staged.name, spec_path(tmp_path, UID).name, spec_path(tmp_path, UID, "side").name]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([vendor.name, spec_path(tmp_path, "other").name])
    assert cdi.owner(vendor.name) is None and cdi.owner(f"tensor-fusion.ai-vgpu_{UID}_main.yaml") is None


# --- through the plugin -------------------------------------------------------------------------


def test_the_allocate_answer_names_its_cdi_device_whose_file_holds_the_same_answer_until_the_pod_goes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cdi"
    pod = make_pod("p", alloc=allocation("pending"))
    uid = uid_of(pod)
    pod["metadata"]["annotations"][ALLOC] = allocation(uid, gpus=[grant(GPU0, tflops=1000, vram=GIB)])
    kube = FakeKube([pod])
    path = spec_path(root, uid)

    async def scenario() -> None:
        overrides: dict[str, Any] = {"backend": EnforcementBackend.HAMI_CORE, "cdi_dir": str(root)}
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), cdi_grace_s=0, **overrides) as (
            _daemon,
            kubelet,
        ):
            answer = (await kubelet.allocate(slice_id(GPU0, 0), pod="p")).container_responses[0]
            assert [d.name for d in answer.cdi_devices] == [f"tensor-fusion.ai/vgpu={uid}_main"]
            # The envs stay in the answer (a runtime without CDI), and the device carries exactly them.
            assert dict(answer.envs)[f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0"] == "1024m"
            assert env_of(path) == dict(answer.envs)
            mounts = [(m["containerPath"], m["hostPath"], "ro" in m["options"]) for m in edits(path)["mounts"]]  # type: ignore[attr-defined]
            assert mounts == [(m.container_path, m.host_path, m.read_only) for m in answer.mounts]

            # A node reboot empties /var/run: the kubelet replays the answer's CDI name without a new
            # Allocate, so the plugin writes the missing file again from the pod's allocation.
            await until(lambda: kube.annotation(uid, HANDOFF) is not None)
            path.unlink()
            kube.annotate(uid, "touch", "1")  # any change of the pod wakes the pass
            await until(path.exists)
            assert env_of(path) == dict(answer.envs)

            kube.delete(uid)
            await until(lambda: not path.exists())

    run(scenario())


def test_an_answer_whose_cdi_spec_cannot_be_written_is_refused(tmp_path: Path) -> None:
    # Without its CDI device, the container's own environment would override its grant.
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    pod = make_pod("p", alloc=allocation("pending"))
    pod["metadata"]["annotations"][ALLOC] = allocation(uid_of(pod))
    kube = FakeKube([pod])

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), cdi_dir=str(blocked / "cdi")) as (
            daemon,
            kubelet,
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.allocate(slice_id(GPU0, 0), pod="p")
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"cannot write the CDI spec of pod default/p container main in {blocked / 'cdi'}" in (
                err.value.details() or ""
            )
            errors = daemon.metrics.registry.get_sample_value("tf_device_plugin_errors_total", {"where": "cdi"})
            assert errors is not None and errors >= 1  # the Allocate, and the sweep of a directory that is none

    run(scenario())
