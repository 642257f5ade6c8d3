"""Where the e2e tier's Kubernetes binaries are, building them first when they are missing.

WHY: the binaries come from ``scripts/build-k8s.sh`` (the one place that knows the pinned
Kubernetes version and how to build it) and are cached outside the clone; tests, the demo and CI
all ask this module, so they agree on the cache and never rebuild what is there.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-k8s.sh"
NEEDED = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "fake-cri")


def ensure_binaries() -> Path:
    """Run the build script (a no-op when everything is cached) and return the bin directory.

    Progress goes to stderr; the script's last stdout line is the directory.
    """
    done = subprocess.run([str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    bin_dir = Path(done.stdout.strip().splitlines()[-1])
    missing = [name for name in NEEDED if not (bin_dir / name).exists()]
    if missing:
        raise FileNotFoundError(f"{BUILD_SCRIPT} finished but {missing} are not in {bin_dir}")
    return bin_dir
