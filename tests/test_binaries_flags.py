"""Every binary answers --version, and takes its settings one way (tf_shell.settings_cli): each flag's --help
names its environment variable and its plain default (no enum reprs, no reST markup), a variable sets a
value and a flag overrides it, and a bad value from either exits 2 with one line naming both."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version

import pytest
from pydantic_settings import BaseSettings

from device_plugin.main import settings_from as plugin_settings
from device_plugin.settings import PluginSettings
from scheduler_extender.main import settings_from as extender_settings
from scheduler_extender.settings import Settings
from tf_metrics.main import settings_from as metrics_settings
from tf_metrics.settings import MetricsSettings
from tf_webhook.main import settings_from as webhook_settings
from tf_webhook.settings import WebhookSettings
from tfctl.main import parser as tfctl_parser
from vgpu.names import DISTRIBUTION, PlacementPolicy

Read = Callable[[list[str]], object]

BINARIES: list[tuple[str, Read, type[BaseSettings], str]] = [
    ("tf-extender", extender_settings, Settings, "TF_EXTENDER_"),
    ("tf-webhook", webhook_settings, WebhookSettings, "TF_WEBHOOK_"),
    ("tf-device-plugin", plugin_settings, PluginSettings, "TF_PLUGIN_"),
    ("tf-metrics", metrics_settings, MetricsSettings, "TF_METRICS_"),
]


def _tfctl(argv: list[str]) -> object:
    return tfctl_parser().parse_args(argv)


def help_text(read: Read, capsys: pytest.CaptureFixture[str]) -> str:
    """--help as printed, its line breaks and indents folded into single spaces."""
    with pytest.raises(SystemExit) as exit_:
        read(["--help"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(("prog", "read"), [(prog, read) for prog, read, _, _ in BINARIES] + [("tfctl", _tfctl)])
def test_version(prog: str, read: Read, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        read(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"{prog} {version(DISTRIBUTION)}\n"


@pytest.mark.parametrize("read", [read for _, read, _, _ in BINARIES] + [_tfctl])
def test_help_is_plain_text(read: Read, capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text(read, capsys)
    assert "<" + "PlacementPolicy" not in text and "<" + "LogFormat" not in text
    assert "``" not in text and ":class:" not in text and ":mod:" not in text


@pytest.mark.parametrize(("prog", "read", "model", "prefix"), BINARIES)
def test_help_names_every_flags_variable_and_default(
    prog: str, read: Read, model: type[BaseSettings], prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_text(read, capsys)
    for name in model.model_fields:
        variable = (prefix + name).upper()
        assert f"--{name.replace('_', '-')}" in text, name
        assert f"(env {variable}, default: " in text, variable
    assert text.count("(env ") == len(model.model_fields)


@pytest.mark.parametrize(
    ("read", "shown"),
    [
        (extender_settings, "(env TF_EXTENDER_POLICY, default: fragmentation)"),
        (extender_settings, "(env TF_EXTENDER_LEASE_NAMESPACE, default: none)"),
        (extender_settings, '(env TF_EXTENDER_URL_PREFIX, default: "")'),
        (extender_settings, "--log-level {debug,info,warning,error}"),
        (webhook_settings, "(env TF_WEBHOOK_PORT, default: 9443)"),
        (webhook_settings, "(env TF_WEBHOOK_TLS_CERT_FILE, default: /etc/tensor-fusion/webhook-tls/tls.crt)"),
        (
            webhook_settings,
            "--gpu-tolerations JSON Tolerations added to every GPU pod that does not already tolerate them; [] adds "
            'none. (env TF_WEBHOOK_GPU_TOLERATIONS, default: [{"key": "nvidia.com/gpu", "operator": "Exists", '
            '"effect": "NoSchedule"}])',
        ),
        (
            plugin_settings,
            "--backend {hami-core,mps,none} How per-container limits are enforced. (env TF_PLUGIN_BACKEND",
        ),
        (plugin_settings, "(env TF_PLUGIN_SLICES_PER_GPU, default: 16)"),
        (plugin_settings, "(env TF_PLUGIN_IGNORED_XIDS, default: 13,31,43,45,68,109)"),
        (plugin_settings, "--probe, --no-probe Print the GPUs found"),
        (plugin_settings, "(env TF_PLUGIN_PROBE, default: false)"),
        (plugin_settings, "--layout-check-interval LAYOUT_CHECK_INTERVAL Seconds between listings of the GPUs"),
        (plugin_settings, "(env TF_PLUGIN_LAYOUT_CHECK_INTERVAL, default: 30.0)"),
        (plugin_settings, "--live-limits-interval LIVE_LIMITS_INTERVAL Seconds between passes"),
        (plugin_settings, "(env TF_PLUGIN_LIVE_LIMITS_INTERVAL, default: 5.0)"),
    ],
)
def test_help_shows_defaults_as_they_are_typed(read: Read, shown: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert shown in help_text(read, capsys)


def test_extender_variable_sets_and_flag_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_EXTENDER_POLICY", "spread")
    monkeypatch.setenv("TF_EXTENDER_DECIDE_IN_FILTER", "false")
    settings = extender_settings(["--policy=fragmentation"])
    assert (settings.policy, settings.decide_in_filter) == (PlacementPolicy.FRAGMENTATION, False)


def test_webhook_variable_sets_and_flag_overrides_json_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_WEBHOOK_GPU_TOLERATIONS", "[]")
    monkeypatch.setenv("TF_WEBHOOK_PORT", "8443")
    assert (webhook_settings([]).gpu_tolerations, webhook_settings([]).port) == ([], 8443)
    given = webhook_settings(['--gpu-tolerations=[{"key": "x", "operator": "Exists"}]', "--port=9000"])
    assert (given.gpu_tolerations, given.port) == ([{"key": "x", "operator": "Exists"}], 9000)


def test_plugin_variable_sets_and_flag_overrides_booleans_too(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (plugin_settings([]).probe, plugin_settings(["--probe"]).probe) == (False, True)
    monkeypatch.setenv("TF_PLUGIN_PROBE", "true")
    monkeypatch.setenv("TF_PLUGIN_SLICES_PER_GPU", "4")
    assert (plugin_settings([]).probe, plugin_settings([]).slices_per_gpu) == (True, 4)
    given = plugin_settings(["--no-probe", "--slices-per-gpu=8"])
    assert (given.probe, given.slices_per_gpu) == (False, 8)


def test_plugin_intervals_that_had_no_flag_have_one(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = plugin_settings([])
    assert (defaults.layout_check_interval, defaults.live_limits_interval) == (30.0, 5.0)
    monkeypatch.setenv("TF_PLUGIN_LAYOUT_CHECK_INTERVAL", "60")
    given = plugin_settings(["--live-limits-interval=2.5"])
    assert (given.layout_check_interval, given.live_limits_interval) == (60.0, 2.5)


def test_plugin_node_name_falls_back_to_the_pods_node_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-the-pod")
    assert plugin_settings([]).node_name == "from-the-pod"
    monkeypatch.setenv("TF_PLUGIN_NODE_NAME", "from-the-variable")
    assert plugin_settings([]).node_name == "from-the-variable"
    assert plugin_settings(["--node-name=n1"]).node_name == "n1"


@pytest.mark.parametrize(
    ("read", "argv", "env", "line"),
    [
        (
            extender_settings,
            ["--verbs-port=abc"],
            {},
            "tf-extender: error: --verbs-port (env TF_EXTENDER_VERBS_PORT) 'abc': Input should be a valid integer, "
            "unable to parse string as an integer",
        ),
        (
            extender_settings,
            [],
            {"TF_EXTENDER_POLICY": "best"},
            "tf-extender: error: --policy (env TF_EXTENDER_POLICY) 'best': Input should be 'binpack', 'spread' or "
            "'fragmentation'",
        ),
        (
            extender_settings,
            ["--handoff-wait=5"],
            {},
            "tf-extender: error: handoff_wait 5s does not fit in bind_timeout 6s: it may be at most 4s (2/3 of it; "
            "the rest is for the bind's API calls)",
        ),
        (
            webhook_settings,
            ["--log-level=loud"],
            {},
            "tf-webhook: error: --log-level (env TF_WEBHOOK_LOG_LEVEL) 'loud': Input should be 'debug', 'info', "
            "'warning' or 'error'",
        ),
        (
            webhook_settings,
            [],
            {"TF_WEBHOOK_GPU_TOLERATIONS": "[{"},
            "tf-webhook: error: --gpu-tolerations (env TF_WEBHOOK_GPU_TOLERATIONS) '[{': not JSON (Expecting "
            "property name enclosed in double quotes: line 1 column 3 (char 2))",
        ),
        (
            webhook_settings,
            ["--gpu-tolerations=[1]"],
            {},
            "tf-webhook: error: --gpu-tolerations (env TF_WEBHOOK_GPU_TOLERATIONS) '[1]': [0]: Input should be a "
            "valid dictionary",
        ),
        (
            plugin_settings,
            [],
            {"TF_PLUGIN_SLICES_PER_GPU": "0"},
            "tf-device-plugin: error: --slices-per-gpu (env TF_PLUGIN_SLICES_PER_GPU) '0': Input should be greater "
            "than or equal to 1",
        ),
        (
            plugin_settings,
            [],
            {"TF_PLUGIN_PROBE": "maybe"},
            "tf-device-plugin: error: --probe (env TF_PLUGIN_PROBE) 'maybe': Input should be a valid boolean, "
            "unable to interpret input",
        ),
        (
            plugin_settings,
            ["--layout-check-interval=0"],
            {},
            "tf-device-plugin: error: --layout-check-interval (env TF_PLUGIN_LAYOUT_CHECK_INTERVAL) '0': Input "
            "should be greater than 0",
        ),
        (
            plugin_settings,
            ["--default-tflops=fast", "--ignored-xids=13,x"],
            {},
            "tf-device-plugin: error: --default-tflops (env TF_PLUGIN_DEFAULT_TFLOPS) 'fast': not a Kubernetes "
            "quantity such as 10, 2.5, 500m, 4Gi, 4096Mi, 4G or 1e3; --ignored-xids (env TF_PLUGIN_IGNORED_XIDS) "
            "'13,x': must be XID numbers separated by commas, such as 13,79",
        ),
    ],
)
def test_a_bad_value_exits_2_with_one_line_naming_flag_variable_and_value(
    read: Read,
    argv: list[str],
    env: dict[str, str],
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        read(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == line + "\n"


def test_an_unknown_flag_is_argparses_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        plugin_settings(["--cores=4"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.endswith("tf-device-plugin: error: unrecognized arguments: --cores=4\n")


def test_a_removed_extender_setting_still_set_is_refused_not_ignored(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TF_EXTENDER_KEEP_TOP_NODES", "1")
    with pytest.raises(SystemExit) as exit_:
        extender_settings([])
    assert exit_.value.code == 2
    said = capsys.readouterr().err
    assert "TF_EXTENDER_KEEP_TOP_NODES" in said and "'1'" in said and "--decide-in-filter" in said
    assert len(said.strip().splitlines()) == 1
