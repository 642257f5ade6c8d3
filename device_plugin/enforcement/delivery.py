"""How a container is given its GPUs on this node, and whether the node lets other pods take GPUs unasked.

A pod that is not ours can name GPUs in ``NVIDIA_VISIBLE_DEVICES`` (in its spec or through ``envFrom``),
and NVIDIA's container toolkit in its default mode hands them over: no admission check reads ``envFrom``,
and the device plugin never hears of such a pod. Only the toolkit can refuse it
(``accept-nvidia-visible-devices-envvar-when-unprivileged = false``, the *envvar guard*); once it does, our
own containers need their GPUs through a channel it still reads: ``/dev/null`` mounts under
``/var/run/nvidia-container-devices`` (with ``accept-nvidia-visible-devices-as-volume-mounts = true``), or
NVIDIA's CDI devices. :func:`choose` decides, from the toolkit's configuration and NVIDIA's CDI specs, which
delivery the plugin uses and what it must report; pure, so every combination is a table test. The shell that
reads the files and reports is :mod:`device_plugin.enforcement.toolkit_check`. Why, and what an operator
sets: docs/security.md, "Pods that are not ours".
"""

from __future__ import annotations

import tomllib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Final

from vgpu.names import (
    NVIDIA_CDI_KIND,
    NVIDIA_DEVICE_MOUNT_ROOT,
    TOOLKIT_ACCEPT_ENVVAR,
    TOOLKIT_ACCEPT_MOUNTS,
    DeviceDelivery,
    EnvvarGuard,
)

# The node Events' reasons: other pods can take GPUs; our containers would not get theirs.
REASON_UNGUARDED: Final = "GpuEnvvarUnguarded"
REASON_UNDELIVERABLE: Final = "GpuDeliveryMisconfigured"
# What the toolkit does where its configuration does not say (its own defaults).
_ENVVAR_DEFAULT = True
_MOUNTS_DEFAULT = False


@dataclass(frozen=True, slots=True)
class ToolkitConfig:
    """The two toolkit settings that matter here, as read from ``path``; ``problem``: why it could not be
    read (the file missing, unparsable, or a value not a boolean), None when it was."""

    path: str
    accept_envvar_unprivileged: bool = _ENVVAR_DEFAULT
    accept_volume_mounts: bool = _MOUNTS_DEFAULT
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing an operator must fix: an Event reason and a sentence naming the setting."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class NodeSetup:
    """What the plugin concluded: the envvar guard's state, the delivery it answers with, and each problem."""

    guard: EnvvarGuard
    delivery: DeviceDelivery
    problems: tuple[Problem, ...] = ()


def parse_config(path: str, text: str) -> ToolkitConfig:
    """The toolkit settings in ``text`` (TOML, keys at the top level as the toolkit reads them)."""
    try:
        doc: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return ToolkitConfig(path, problem=f"{path} is not valid TOML: {exc}")
    values = {}
    for key, default in ((TOOLKIT_ACCEPT_ENVVAR, _ENVVAR_DEFAULT), (TOOLKIT_ACCEPT_MOUNTS, _MOUNTS_DEFAULT)):
        value = doc.get(key, default)
        if not isinstance(value, bool):
            return ToolkitConfig(path, problem=f"{path}: {key} = {value!r} is not true or false")
        values[key] = value
    return ToolkitConfig(path, values[TOOLKIT_ACCEPT_ENVVAR], values[TOOLKIT_ACCEPT_MOUNTS])


def guard(config: ToolkitConfig) -> EnvvarGuard:
    if config.problem is not None:
        return EnvvarGuard.UNKNOWN
    return EnvvarGuard.OFF if config.accept_envvar_unprivileged else EnvvarGuard.ON


def unguarded_message(config: ToolkitConfig) -> str:
    """The node-level warning while the guard is not on."""
    why = config.problem or f"{config.path} leaves {TOOLKIT_ACCEPT_ENVVAR} at true"
    return (
        f"any unprivileged pod on this node can take its GPUs by naming them in NVIDIA_VISIBLE_DEVICES (spec or "
        f"envFrom), outside every share: {why}; set {TOOLKIT_ACCEPT_ENVVAR} = false and "
        f"{TOOLKIT_ACCEPT_MOUNTS} = true in the NVIDIA container toolkit's configuration (docs/security.md)"
    )


def choose(
    wanted: DeviceDelivery | None, config: ToolkitConfig, cdi_names: Collection[str], uuids: Collection[str]
) -> NodeSetup:
    """The delivery for ``wanted`` (None: the best the node offers) and the problems to report.

    Automatic: volume mounts where the toolkit reads them, else NVIDIA's CDI devices where its specs name
    every GPU (``cdi_names``: the device names of kind ``nvidia.com/gpu``), else the variable. A delivery the
    toolkit will not honour is a problem (our containers would start without their GPUs), and so is an
    open envvar guard (other pods can take GPUs)."""
    state = guard(config)
    mounts_read = config.problem is None and config.accept_volume_mounts
    cdi_covers = bool(uuids) and all(u in cdi_names for u in uuids)
    if wanted is None:
        if mounts_read:
            wanted = DeviceDelivery.VOLUME_MOUNTS
        elif cdi_covers:
            wanted = DeviceDelivery.CDI
        else:
            wanted = DeviceDelivery.ENVVAR
    problems = []
    if state is not EnvvarGuard.ON:
        problems.append(Problem(REASON_UNGUARDED, unguarded_message(config)))
    if wanted is DeviceDelivery.ENVVAR and state is EnvvarGuard.ON:
        broken = (
            f"{config.path} sets {TOOLKIT_ACCEPT_ENVVAR} = false, so containers given GPUs by NVIDIA_VISIBLE_DEVICES "
            f"start without them: set {TOOLKIT_ACCEPT_MOUNTS} = true (the plugin then mounts each GPU under "
            f"{NVIDIA_DEVICE_MOUNT_ROOT}) or generate NVIDIA's CDI spec naming GPUs by UUID "
            "(nvidia-ctk cdi generate --device-name-strategy=uuid)"
        )
    elif wanted is DeviceDelivery.VOLUME_MOUNTS and not mounts_read:
        broken = (
            f"--device-delivery={wanted} but {config.path} does not set {TOOLKIT_ACCEPT_MOUNTS} = true: "
            "containers would start without their GPUs"
        )
    elif wanted is DeviceDelivery.CDI and not cdi_covers:
        missing = sorted(set(uuids) - set(cdi_names))
        broken = (
            f"--device-delivery={wanted} but no CDI spec of kind {NVIDIA_CDI_KIND} names "
            f"{', '.join(missing) or 'any GPU'}: the runtime would refuse to create the containers (generate it "
            "with nvidia-ctk cdi generate --device-name-strategy=uuid)"
        )
    else:
        broken = ""
    if broken:
        problems.append(Problem(REASON_UNDELIVERABLE, broken))
    return NodeSetup(state, wanted, tuple(problems))
