"""tf-metrics stops at start with one line when it cannot be an aggregated API server: no kubeconfig, no
front-proxy configuration to read (RBAC, or an API server without an aggregation layer)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.tf_metrics.test_auth import PUBLISHED
from tf_metrics.main import _front_proxy, main
from tf_shell.kube.api import GatewayError


class Published:
    """The ConfigMap kube-system/extension-apiserver-authentication as the API server answers it."""

    def __init__(self, answer: dict[str, Any] | GatewayError) -> None:
        self.answer = answer

    def config_map(self, namespace: str, name: str) -> dict[str, Any]:
        assert (namespace, name) == ("kube-system", "extension-apiserver-authentication")
        if isinstance(self.answer, GatewayError):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (GatewayError("get configmap: HTTP 403 Forbidden: no", 403), "is the Role extension-apiserver-authentication-reader bound"),
        (GatewayError("get configmap: HTTP 404 Not Found", 404), "once its aggregation layer is configured"),
        ({"data": {"client-ca-file": "x"}}, "its aggregation layer is not configured"),
        ({}, "its aggregation layer is not configured"),
    ],
)  # fmt: skip
def test_no_front_proxy_configuration_stops_it_with_the_reason(answer: Any, said: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        _front_proxy(Published(answer))  # type: ignore[arg-type]
    assert str(stopped.value).startswith("tf-metrics: ") and said in str(stopped.value)


def test_the_published_configuration_is_read() -> None:
    assert _front_proxy(Published({"data": PUBLISHED})).allowed_names == {"front-proxy-client"}  # type: ignore[arg-type]


def test_no_kubeconfig_stops_it_with_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SystemExit) as stopped:
        main(["--kubeconfig", str(tmp_path / "missing")])
    assert str(stopped.value).startswith("tf-metrics: no usable kubeconfig")
