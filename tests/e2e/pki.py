"""The e2e cluster's own certificate authority, serving certificates, tokens and kubeconfigs.

WHY: a real API server only speaks TLS, calls admission webhooks only over verified TLS, and
signs service-account tokens with a key we must hand it. ``openssl`` is on every machine we
run on (the Python ``cryptography`` package is not a dependency), so we drive it directly.
Static bearer tokens (``--token-auth-file``) give each real component its own identity, so RBAC,
the Node authorizer and our admission policies see the same users they see in production.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

FRONT_PROXY_CN = "front-proxy-client"  # kube-apiserver --requestheader-allowed-names (as kubeadm names it)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@dataclass(frozen=True, slots=True)
class Pki:
    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def serving_pair(self, name: str) -> tuple[Path, Path]:
        return self.dir / f"{name}.crt", self.dir / f"{name}.key"

    @property
    def front_proxy_ca(self) -> Path:
        """The requestheader client CA: it signs the API server's front-proxy client certificate only."""
        return self.dir / "front-proxy-ca.crt"

    @property
    def front_proxy_client(self) -> tuple[Path, Path]:
        """The certificate the API server's aggregator presents to aggregated API servers (CN FRONT_PROXY_CN)."""
        return self.dir / "front-proxy-client.crt", self.dir / "front-proxy-client.key"


def make_pki(root: Path) -> Pki:
    """A CA, service-account keys, serving certificates for the API server and our webhook, and the
    aggregation layer's front-proxy CA and client certificate (a CA of its own, as kubeadm makes it)."""
    pki = Pki(root)
    root.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "front-proxy-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                 "-days", "2", "-subj", f"/CN=tf-e2e-{ca}", cwd=root)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=root)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=root)
    for name in ("apiserver", "webhook"):
        serving_cert(pki, name)
    _signed(pki, "front-proxy-client", "front-proxy-ca", "extendedKeyUsage=clientAuth", FRONT_PROXY_CN)
    return pki


def serving_cert(pki: Pki, name: str, dns: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A serving pair signed by the cluster CA for loopback, the API server's names, and ``dns``."""
    sans = ",".join(["IP:127.0.0.1", "DNS:localhost", "DNS:kubernetes.default.svc", "IP:10.0.0.1",
                     *(f"DNS:{d}" for d in dns)])  # fmt: skip
    _signed(pki, name, "ca", f"subjectAltName={sans}\nextendedKeyUsage=serverAuth", name)
    return pki.serving_pair(name)


def _signed(pki: Pki, name: str, ca: str, extensions: str, common_name: str) -> None:
    root = pki.dir
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={common_name}", cwd=root)  # fmt: skip
    ext = root / f"{name}.ext"
    ext.write_text(f"{extensions}\nkeyUsage=digitalSignature,keyEncipherment\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", "-extfile", ext.name, cwd=root)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Identity:
    """A static-token user of the API server."""

    user: str
    groups: tuple[str, ...]
    token: str


def make_identities(users: dict[str, tuple[str, ...]]) -> dict[str, Identity]:
    return {user: Identity(user, groups, secrets.token_hex(16)) for user, groups in users.items()}


def write_token_file(path: Path, identities: dict[str, Identity]) -> None:
    rows = [f'{i.token},{i.user},{i.user},"{",".join(i.groups)}"' for i in identities.values()]
    path.write_text("\n".join(rows) + "\n")


def write_kubeconfig(path: Path, server: str, ca: Path, token: str, user: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config))
    return path
