"""A kubeconfig for a local stand-in API server: the real Kubernetes adapters are tested against one."""

from __future__ import annotations

from pathlib import Path

import yaml


def kubeconfig(port: int, tmp_path: Path) -> str:
    """The path of a kubeconfig pointing at http://127.0.0.1:``port`` with a bearer token."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)
