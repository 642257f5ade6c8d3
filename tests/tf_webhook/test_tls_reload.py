"""A renewed webhook certificate is served without a restart; a broken pair never replaces a good one.

Runs the real ``tf-webhook`` over TLS (its kubeconfig points nowhere: no admission is asked for) and
reads the certificate a fresh handshake gets, as the API server would, while the files change the
way a mounted Secret's do.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def make_pair(where: Path, name: str) -> tuple[Path, Path]:
    crt, key = where / f"{name}.crt", where / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", f"/CN={name}", "-days", "1", "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True,
    )  # fmt: skip
    return crt, key


def served(port: int) -> str:
    """The SHA-256 of the certificate a new TLS connection is given."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        return hashlib.sha256(tls.getpeercert(True) or b"").hexdigest()


def der(crt: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(crt.read_text())).hexdigest()


def eventually_served(port: int, wanted: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (got := served(port)) != wanted:
        assert time.monotonic() < deadline, f"still serving {got[:12]}, wanted {wanted[:12]}"
        time.sleep(0.1)


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[tuple[int, Path, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl(1) makes the test certificates")
    first = make_pair(tmp_path, "first")
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first[0], crt)
    shutil.copy(first[1], key)
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [str(Path(sys.executable).parent / "tf-webhook"), "--host", "127.0.0.1", "--port", str(port),
            "--tls-cert-file", str(crt), "--tls-key-file", str(key), "--tls-reload-s", "0.1",
            "--kubeconfig", str(tmp_path / "kubeconfig")]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                served(port)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "tf-webhook did not start"
                time.sleep(0.1)
        yield port, crt, key
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_renewed_pair_is_served_without_a_restart_and_a_broken_one_is_not(
    tmp_path: Path, webhook: tuple[int, Path, Path]
) -> None:
    port, crt, key = webhook
    first_der = served(port)
    renewed = make_pair(tmp_path, "renewed")
    shutil.copy(renewed[0], crt)
    shutil.copy(renewed[1], key)
    eventually_served(port, der(renewed[0]))
    assert der(renewed[0]) != first_der
    stray = make_pair(tmp_path, "stray")
    shutil.copy(stray[0], crt)  # a certificate whose key is not there: never served, nor half-loaded
    time.sleep(0.5)
    assert served(port) == der(renewed[0])
    shutil.copy(stray[1], key)  # the pair is complete again
    eventually_served(port, der(stray[0]))


def test_handshakes_during_renewals_all_succeed(tmp_path: Path, webhook: tuple[int, Path, Path]) -> None:
    """Every handshake made while pairs are swapped in gets a whole pair: none fails, none is refused."""
    port, crt, key = webhook
    pairs = [make_pair(tmp_path, f"renewal{i}") for i in range(40)]
    failures: list[str] = []
    done = threading.Event()
    handshakes = 0

    def client() -> None:
        nonlocal handshakes
        while not done.is_set():
            try:
                served(port)
                handshakes += 1
            except OSError as exc:
                failures.append(repr(exc))

    hammer = threading.Thread(target=client)
    hammer.start()
    try:
        for pair_crt, pair_key in pairs:
            shutil.copy(pair_crt, crt)
            shutil.copy(pair_key, key)
            eventually_served(port, der(pair_crt))
    finally:
        done.set()
        hammer.join(10)
    assert failures == []
    assert handshakes > len(pairs)
