"""How containers get their GPUs, and the node's NVIDIA toolkit check: the decision table, the files it reads,
the answers under each delivery, and what the plugin reports (Events once per problem, gauges, labels)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from device_plugin.cluster.node_events import NodeEvents
from device_plugin.enforcement.delivery import (
    REASON_UNDELIVERABLE,
    REASON_UNGUARDED,
    ToolkitConfig,
    choose,
    guard,
    parse_config,
)
from device_plugin.enforcement.envs import EnforcementPaths, MountSpec, Target, build
from device_plugin.enforcement.toolkit_check import ToolkitCheck, cdi_names, read_config
from device_plugin.gpus.slices import slice_id
from device_plugin.metrics import PluginMetrics
from tests.device_plugin.fakes import GPU0, GPU1, FakeKube, allocation, gpu_file, grant, make_pod, toolkit_gpus, uid_of
from tests.device_plugin.harness import plugin, run
from vgpu.contract.allocation import decode
from vgpu.names import (
    NVIDIA_DEVICE_MOUNT_ROOT,
    TOOLKIT_ACCEPT_ENVVAR,
    TOOLKIT_ACCEPT_MOUNTS,
    DeviceDelivery,
    EnforcementBackend,
    Env,
    EnvvarGuard,
    SystemAnnotation,
)

GUARDED = ToolkitConfig("/t.toml", accept_envvar_unprivileged=False, accept_volume_mounts=True)
GUARDED_NO_MOUNTS = ToolkitConfig("/t.toml", accept_envvar_unprivileged=False)
OPEN = ToolkitConfig("/t.toml")  # the toolkit's defaults
MISSING = ToolkitConfig("/t.toml", problem="/t.toml does not exist")
BOTH = (GPU0, GPU1)


@pytest.mark.parametrize(
    ("wanted", "config", "cdi", "delivery", "reasons"),
    [
        # automatic: volume mounts where read, else CDI where it names every GPU, else the variable
        (None, GUARDED, BOTH, DeviceDelivery.VOLUME_MOUNTS, []),
        (None, GUARDED_NO_MOUNTS, BOTH, DeviceDelivery.CDI, []),
        (None, GUARDED_NO_MOUNTS, (GPU0,), DeviceDelivery.ENVVAR, [REASON_UNDELIVERABLE]),
        (None, OPEN, (), DeviceDelivery.ENVVAR, [REASON_UNGUARDED]),
        (None, OPEN, BOTH, DeviceDelivery.CDI, [REASON_UNGUARDED]),
        (None, MISSING, (), DeviceDelivery.ENVVAR, [REASON_UNGUARDED]),
        # asked for: kept, and said when the toolkit would not honour it
        (DeviceDelivery.ENVVAR, GUARDED, (), DeviceDelivery.ENVVAR, [REASON_UNDELIVERABLE]),
        (DeviceDelivery.ENVVAR, OPEN, (), DeviceDelivery.ENVVAR, [REASON_UNGUARDED]),
        (DeviceDelivery.VOLUME_MOUNTS, GUARDED_NO_MOUNTS, (), DeviceDelivery.VOLUME_MOUNTS, [REASON_UNDELIVERABLE]),
        (
            DeviceDelivery.VOLUME_MOUNTS,
            MISSING,
            (),
            DeviceDelivery.VOLUME_MOUNTS,
            [REASON_UNGUARDED, REASON_UNDELIVERABLE],
        ),
        (DeviceDelivery.CDI, GUARDED, (GPU1,), DeviceDelivery.CDI, [REASON_UNDELIVERABLE]),
        (DeviceDelivery.CDI, GUARDED, BOTH, DeviceDelivery.CDI, []),
    ],
)
def test_delivery_and_problems(
    wanted: DeviceDelivery | None,
    config: ToolkitConfig,
    cdi: tuple[str, ...],
    delivery: DeviceDelivery,
    reasons: list[str],
) -> None:
    setup = choose(wanted, config, cdi, BOTH)
    assert setup.delivery is delivery
    assert [p.reason for p in setup.problems] == reasons
    assert setup.guard is guard(config)


def test_problem_messages_name_the_setting_to_change() -> None:
    (unguarded,) = choose(None, OPEN, (), BOTH).problems
    assert f"{TOOLKIT_ACCEPT_ENVVAR} = false" in unguarded.message and "/t.toml" in unguarded.message
    (broken,) = choose(DeviceDelivery.CDI, GUARDED, (GPU0,), BOTH).problems
    assert GPU1 in broken.message and GPU0 not in broken.message and "--device-name-strategy=uuid" in broken.message


@pytest.mark.parametrize(
    ("text", "state", "mounts"),
    [
        ("", EnvvarGuard.OFF, False),
        (f"{TOOLKIT_ACCEPT_ENVVAR} = false\n", EnvvarGuard.ON, False),
        (
            f"{TOOLKIT_ACCEPT_ENVVAR} = false\n{TOOLKIT_ACCEPT_MOUNTS} = true\n[nvidia-container-cli]\nldconfig = 'x'\n",
            EnvvarGuard.ON,
            True,
        ),
        # a key inside a table is not the top-level setting the toolkit reads
        (f"[nvidia-container-runtime]\n{TOOLKIT_ACCEPT_ENVVAR} = false\n", EnvvarGuard.OFF, False),
        (f'{TOOLKIT_ACCEPT_ENVVAR} = "false"\n', EnvvarGuard.UNKNOWN, False),
        ("this is = = not toml", EnvvarGuard.UNKNOWN, False),
    ],
)
def test_config_parsing(text: str, state: EnvvarGuard, mounts: bool) -> None:
    config = parse_config("/c.toml", text)
    assert guard(config) is state
    assert config.accept_volume_mounts is mounts
    assert (config.problem is None) is (state is not EnvvarGuard.UNKNOWN)


def test_config_files(tmp_path: Path) -> None:
    assert guard(read_config(tmp_path / "absent.toml")) is EnvvarGuard.UNKNOWN
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (1 << 20))
    assert "larger" in (read_config(big).problem or "")
    good = tmp_path / "config.toml"
    good.write_text(f"{TOOLKIT_ACCEPT_ENVVAR} = false\n")
    assert guard(read_config(good)) is EnvvarGuard.ON


def test_cdi_names_reads_nvidia_specs_only(tmp_path: Path) -> None:
    etc, run_dir = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run_dir.mkdir()
    nvidia = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": GPU0}, {"name": "all"}]}
    (etc / "nvidia.yaml").write_text(yaml.safe_dump(nvidia))
    (run_dir / "nvidia-mig.json").write_text(json.dumps({**nvidia, "devices": [{"name": GPU1}, {"bad": 1}]}))
    (run_dir / "ours.json").write_text(
        json.dumps({**nvidia, "kind": "tensor-fusion.ai/vgpu", "devices": [{"name": "x"}]})
    )
    (run_dir / "broken.yaml").write_text("{{{")
    (run_dir / "notes.txt").write_text(json.dumps(nvidia))
    assert cdi_names([etc, run_dir, tmp_path / "absent"]) == {GPU0, "all", GPU1}


def test_answers_under_each_delivery() -> None:
    alloc = decode(allocation("uid-1", gpus=[grant(GPU0), grant(GPU1, index=1)]))
    target = Target(namespace="team-a", pod="p", container="main")
    paths = EnforcementPaths()
    plain = build(alloc, target, EnforcementBackend.HAMI_CORE, paths)
    assert (plain.envs[Env.NVIDIA_VISIBLE_DEVICES], plain.cdi_devices) == (f"{GPU0},{GPU1}", ())
    mounted = build(alloc, target, EnforcementBackend.HAMI_CORE, paths, delivery=DeviceDelivery.VOLUME_MOUNTS)
    assert mounted.envs[Env.NVIDIA_VISIBLE_DEVICES] == NVIDIA_DEVICE_MOUNT_ROOT
    assert mounted.mounts[:2] == (
        MountSpec(f"{NVIDIA_DEVICE_MOUNT_ROOT}/{GPU0}", "/dev/null", True),
        MountSpec(f"{NVIDIA_DEVICE_MOUNT_ROOT}/{GPU1}", "/dev/null", True),
    )
    assert mounted.mounts[2:] == plain.mounts  # the backend's mounts are kept
    assert {k: v for k, v in mounted.envs.items() if k != Env.NVIDIA_VISIBLE_DEVICES} == {
        k: v for k, v in plain.envs.items() if k != Env.NVIDIA_VISIBLE_DEVICES
    }
    cdi = build(alloc, target, EnforcementBackend.MPS, paths, delivery=DeviceDelivery.CDI)
    assert cdi.envs[Env.NVIDIA_VISIBLE_DEVICES] == "void"  # replaces whatever the container brought
    assert cdi.cdi_devices == (f"nvidia.com/gpu={GPU0}", f"nvidia.com/gpu={GPU1}")


def test_check_reports_each_problem_once_and_follows_the_file(tmp_path: Path) -> None:
    kube, metrics = FakeKube(), PluginMetrics()
    config = tmp_path / "config.toml"
    changes: list[int] = []

    async def scenario() -> None:
        events = NodeEvents(kube, "node-a", metrics)
        check = ToolkitCheck(config, (), None, lambda: BOTH, events, metrics, on_change=lambda: changes.append(1))
        assert (await check.refresh()).guard is EnvvarGuard.UNKNOWN
        await check.refresh()  # the same problem: not posted again
        config.write_text(f"{TOOLKIT_ACCEPT_ENVVAR} = false\n{TOOLKIT_ACCEPT_MOUNTS} = true\n")
        setup = await check.refresh()
        assert (setup.guard, check.delivery()) == (EnvvarGuard.ON, DeviceDelivery.VOLUME_MOUNTS)
        config.write_text(f"{TOOLKIT_ACCEPT_ENVVAR} = true\n")  # turned off again (an operator, a GPU operator)
        await check.refresh()
        assert check.delivery() is DeviceDelivery.ENVVAR
        await events.drain()

    run(scenario())
    assert len(changes) == 2  # guard on with mounts, then off with the variable: the publisher nudged each time
    assert [(reason, warning) for _, reason, _, warning in kube.node_events] == [
        (REASON_UNGUARDED, True),
        (REASON_UNGUARDED, True),
    ]
    assert "does not exist" in kube.node_events[0][2] and "leaves" in kube.node_events[1][2]
    text = generate_latest(metrics.registry).decode()
    assert 'tf_device_plugin_envvar_guard{state="off"} 1.0' in text
    assert 'tf_device_plugin_envvar_guard{state="on"} 0.0' in text
    assert 'tf_device_plugin_device_delivery{delivery="envvar"} 1.0' in text


def guarded_without_mounts(tmp_path: Path) -> tuple[Path, Path]:
    """A toolkit configuration refusing the variable and reading no mounts, and NVIDIA's CDI spec naming both
    GPUs by UUID: (the configuration file, the spec's directory)."""
    toolkit = tmp_path / "no-mounts.toml"
    toolkit.write_text(f"{TOOLKIT_ACCEPT_ENVVAR} = false\n")
    nvidia_dir = tmp_path / "nvidia-cdi"
    nvidia_dir.mkdir()
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": GPU0}, {"name": GPU1}]}
    (nvidia_dir / "nvidia.yaml").write_text(yaml.safe_dump(spec))
    return toolkit, nvidia_dir


def test_allocate_answers_with_the_checked_delivery_and_nvidia_cdi_before_ours(tmp_path: Path) -> None:
    """Through the kubelet: NVIDIA's CDI devices for the granted GPU, then our own device, whose edits the
    runtime applies last."""
    pod = make_pod("one", alloc=allocation("", gpus=[grant(GPU1, index=1)]))
    uid = uid_of(pod)
    pod["metadata"]["annotations"][SystemAnnotation.ALLOCATION.value] = allocation(uid, gpus=[grant(GPU1, index=1)])
    kube = FakeKube([pod])
    toolkit, nvidia_dir = guarded_without_mounts(tmp_path)

    async def scenario() -> None:
        async with plugin(
            tmp_path,
            kube,
            gpu_file(tmp_path / "gpus.yaml"),
            cdi_dir=str(tmp_path / "cdi"),
            nvidia_cdi_dirs=str(nvidia_dir),
            nvidia_toolkit_config=str(toolkit),
        ) as (daemon, kubelet):
            assert daemon.toolkit.current.delivery is DeviceDelivery.CDI and daemon.toolkit.current.problems == ()
            response = (await kubelet.allocate(slice_id(GPU0, 0), pod="one")).container_responses[0]
            names = [d.name for d in response.cdi_devices]
            assert names == [f"nvidia.com/gpu={GPU1}", f"tensor-fusion.ai/vgpu={uid}_main"]
            assert toolkit_gpus(response) == "void"  # no device by variable: the CDI device brings it
            assert kube.node_patches and kube.node_patches[-1][0]["tensor-fusion.ai/device-delivery"] == "cdi"

    run(scenario())


def test_automatic_delivery_picks_nvidia_cdi_only_where_the_plugins_own_cdi_device_is_on(tmp_path: Path) -> None:
    """--cdi-dir= says the runtime reads no CDI: NVIDIA's devices would be ignored there, so auto does not pick
    them (and says the node cannot deliver under its guard)."""
    toolkit, nvidia_dir = guarded_without_mounts(tmp_path)

    async def scenario() -> None:
        async with plugin(
            tmp_path,
            FakeKube(),
            gpu_file(tmp_path / "gpus.yaml"),
            cdi_dir="",
            nvidia_cdi_dirs=str(nvidia_dir),
            nvidia_toolkit_config=str(toolkit),
        ) as (daemon, _):
            setup = daemon.toolkit.current
            assert setup.delivery is DeviceDelivery.ENVVAR
            assert [p.reason for p in setup.problems] == [REASON_UNDELIVERABLE]

    run(scenario())
