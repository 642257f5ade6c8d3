"""``tf-webhook`` flags override the TF_WEBHOOK_* environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_extender.webhook.main import parse_args


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_WEBHOOK_PORT", "8443")
    monkeypatch.setenv("TF_WEBHOOK_TLS_CERT_FILE", "/env/tls.crt")
    got = parse_args(["--tls-cert-file", "/flag/tls.crt", "--kubeconfig", "/k/config"])
    assert (got.port, got.tls_cert_file, got.kubeconfig) == (8443, Path("/flag/tls.crt"), Path("/k/config"))


def test_bad_port_is_rejected() -> None:
    with pytest.raises(ValueError, match="port"):
        parse_args(["--port", "70000"])
