"""``tfctl explain`` against a real extender served over HTTP on loopback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
import yaml

from scheduler_extender.app import create_app
from scheduler_extender.gateway import Kind
from scheduler_extender.settings import Settings
from tests.scheduler_extender.conftest import wait_for
from tests.scheduler_extender.fakes import GI, FakeGateway, gpu_request, make_node, make_pod
from tf_shell.access import Access, Refusal
from tfctl.main import main
from vgpu.names import LABEL_ENABLED


class TokenGate:
    """Stands in for tf_shell.access.Gate (tested there), as for a caller off loopback: ``Bearer t`` may read."""

    def check(self, peer: str | None, authorization: str | None, access: Access) -> Refusal | None:
        return None if authorization == "Bearer t" else Refusal(401, "Unauthorized: send a bearer token")


@pytest.fixture(params=[None], ids=["open"])
def extender_url(request: pytest.FixtureRequest) -> Iterator[str]:
    fake = FakeGateway()
    fake.put(Kind.NODE, make_node("big", gpus=2, vram=80 * GI))
    fake.put(Kind.NODE, make_node("t4", gpus=1, model="Tesla T4", vram=16 * GI, tflops=65_000))
    fake.put(Kind.POD, make_pod("pending", gpu_request(vram=40 * GI)))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(Settings(), fake, access=request.param), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, what="uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        fake.close()


def test_explain_an_existing_pod(extender_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    wait_for(lambda: main(["explain", "default/pending", "--extender", extender_url, "--json"]) == 0 and "ready")
    capsys.readouterr()
    assert main(["explain", "default/pending", "--extender", extender_url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "pod default/pending"
    assert any(line.startswith("  summary   1/2 nodes") for line in out)
    t4 = next(line for line in out if line.strip().startswith("t4"))
    assert "unresolvable" in t4 and "16Gi" in t4  # the T4 can never hold 40Gi


def test_explain_a_spec_file_that_would_be_denied(
    extender_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {
        "metadata": {
            "name": "q",
            "labels": {LABEL_ENABLED: "true"},
            "annotations": {"tensor-fusion.ai/qos": "urgent", "tensor-fusion.ai/vram-request": "1Gi"},
        },
        "spec": {"containers": [{"name": "main"}]},
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["explain", "-f", str(path), "--extender", extender_url]) == 1
    assert "tensor-fusion.ai/qos 'urgent': must be one of low, medium, high, critical" in capsys.readouterr().out


def test_unreachable_extender_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["explain", "default/x", "--extender", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"cannot reach the extender at http://127.0.0.1:{port}" in err
    assert "kubectl -n tensor-fusion-system port-forward svc/tensor-fusion-extender 8081" in err  # what to do
    assert "--extender" in err


@pytest.mark.parametrize("extender_url", [TokenGate()], ids=["guarded"], indirect=True)
def test_explain_shows_the_token_it_is_given(extender_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    wait_for(lambda: main(["explain", "default/pending", "--extender", extender_url, "--token", "t"]) == 0 and "ok")
    assert main(["explain", "default/pending", "--extender", extender_url]) == 2
    assert "the extender answered 401: " in capsys.readouterr().err
