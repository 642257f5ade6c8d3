"""Fixtures of the end-to-end tier: one local cluster per session, logs shown when a test fails.

The cluster (see cluster.py) has one real kubelet node with 4 fake A100s driven by our device
plugin; scenarios add kubelet-less fake GPU nodes for pool, model and capacity cases.
``TF_E2E_KEEP=1`` keeps the cluster's directory (every process's log, etcd data) after the session.
A machine that cannot run the tier (not root, no unshare(1), no binaries and no Go to build them)
skips it, unless ``TF_E2E_REQUIRED=1`` (scripts/test, hence CI) says it must run: then every test
fails with what is missing, so a green run always means the tier ran.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from .cluster import Cluster
from .fake_nodes import gpus
from .kube import emptied
from .procs import built, tail

REQUIRED_ENV = "TF_E2E_REQUIRED"

# A cold build of the Kubernetes binaries takes 10-20 minutes on 2 cores; it happens inside the
# first e2e test's fixture setup unless scripts/build-k8s.sh ran before (as CI does).
COLD_BUILD_TIMEOUT = 2400


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    ours = [item for item in items if "tests/e2e/" in str(item.path).replace(os.sep, "/")]
    for item in ours:
        item.add_marker(pytest.mark.e2e)
    if ours and not built():
        ours[0].add_marker(pytest.mark.timeout(COLD_BUILD_TIMEOUT))


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    missing = missing_prerequisites()
    if missing and os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{REQUIRED_ENV}=1 but the e2e tier cannot run here: {missing}", pytrace=False)
    if missing:
        pytest.skip(f"the e2e tier cannot run here: {missing} (set {REQUIRED_ENV}=1 to fail instead)")
    with Cluster(gpus=gpus("e2e0", 4), keep_root=bool(os.environ.get("TF_E2E_KEEP"))) as running:
        yield running


def missing_prerequisites() -> str:
    """What this machine lacks to run the tier, '' when nothing."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the kubelet needs mount namespaces and cgroups)")
    if shutil.which("unshare") is None:
        missing.append("unshare(1)")
    if shutil.which("go") is None and not built():
        missing.append("the Kubernetes binaries (scripts/build-k8s.sh), and Go to build them")
    return "; ".join(missing)


@pytest.fixture
def core(cluster: Cluster) -> CoreV1Api:
    return cluster.core


@pytest.fixture
def fresh(cluster: Cluster, core: CoreV1Api, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of its own, emptied afterwards so the node's GPUs are free for the next scenario."""
    name = cluster.namespace(f"e2e-{request.node.name.replace('_', '-')[5:40].strip('-')}")
    yield name
    emptied(core, name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    running = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(running, Cluster):
        for proc in running.all_procs():
            report.sections.append((f"log of {proc.name} ({proc.log})", tail(proc.log, 80)))
