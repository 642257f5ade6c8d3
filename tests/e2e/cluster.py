"""The whole local cluster: control plane, deploy/ manifests, our three binaries, GPU nodes.

WHY: one object that a pytest session fixture and ``scripts/demo`` both use, so the demo shows
exactly what the tests check. It starts things in dependency order and stops them in reverse:
our components and the kubelet first, then the scheduler and controllers, the API server, etcd.
Our binaries run from their console scripts with service-account tokens, so the admission
policies in deploy/ judge them as they would in a cluster.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from kubernetes.client import ApiregistrationV1Api, CoreV1Api, RbacAuthorizationV1Api
from prometheus_client.parser import text_string_to_metric_families

from vgpu.contract import inventory
from vgpu.metric_names import ERRORS, WHERE_TAMPER
from vgpu.names import (
    CRD_GROUP,
    CRD_VERSION,
    DEFAULT_POOL,
    KIND_GPU_POOL,
    LABEL_NAMESPACE_MAX_QOS,
    LABEL_NODE_POOL,
    RESOURCE_VGPU,
    EnforcementBackend,
    Qos,
)

from . import deploy
from .control_plane import ControlPlane
from .fake_nodes import SLICES_PER_GPU, FakeGpu, add_fake_node, fake_nvml_yaml
from .kube import api_client, apply, ensure_namespace, eventually, service_account_token, untaint_not_ready
from .node import KubeletNode
from .pki import serving_cert, write_kubeconfig
from .procs import (
    Proc,
    StartupError,
    ensure_binaries,
    free_port,
    non_loopback_ipv4,
    tail,
    tcp_listening,
    wait_until,
)

VENV_BIN = Path(sys.executable).parent
REAL_NODE = "tf-e2e-gpu-0"
PLUGIN_USAGE_INTERVAL = 1  # seconds between the kubelet node's usage samples (the plugin's default: 5)
PLUGIN_COMPUTE_WINDOW = 3  # seconds a pod's share of a GPU is averaged over for the compute report (default: 60)
TOOLKIT_CHECK_INTERVAL = 1  # seconds between the plugin's reads of its toolkit configuration (its default: 60)
METRICS_API_INTERVAL = 1  # seconds between tf-metrics' passes over the plugins (its default: 5)
AUTOSCALER_MAX_REPLICAS = 3  # the extender's --autoscaler-max-replicas: maxReplicas of the HPAs it owns
TENANT = "e2e-tenant"  # an ordinary user; scenarios grant it roles in their namespaces
# The live-limits directories (the device plugin's --live-limits-dir) of the clusters this process started: each
# cluster has its own under its root, so clusters on one machine never share, or sweep, each other's.
LIVE_LIMITS_DIRS: list[Path] = []


class Companion(Protocol):
    """A controller of another project the e2e tier runs beside the cluster (tests/e2e/kueue.py, karpenter.py)."""

    proc: Proc | None

    def start(self) -> object: ...

    def stop(self) -> None: ...


@dataclass
class Cluster(AbstractContextManager["Cluster"]):
    """``with Cluster(gpus=...) as c:`` gives a running cluster; leaving the block stops everything.

    ``kubelet=False``: no kubelet node and no device plugin (only kubelet-less nodes, as the throughput
    benchmark wants: benchmarks/throughput.py); ``scheduler_client``: kube-scheduler's API client QPS and
    burst instead of the shipped ones."""

    gpus: tuple[FakeGpu, ...]
    kubelet: bool = True
    scheduler_client: tuple[float, int] | None = None
    keep_root: bool = False
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tf-e2e-")))
    cp: ControlPlane | None = None
    node: KubeletNode | None = None
    ours: dict[str, Proc] = field(default_factory=dict)
    kubeconfigs: dict[str, Path] = field(default_factory=dict)

    # --- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.dump_logs()
            self.stop()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if et is not None:
            self.dump_logs()
        self.stop()

    def start(self) -> None:
        bin_dir = ensure_binaries()
        self.extender_verbs_port, self.extender_public_port, self.webhook_port = free_port(), free_port(), free_port()
        self.cp = ControlPlane(bin_dir, self.root / "control-plane")
        node_kubeconfig = self.cp.add_identity(f"system:node:{REAL_NODE}", ("system:nodes",))
        self.tenant_kubeconfig = self.cp.add_identity(TENANT, ())
        self.cp.start()
        self.admin = api_client(self.cp.kubeconfig("admin"))
        self.core = CoreV1Api(self.admin)
        ensure_namespace(self.admin, deploy.system_namespace())
        apply(self.admin, deploy.cluster_objects())
        for component, (namespace, account) in deploy.service_accounts().items():
            self.kubeconfigs[component] = self._service_account_kubeconfig(component, namespace, account)
        self.ensure_pool(DEFAULT_POOL)
        self._start_webhook()
        self.start_extender()
        self.cp.start_scheduler(self.kubeconfigs["extender"], self.extender_verbs_port, self.scheduler_client)
        assert self.cp.pki is not None
        if not self.kubelet:
            return
        pool_label = {LABEL_NODE_POOL: DEFAULT_POOL}  # how an operator puts a node in a pool
        self.node = KubeletNode(REAL_NODE, bin_dir, self.root / "node", node_kubeconfig, self.cp.pki.ca_crt, pool_label)
        self.node.start()
        self.set_gpu_faults({})
        self.plugin_metrics_port = free_port()  # kept across restarts of the plugin
        self.start_device_plugin()
        self.wait_node_ready(REAL_NODE)

    def _service_account_kubeconfig(self, component: str, namespace: str, account: str) -> Path:
        assert self.cp is not None and self.cp.pki is not None
        token = service_account_token(self.admin, namespace, account)
        path = self.root / f"kubeconfig-{component}"
        return write_kubeconfig(path, self.cp.server, self.cp.pki.ca_crt, token, f"{namespace}:{account}")

    def _ours(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.root / "logs" / f"{name}.log").start()
        self.ours[name] = proc
        return proc

    def _start_webhook(self) -> None:
        assert self.cp is not None and self.cp.pki is not None
        cert, key = self.cp.pki.serving_pair("webhook")
        proc = self._ours(
            "tf-webhook",
            [
                str(VENV_BIN / "tf-webhook"),
                "--host=127.0.0.1",
                f"--port={self.webhook_port}",
                f"--tls-cert-file={cert}",
                f"--tls-key-file={key}",
                f"--kubeconfig={self.kubeconfigs['webhook']}",
            ],
        )
        wait_until("tf-webhook port", lambda: tcp_listening(self.webhook_port), 60, [proc])
        apply(self.admin, deploy.webhook_configurations(f"https://127.0.0.1:{self.webhook_port}", self.cp.pki.ca_crt))

    def start_extender(self) -> Proc:
        """Writes workload status every second (default 5 s), so scenarios see it change sooner. Both
        listeners keep their default addresses: the verbs on loopback, the read-only routes on all."""
        proc = self._ours(
            "tf-extender",
            [
                str(VENV_BIN / "tf-extender"),
                f"--verbs-port={self.extender_verbs_port}",
                f"--public-port={self.extender_public_port}",
                f"--url-prefix={deploy.EXTENDER_PREFIX}",
                f"--kubeconfig={self.kubeconfigs['extender']}",
                "--workload-status-interval=1",
                # The autoscaler every second, checkpoints every 2 s; its HPAs scale to 3 replicas at most.
                "--autoscaler-interval=1",
                "--autoscaler-checkpoint-interval=2",
                f"--autoscaler-max-replicas={AUTOSCALER_MAX_REPLICAS}",
                f"--plugin-service={deploy.service('-device-plugin-metrics')['metadata']['name']}",
                # Out of a pod there is no service-account namespace: the Lease is where the chart's Role allows it.
                f"--lease-namespace={deploy.system_namespace()}",
            ],
        )
        for port in (self.extender_verbs_port, self.extender_public_port):
            wait_until(f"tf-extender port {port}", partial(tcp_listening, port), 60, [proc])
        return proc

    @property
    def live_limits_dir(self) -> Path:
        """The kubelet node's live-limits directory (docs/live-limits.md): ``<pod UID>/<container>/limits.json``
        and ``hami.cache``, as the container sees them at /run/tensor-fusion/limits."""
        return self.root / "live-limits"

    @property
    def fake_nvml(self) -> Path:
        """The device plugin's fake GPU file; it re-reads it on change."""
        return self.root / "fake-nvml.yaml"

    def set_gpu_faults(self, faults: Mapping[str, str]) -> None:
        """From now on the plugin's health check of each GPU in ``faults`` fails with its text; the others pass."""
        self.write_fake_nvml(fake_nvml_yaml(self.gpus, faults))

    def write_fake_nvml(self, text: str) -> None:
        """Replace the plugin's fake GPU file (device_plugin/gpus/fake_probe.py format) with ``text``."""
        staged = self.fake_nvml.with_suffix(".staged")
        staged.write_text(text)
        staged.replace(self.fake_nvml)  # atomic: the plugin never reads half a file

    @property
    def cdi_dir(self) -> Path:
        """The kubelet node's CDI spec directory, this cluster's own: the device plugin writes a spec file there
        per container it answers, and the fake runtime applies them (its default directory, ``cdi`` beside its
        record: tests/e2e/fake_cri/main.go), as containerd or CRI-O would."""
        assert self.node is not None
        return self.node.creates_log.parent / "cdi"

    @property
    def mps_dir(self) -> Path:
        """The kubelet node's MPS directories (pipe/, log/, shm/) while its plugin runs the MPS backend."""
        assert self.node is not None
        return self.node.root / "mps"

    def start_device_plugin(self, mps_control: Path | None = None) -> None:
        """On the kubelet node. A GPU's health check runs every second; a failed GPU is healthy
        again after 2 s of passing checks (defaults 5 s and 60 s), so scenarios see both flips. Its
        /metrics and /usage are at ``plugin_metrics_port`` (every address), sampled every
        :data:`PLUGIN_USAGE_INTERVAL` seconds. HAMi-core is its backend, unless ``mps_control`` is given: then
        MPS, with that program as NVIDIA's control daemon and its directories under :attr:`mps_dir`."""
        assert self.node is not None
        backend = EnforcementBackend.HAMI_CORE if mps_control is None else EnforcementBackend.MPS
        mps = [
            f"--mps-control={mps_control}",
            f"--mps-pipe-host={self.mps_dir / 'pipe'}",
            f"--mps-log-dir={self.mps_dir / 'log'}",
            f"--mps-shm-host={self.mps_dir / 'shm'}",
        ]
        self._ours(
            "tf-device-plugin",
            [
                str(VENV_BIN / "tf-device-plugin"),
                f"--node-name={REAL_NODE}",
                f"--fake-gpus={self.fake_nvml}",
                f"--plugin-dir={self.node.device_plugin_dir}",
                f"--podresources-socket={self.node.pod_resources_socket}",
                f"--slices-per-gpu={SLICES_PER_GPU}",
                f"--backend={backend.value}",
                *(mps if mps_control is not None else []),
                f"--cdi-dir={self.cdi_dir}",
                f"--nvidia-toolkit-config={self.node.toolkit_config}",
                "--nvidia-cdi-dirs=",
                f"--toolkit-check-interval={TOOLKIT_CHECK_INTERVAL}",
                "--health-check-interval=1",
                "--health-recovery=2",
                f"--metrics-port={self.plugin_metrics_port}",  # on every address: tf-metrics reaches it off loopback
                f"--usage-interval={PLUGIN_USAGE_INTERVAL}",
                f"--compute-overuse-window={PLUGIN_COMPUTE_WINDOW}",
                f"--live-limits-dir={self.live_limits_dir}",
                f"--receipts-file={self.root / 'handoff' / 'receipts.json'}",
                f"--kubeconfig={self.kubeconfigs['device-plugin']}",
            ],
        )
        if self.live_limits_dir not in LIVE_LIMITS_DIRS:
            LIVE_LIMITS_DIRS.append(self.live_limits_dir)

    def start_metrics_api(self) -> Proc:
        """tf-metrics as the shipped APIServices' server, reached through the API server's aggregation layer.

        It listens on this machine's non-loopback address (an EndpointSlice refuses loopback), with a serving
        certificate for the shipped Service's name; that Service gets an EndpointSlice there, the device
        plugins' metrics Service one at the kubelet node's plugin, and the shipped APIServices are applied
        with the test CA as caBundle. Polls the plugins every :data:`METRICS_API_INTERVAL` seconds. Undone by
        :meth:`stop_metrics_api`."""
        assert self.cp is not None and self.cp.pki is not None
        address = non_loopback_ipv4()
        if address is None:
            raise StartupError(
                "tf-metrics needs a non-loopback IPv4 address: an EndpointSlice cannot point at loopback"
            )
        served = deploy.service("-metrics-api")
        plugins = deploy.service("-device-plugin-metrics")
        meta = served["metadata"]
        cert, key = serving_cert(self.cp.pki, "metrics-api", (f"{meta['name']}.{meta['namespace']}.svc",))
        self.metrics_api_address, self.metrics_api_port = address, free_port()
        proc = self._ours(
            "tf-metrics",
            [
                str(VENV_BIN / "tf-metrics"),
                f"--host={address}",
                f"--port={self.metrics_api_port}",
                f"--tls-cert-file={cert}",
                f"--tls-key-file={key}",
                f"--kubeconfig={self.kubeconfigs['metrics-api']}",
                f"--plugin-namespace={plugins['metadata']['namespace']}",
                f"--plugin-service={plugins['metadata']['name']}",
                f"--interval={METRICS_API_INTERVAL}",
            ],
        )
        wait_until("tf-metrics port", partial(tcp_listening, self.metrics_api_port, address), 60, [proc])
        self._endpoint(served, address, self.metrics_api_port)
        self._endpoint(plugins, address, self.plugin_metrics_port, REAL_NODE)
        services = deploy.api_services(self.cp.pki.ca_crt)
        apply(self.admin, services)
        registration = ApiregistrationV1Api(self.admin)

        def available() -> bool:
            for doc in services:
                status = registration.read_api_service(doc["metadata"]["name"]).status
                if not any(c.type == "Available" and c.status == "True" for c in status.conditions or ()):
                    return False
            return True

        wait_until("the custom metrics APIServices Available", available, 60, [proc])
        return proc

    @contextmanager
    def beside(self, name: str, companion: Companion) -> Iterator[None]:
        """Run another project's controller (Kueue, Karpenter) for the block; while it runs, its log is shown
        with the cluster's when a test fails."""
        try:
            companion.start()
            assert companion.proc is not None
            self.ours[name] = companion.proc
            yield
        finally:
            companion.stop()
            self.ours.pop(name, None)

    def stop_metrics_api(self) -> None:
        """Unregister the APIServices (a group without a server fails every client's discovery), stop tf-metrics."""
        assert self.cp is not None and self.cp.pki is not None
        registration = ApiregistrationV1Api(self.admin)
        for doc in deploy.api_services(self.cp.pki.ca_crt):
            registration.delete_api_service(doc["metadata"]["name"])
        self.ours.pop("tf-metrics").stop()

    def _endpoint(self, shipped: dict[str, Any], address: str, port: int, node: str | None = None) -> None:
        """The shipped Service without its selector, and one EndpointSlice for it at ``address:port`` (on
        ``node``): what the endpointslice controller would write for a pod there, for a process of ours."""
        meta = shipped["metadata"]
        (port_spec,) = shipped["spec"]["ports"]
        spec = {"ports": [{"name": port_spec["name"], "port": port_spec["port"], "targetPort": port}]}
        if shipped["spec"].get("clusterIP") == "None":
            spec["clusterIP"] = "None"
        endpoint: dict[str, Any] = {"addresses": [address], "conditions": {"ready": True}}
        if node is not None:
            endpoint["nodeName"] = node
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{meta['name']}-e2e",
                "namespace": meta["namespace"],
                "labels": {
                    "kubernetes.io/service-name": meta["name"],
                    "endpointslice.kubernetes.io/managed-by": "tf-e2e",
                },
            },
            "addressType": "IPv4",
            "endpoints": [endpoint],
            "ports": [{"name": port_spec["name"], "port": port, "protocol": "TCP"}],
        }
        apply(self.admin, [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": meta["name"],
                            "namespace": meta["namespace"]}, "spec": spec}, slice_])  # fmt: skip

    def plugin_get(self, path: str) -> str:
        """The body of ``GET path`` on the kubelet node's device plugin (``/metrics``, ``/usage``)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.plugin_metrics_port}{path}", timeout=5) as answer:
            return str(answer.read().decode())

    def tamper_count(self) -> float:
        """How many live-limits tamperings the kubelet node's device plugin has counted (its /metrics)."""
        for family in text_string_to_metric_families(self.plugin_get("/metrics")):
            for s in family.samples:
                if s.name == ERRORS.name and s.labels.get("where") == WHERE_TAMPER:
                    return float(s.value)
        return 0.0

    def restart_device_plugin(
        self,
        published: Callable[[inventory.NodeInventory], bool],
        fake_gpus: str | None = None,
        mps_control: Path | None = None,
    ) -> None:
        """Stop the kubelet node's device plugin, replace its fake GPU file with ``fake_gpus`` (when given), start
        it again (on the MPS backend with ``mps_control``), and wait until its inventory is ``published`` and the
        node is ready."""
        self.ours["tf-device-plugin"].stop()
        if fake_gpus is not None:
            self.write_fake_nvml(fake_gpus)
        self.start_device_plugin(mps_control)
        eventually("the plugin's new inventory", lambda: published(inventory_of(self.core)) or None, timeout=90)
        self.wait_node_ready(REAL_NODE)

    def wait_node_ready(self, name: str, timeout: float = 90) -> Any:
        """Ready, our devices advertised, and the kubelet's initial not-ready taint cleared."""

        def ready() -> Any:
            n = self.core.read_node(name)
            conditions = {c.type: c.status for c in (n.status.conditions or [])}
            vgpu = int((n.status.allocatable or {}).get(RESOURCE_VGPU, "0"))
            return n if conditions.get("Ready") == "True" and vgpu > 0 else None

        node = eventually(f"node {name} Ready with {RESOURCE_VGPU}", ready, timeout)
        untaint_not_ready(self.core, name)
        return node

    def extender_metric(self, sample: str) -> float:
        """One sample of the extender's /metrics (``name{labels}``), 0 when absent."""
        url = f"http://127.0.0.1:{self.extender_public_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    def add_fake_node(
        self,
        name: str,
        gpus: tuple[FakeGpu, ...],
        pool: str = DEFAULT_POOL,
        backend: EnforcementBackend = EnforcementBackend.HAMI_CORE,
    ) -> None:
        """A Node without a kubelet, in ``pool``, whose inventory the device plugin's identity writes."""
        self.ensure_pool(pool)
        add_fake_node(self.admin, api_client(self.kubeconfigs["device-plugin"]), name, gpus, pool, backend)

    def ensure_pool(self, pool: str) -> None:
        """The GPUPool an operator creates before nodes join it (the default one is deploy/examples/')."""
        shipped = [d for d in deploy.examples() if d["kind"] == KIND_GPU_POOL and d["metadata"]["name"] == pool]
        selector = {"nodeSelector": {LABEL_NODE_POOL: pool}}
        doc = shipped[0] if shipped else {"apiVersion": f"{CRD_GROUP}/{CRD_VERSION}", "kind": KIND_GPU_POOL,
                                          "metadata": {"name": pool}, "spec": selector}  # fmt: skip
        apply(self.admin, [doc])

    def namespace(self, name: str) -> str:
        ensure_namespace(self.admin, name)
        return name

    def grant_qos(self, namespace: str, qos: Qos) -> None:
        """What an operator does to let a namespace's pods ask for ``qos`` (high or critical): the namespace label
        the shipped admission policy reads (docs/security.md, "QoS is a privilege")."""
        CoreV1Api(self.admin).patch_namespace(namespace, {"metadata": {"labels": {LABEL_NAMESPACE_MAX_QOS: qos.value}}})

    def grant_tenant(self, namespace: str, role: str) -> CoreV1Api:
        """The tenant user gets the ClusterRole ``role`` (edit, view…) in ``namespace``, as a team would; the API
        as that user sees it."""
        binding = {
            "metadata": {"name": f"tenant-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT}],
        }
        RbacAuthorizationV1Api(self.admin).create_namespaced_role_binding(namespace, binding)
        return CoreV1Api(api_client(self.tenant_kubeconfig))

    def stop(self) -> None:
        for proc in reversed(list(self.ours.values())):
            proc.stop()
        if self.live_limits_dir in LIVE_LIMITS_DIRS:
            LIVE_LIMITS_DIRS.remove(self.live_limits_dir)
        if self.node is not None:
            self.node.stop()
        if self.cp is not None:
            self.cp.stop()
        leftover = [f"{p.name} (pid {p.pid})" for p in self.all_procs() if p.alive()]
        if leftover:
            print(
                f"tf-e2e: still running after SIGKILL: {', '.join(leftover)}; logs kept in {self.root}", file=sys.stderr
            )
        elif not self.keep_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def all_procs(self) -> list[Proc]:
        procs = list(self.ours.values())
        procs += self.node.procs if self.node else []
        procs += self.cp.procs if self.cp else []
        return procs

    def dump_logs(self, lines: int = 60) -> None:
        for proc in self.all_procs():
            print(f"\n----- {proc.name}: {proc.log} (last {lines} lines)\n{tail(proc.log, lines)}", file=sys.stderr)


def inventory_of(core: CoreV1Api) -> inventory.NodeInventory:
    """The kubelet node's GPU inventory, as its device plugin last published it."""
    return inventory.decode(core.read_node(REAL_NODE).metadata.annotations[inventory.KEY])


def vgpu_allocatable(core: CoreV1Api) -> int:
    """The vGPU device IDs the kubelet node offers now (its healthy GPUs' slices)."""
    return int((core.read_node(REAL_NODE).status.allocatable or {}).get(RESOURCE_VGPU, "0"))
