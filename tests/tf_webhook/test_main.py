"""``tf-webhook`` flags override the TF_WEBHOOK_* environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from tf_webhook.main import settings_from


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_WEBHOOK_PORT", "8443")
    monkeypatch.setenv("TF_WEBHOOK_TLS_CERT_FILE", "/env/tls.crt")
    got = settings_from(["--tls-cert-file", "/flag/tls.crt", "--kubeconfig", "/k/config"])
    assert (got.port, got.tls_cert_file, got.kubeconfig) == (8443, Path("/flag/tls.crt"), Path("/k/config"))


def test_bad_port_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        settings_from(["--port", "70000"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "tf-webhook: error: --port (env TF_WEBHOOK_PORT) '70000': Input should be less than or equal to 65535\n"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('[{"key": "a", "operator": "Maybe"}]', "gpu tolerations[0].operator 'Maybe': must be one of Exists, Equal"),
        ('[{"key": "a", "effekt": "NoSchedule"}]', "gpu tolerations[0]: unknown field 'effekt'; accepted: key,"),
        ('[{"operator": "Equal"}]', "gpu tolerations[0]: operator Equal needs a key"),
    ],
)
def test_bad_gpu_tolerations_are_refused_naming_the_entry(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        settings_from(["--gpu-tolerations", value])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
