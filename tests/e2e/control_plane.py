"""etcd, a real kube-apiserver (its aggregation layer configured), kube-controller-manager and kube-scheduler on
loopback.

WHY: the extender, the webhook and the admission policies only mean something against the
real API server and the real scheduler: admission order, the Binding subresource, events, RBAC
and the scheduler's extender calls are what production runs. The controller-manager runs only
the controllers a user's Deployment needs (Deployment, ReplicaSet, service accounts, the root
CA ConfigMap, garbage collection, the aggregated edit/view roles), the HorizontalPodAutoscaler's and the Job
controller; no node-lifecycle controller, so nodes without a kubelet stay
Ready and the fixture clears the kubelet's initial not-ready taint itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from . import deploy
from .pki import FRONT_PROXY_CN, Identity, Pki, make_identities, make_pki, write_kubeconfig, write_token_file
from .procs import Proc, free_port, http_ok, tcp_listening, wait_until

# Static identities. The scheduler and our own binaries authenticate with the shipped
# service accounts' tokens instead (see cluster.py), so RBAC and the admission policies see
# production's users.
USERS: dict[str, tuple[str, ...]] = {
    "admin": ("system:masters",),
    "system:kube-controller-manager": ("system:masters",),
}
CONTROLLERS = ",".join(
    [
        "deployment-controller",
        "replicaset-controller",
        "serviceaccount-controller",
        "root-ca-certificate-publisher-controller",
        "garbage-collector-controller",
        "namespace-controller",
        "clusterrole-aggregation-controller",  # fills the admin/edit/view roles tenants get
        "resourcequota-controller",  # a ResourceQuota admits nothing until it has counted its namespace
        # autoSetReplicas scales through the HPAs the autoscaler owns, on the custom metrics API (tf-metrics)
        "horizontal-pod-autoscaler-controller",
        "job-controller",  # Kueue's scenario (test_kueue.py) queues Jobs, whose pods this controller creates
    ]
)


@dataclass
class Scheduler:
    """A kube-scheduler process and its secure port; :meth:`start` (again, after it stopped) waits for the port."""

    proc: Proc
    port: int

    def start(self) -> Scheduler:
        assert not self.proc.alive(), f"{self.proc.name} is running already"
        self.proc.start()
        wait_until(f"{self.proc.name} port", partial(tcp_listening, self.port), 60, [self.proc])
        return self


@dataclass
class ControlPlane:
    bin: Path
    root: Path
    procs: list[Proc] = field(default_factory=list)
    api_port: int = 0
    pki: Pki | None = None
    identities: dict[str, Identity] = field(default_factory=dict)
    scheduler: Scheduler | None = None  # the cluster's own (start_scheduler)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def kubeconfig(self, user: str) -> Path:
        """The kubeconfig of a static-token user (written at start)."""
        return self.root / f"kubeconfig-{user.replace(':', '-')}"

    def add_identity(self, user: str, groups: tuple[str, ...]) -> Path:
        """Register one more static-token user (before start) and return its kubeconfig path."""
        self.identities.update(make_identities({user: groups}))
        return self.kubeconfig(user)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.pki = make_pki(self.root / "pki")
        self.identities.update(make_identities(USERS) | self.identities)
        self.api_port = free_port()
        write_token_file(self.root / "tokens.csv", self.identities)
        for user, ident in self.identities.items():
            write_kubeconfig(self.kubeconfig(user), self.server, self.pki.ca_crt, ident.token, user)
        self._start_etcd()
        self._start_apiserver()
        self._start_controller_manager()

    def _proc(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.root / "logs" / f"{name}.log", cwd=self.root).start()
        self.procs.append(proc)
        return proc

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        etcd = self._proc(
            "etcd",
            [
                str(self.bin / "etcd"),
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        wait_until("etcd /health", lambda: http_ok(f"{self.etcd_url}/health"), 60, [etcd])

    def _start_apiserver(self) -> None:
        assert self.pki is not None
        cert, key = self.pki.serving_pair("apiserver")
        api = self._proc(
            "kube-apiserver",
            [
                str(self.bin / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--cert-dir={self.root / 'apiserver-certs'}",
                f"--tls-cert-file={cert}",
                f"--tls-private-key-file={key}",
                f"--client-ca-file={self.pki.ca_crt}",
                f"--token-auth-file={self.root / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                "--anonymous-auth=false",
                "--enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
                "ValidatingAdmissionPolicy,MutatingAdmissionPolicy,ServiceAccount,Priority",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={self.pki.sa_pub}",
                f"--service-account-signing-key-file={self.pki.sa_key}",
                "--service-cluster-ip-range=10.0.0.0/24",
                # The aggregation layer, as a real cluster has it (kubeadm's flags): the front proxy's CA and
                # client certificate, and the headers it names the user in. The aggregator dials an
                # APIService's endpoints itself (no kube-proxy here to reach a ClusterIP).
                f"--requestheader-client-ca-file={self.pki.front_proxy_ca}",
                f"--requestheader-allowed-names={FRONT_PROXY_CN}",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-username-headers=X-Remote-User",
                f"--proxy-client-cert-file={self.pki.front_proxy_client[0]}",
                f"--proxy-client-key-file={self.pki.front_proxy_client[1]}",
                "--enable-aggregator-routing=true",
                "--allow-privileged=true",
                # /debug/pprof, behind RBAC (the admin's token reads it): benchmarks/throughput.py --profile
                "--profiling=true",
                "--v=1",
            ],
        )
        admin = self.identities["admin"].token
        wait_until(
            "kube-apiserver /readyz",
            lambda: http_ok(f"{self.server}/readyz", ca=self.pki.ca_crt if self.pki else None, token=admin),
            120,
            [api],
        )

    def _start_controller_manager(self) -> None:
        assert self.pki is not None
        port = free_port()
        self._proc(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig('system:kube-controller-manager')}",
                f"--controllers={CONTROLLERS}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_crt}",
                "--leader-elect=false",
                "--concurrent-deployment-syncs=10",
                "--concurrent-replicaset-syncs=10",
                # An HPA pass every second (default 15 s), so a scaling scenario's steps come seconds apart.
                "--horizontal-pod-autoscaler-sync-period=1s",
                "--v=1",
            ],
        )
        wait_until("kube-controller-manager port", lambda: tcp_listening(port), 60, self.procs)

    def start_scheduler(
        self, kubeconfig: Path, extender_verbs_port: int, client: tuple[float, int] | None = None
    ) -> None:
        """kube-scheduler with THE configuration from deploy/, as the given identity: the cluster's own
        (``client``: its API client's QPS and burst instead of the shipped ones)."""
        config = deploy.scheduler_config(kubeconfig, extender_verbs_port, client)
        self.scheduler = self.add_scheduler("kube-scheduler", config)

    def add_scheduler(self, name: str, config: dict[str, Any]) -> Scheduler:
        """One more kube-scheduler, running ``config`` (a KubeSchedulerConfiguration), with its own config
        file, log and secure port; started, and listening. Its secure port authenticates and authorises
        through the API server (as the admin asks it to), so ``/debug/pprof`` answers the admin's token
        (benchmarks/throughput.py ``--profile``)."""
        path = self.root / f"{name}-config.yaml"
        path.write_text(yaml.safe_dump(config))
        port = free_port()
        delegate = self.kubeconfig("admin")
        argv = [str(self.bin / "kube-scheduler"), f"--config={path}", "--bind-address=127.0.0.1",
                f"--secure-port={port}", f"--authentication-kubeconfig={delegate}",
                f"--authorization-kubeconfig={delegate}", "--v=2"]  # fmt: skip
        proc = Proc(name, argv, self.root / "logs" / f"{name}.log", cwd=self.root)
        self.procs.append(proc)  # stopped with the control plane, and its log shown when a test fails
        return Scheduler(proc, port).start()

    @contextmanager
    def scheduler_stopped(self) -> Iterator[None]:
        """The cluster's own kube-scheduler stopped for the block, then started again, up before it returns."""
        assert self.scheduler is not None, "the cluster's kube-scheduler was never started"
        self.scheduler.proc.stop()
        try:
            yield
        finally:
            self.scheduler.start()

    def stop(self) -> None:
        """Scheduler and controllers first, then the API server, then etcd."""
        for proc in reversed(self.procs):
            proc.stop()
