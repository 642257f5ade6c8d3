"""The real Kueue controller manager beside the e2e cluster, started only by the scenarios that need it.

WHY: whether a queue of GPU-share Jobs is admitted whole, in order and within quota is Kueue's decision
on what our webhook puts in a Job's pod template (docs/kueue.md); only the real controller shows it.
``scripts/build-kueue.sh`` builds it from its Go module into the cache beside the Kubernetes binaries,
with its CRDs and webhook configurations taken from the same module. Here it runs as
``docs/kueue.md`` asks, with the batch/v1 Job integration only, and the rest cut to what a loopback
cluster can serve:

- its webhooks are served on loopback with a serving pair the cluster CA signs, and registered by URL
  with that CA, as our own webhook is (``deploy.webhook_configurations``); only the entries of what it
  serves (Jobs and its own kinds): an entry of a disabled integration would fail every such create;
- its internal certificate management is off (it would sign for its in-cluster Service name, which a
  loopback URL does not match); it then reads a metrics serving pair from the fixed path
  ``/etc/kueue/metrics/certs``, so it runs under ``unshare -m`` with a scratch copy bind-mounted there
  (the kubelet's device-plugin directory is handled so: node.py), and serves no metrics;
- its on-demand visibility API is off (an aggregated API with certificates at a fixed path; nothing reads it);
- no leader election (one replica), and it runs as the admin: its RBAC is Kueue's, not under test.
The CRDs are applied without their conversion webhooks: everything here speaks v1beta2, Kueue's storage
version. :meth:`Kueue.stop` unregisters its webhooks before stopping it, so the Jobs of later scenarios never
meet a webhook with no server behind it.
"""

from __future__ import annotations

import base64
import copy
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import AdmissionregistrationV1Api, ApiClient, ApiextensionsV1Api

from .kube import apply, eventually, load_docs
from .pki import Pki, serving_cert
from .procs import REPO, Proc, build, free_port, http_ok, wait_until

BUILD_SCRIPT = REPO / "scripts" / "build-kueue.sh"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
METRICS_CERTS = Path("/etc/kueue/metrics/certs")  # where Kueue reads them without its own cert management
NAMESPACE = "kueue-system"
# The paths of the webhook entries Kueue serves with only the batch/v1 Job integration enabled.
SERVED = ("/mutate-batch-v1-job", "/validate-batch-v1-job", "-kueue-x-k8s-io-")


def webhook_configurations(config: Path, base_url: str, ca: Path) -> list[dict[str, Any]]:
    """Kueue's shipped webhook configurations with only the entries it serves here, each calling ``base_url``
    plus its shipped path and trusting ``ca``; named as Kueue's own kustomization names them."""
    bundle = base64.b64encode(ca.read_bytes()).decode()
    out = []
    for doc in load_docs([config / "webhooks.yaml"]):
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
        hooks = [h for h in doc["webhooks"] if any(s in h["clientConfig"]["service"]["path"] for s in SERVED)]
        for hook in hooks:
            hook["clientConfig"] = {"url": base_url + hook["clientConfig"]["service"]["path"], "caBundle": bundle}
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def _established(crd: Any) -> bool:
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or ())


@dataclass
class Kueue:
    """``Kueue(admin, pki, root, admin_kubeconfig).start()`` runs it against the cluster; :meth:`stop` undoes it."""

    admin: ApiClient
    pki: Pki
    root: Path
    kubeconfig: Path
    proc: Proc | None = None
    webhooks: list[dict[str, Any]] = field(default_factory=list)

    def start(self) -> Kueue:
        built_dir = build(BUILD_SCRIPT)
        config = built_dir / "config"
        crds = load_docs(sorted((config / "crd").glob("*.yaml")))
        apply(self.admin, crds)
        extensions = ApiextensionsV1Api(self.admin)
        for crd in crds:  # Kueue's caches need every kind served before it starts
            name = crd["metadata"]["name"]
            eventually(
                f"CRD {name} Established",
                lambda name=name: _established(extensions.read_custom_resource_definition(name)),
            )
        certs = self.root / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        cert, key = serving_cert(self.pki, "kueue-webhook")
        shutil.copy(cert, certs / "tls.crt")
        shutil.copy(key, certs / "tls.key")
        webhook_port, health_port = free_port(), free_port()
        settings = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": ["batch/job"]},
            "featureGates": {"VisibilityOnDemand": False},
        }
        (self.root / "config.yaml").write_text(yaml.safe_dump(settings))
        mount = f'mkdir -p {METRICS_CERTS} && mount --bind "$0" {METRICS_CERTS} && exec "$@"'
        argv = ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", mount, str(certs),
                str(built_dir / "bin" / "kueue"), f"--config={self.root / 'config.yaml'}",
                f"--kubeconfig={self.kubeconfig}", "--zap-log-level=2"]  # fmt: skip
        self.proc = Proc("kueue", argv, self.root / "kueue.log").start()
        wait_until("kueue /readyz", lambda: http_ok(f"http://127.0.0.1:{health_port}/readyz"), 120, [self.proc])
        self.webhooks = webhook_configurations(config, f"https://127.0.0.1:{webhook_port}", self.pki.ca_crt)
        apply(self.admin, self.webhooks)
        return self

    def stop(self) -> None:
        registration = AdmissionregistrationV1Api(self.admin)
        for doc in self.webhooks:
            name = doc["metadata"]["name"]
            if doc["kind"] == "MutatingWebhookConfiguration":
                registration.delete_mutating_webhook_configuration(name)
            else:
                registration.delete_validating_webhook_configuration(name)
        self.webhooks = []
        if self.proc is not None:
            self.proc.stop()
