"""Kueue (issue 31): a queue of GPU-share Jobs admitted whole, in order and within a ClusterQueue's quota in
TFLOPS and VRAM, then placed by our scheduler — with the real Kueue controller (kueue.py) on the real binaries.

Two kubelet-less nodes with 2 A100s each make the pool ``e2e-kueue``; a ResourceFlavor for the pool, a
StrictFIFO ClusterQueue with 200 TFLOPS, 40 GiB and 8 vGPUs of it, a LocalQueue. Four Jobs, created in this
order, ask per pod (one GPU each) for:

    j1: 2 pods x 50 TFLOPS / 10 GiB    j2: 2 x 40 / 8    j3: 3 x 30 / 6    j4: 1 x 10 / 2

j1 and j2 (180 TFLOPS, 36 GiB) are admitted; j3 would take the queue to 270 and 54, so it waits suspended
with no pod, and j4, which would fit, waits behind it (strict FIFO). Once j1's pods finish, j3 and j4 are
admitted. The test plays the kubelet of the kubelet-less nodes: it writes each bound pod's hand-off receipt
(pods.hand_over) and marks a finished Job's pods Succeeded. A watch on the namespace's pods sums the
allocations of the bound, unfinished pods after every event: it never exceeds the quota.

Then a ResourceFlavor per GPU model (an A100 node and an H100 node): the Job Kueue assigns the H100 flavor
runs on the H100, and a Job whose pod template is refused at creation, naming the key.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from kubernetes import watch
from kubernetes.client import ApiException, BatchV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.dynamic import DynamicClient
from kubernetes.utils import parse_quantity

from tf_shell.kube.client import api_client
from vgpu.names import (
    CRD_GROUP,
    CRD_VERSION,
    LABEL_ENABLED,
    LABEL_NODE_GPU_MODEL,
    LABEL_NODE_POOL,
    PLURAL_GPU_POOL,
    RESOURCE_MILLI_TFLOPS,
    RESOURCE_VGPU,
    RESOURCE_VRAM,
    SCHEDULER_NAME,
    Annotation,
)

from .cluster import Cluster
from .fake_nodes import gpus
from .kube import apply, emptied, eventually
from .kueue import BUILD_SCRIPT, GROUP, VERSION, Kueue
from .pods import IMAGE, allocation_of, hand_over
from .procs import REPO, cached

COLD_BUILD_TIMEOUT = 1800  # scripts/build-kueue.sh cold: about 8 minutes on 2 cores
pytestmark = pytest.mark.timeout(300 if cached(BUILD_SCRIPT) else COLD_BUILD_TIMEOUT)

POOL = "e2e-kueue"
NODES = ("e2e-kueue-0", "e2e-kueue-1")
QUEUE, CLUSTER_QUEUE = "gpu-team", "e2e-gpu-share"
MODELS_POOL, MODELS_QUEUE = "e2e-kueue-models", "e2e-gpu-models"
GI = 1024**3
QUOTA = {RESOURCE_MILLI_TFLOPS: 200_000, RESOURCE_VRAM: 40 * GI, RESOURCE_VGPU: 8}


@dataclass(frozen=True)
class Ask:
    name: str
    pods: int
    tflops: int
    vram_gi: int

    def totals(self) -> dict[str, int]:
        per_pod = {RESOURCE_MILLI_TFLOPS: self.tflops * 1000, RESOURCE_VRAM: self.vram_gi * GI, RESOURCE_VGPU: 1}
        return {k: v * self.pods for k, v in per_pod.items()}


J1, J2, J3, J4 = Ask("j1", 2, 50, 10), Ask("j2", 2, 40, 8), Ask("j3", 3, 30, 6), Ask("j4", 1, 10, 2)


def job(ask: Ask, pool: str = POOL) -> dict[str, Any]:
    """A Job as a user writes it for Kueue: the queue's label on the Job, our label and annotations on its pods."""
    annotations = {Annotation.TFLOPS_REQUEST: str(ask.tflops), Annotation.VRAM_REQUEST: f"{ask.vram_gi}Gi",
                   Annotation.GPUPOOL: pool}  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": ask.name, "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
        "spec": {
            "parallelism": ask.pods,
            "completions": ask.pods,
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "labels": {LABEL_ENABLED: "true"},
                    "annotations": {str(k): v for k, v in annotations.items()},
                },
                "spec": {
                    "containers": [{"name": "main", "image": IMAGE}],
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }


def queues(
    namespace: str, name: str, flavors: dict[str, tuple[dict[str, str], dict[str, int]]]
) -> list[dict[str, Any]]:
    """ResourceFlavors (name: (nodeLabels, quota)), a StrictFIFO ClusterQueue ``name`` with one resource group of
    them in that order, and the LocalQueue QUEUE of ``namespace`` pointing at it."""
    docs: list[dict[str, Any]] = [
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": flavor},
         "spec": {"nodeLabels": labels}}
        for flavor, (labels, _) in flavors.items()
    ]  # fmt: skip
    group = {
        "coveredResources": list(QUOTA),
        "flavors": [
            {"name": flavor, "resources": [{"name": k, "nominalQuota": str(v)} for k, v in quota.items()]}
            for flavor, (_, quota) in flavors.items()
        ],
    }
    spec = {"namespaceSelector": {}, "queueingStrategy": "StrictFIFO", "resourceGroups": [group]}
    docs.append({"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec})
    docs.append({"apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue",
                 "metadata": {"name": QUEUE, "namespace": namespace}, "spec": {"clusterQueue": name}})  # fmt: skip
    return docs


def active(custom: CustomObjectsApi, name: str) -> None:
    eventually(f"the ClusterQueue {name} Active", lambda: condition(custom.get_cluster_custom_object(
        GROUP, VERSION, "clusterqueues", name), "Active").get("status") == "True")  # fmt: skip


def cleaned(cluster: Cluster, namespace: str, nodes: tuple[str, ...], docs: list[dict[str, Any]]) -> None:
    """The Jobs, their pods, the nodes and the cluster-scoped Kueue objects of a scenario, gone."""
    BatchV1Api(cluster.admin).delete_collection_namespaced_job(namespace, propagation_policy="Background")
    emptied(cluster.core, namespace)
    for node in nodes:
        cluster.core.delete_node(node)
    custom = CustomObjectsApi(cluster.admin)
    scoped = [
        (f"{d['kind'].lower()}s", d["metadata"]["name"])
        for d in docs
        if d["kind"] in ("ClusterQueue", "ResourceFlavor")
    ]
    for plural, name in scoped:
        custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)

    def gone(plural: str, name: str) -> bool:
        try:
            custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    # Kueue's finalizers hold a ResourceFlavor while a ClusterQueue names it: the next scenario may reuse the name.
    for plural, name in scoped:
        eventually(f"{plural} {name} gone", lambda plural=plural, name=name: gone(plural, name), timeout=60)


@dataclass
class Ledger:
    """Every pod of the namespace from one watch: writes each bound pod's hand-off receipt (what the device
    plugin of a real node would), and keeps the most TFLOPS and VRAM the bound, unfinished pods held at once
    according to their allocations, after every event."""

    core: CoreV1Api
    plugin: CoreV1Api
    namespace: str
    pods: dict[str, Any] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=lambda: {RESOURCE_MILLI_TFLOPS: 0, RESOURCE_VRAM: 0})
    handed: set[str] = field(default_factory=set)
    done: threading.Event = field(default_factory=threading.Event)
    failure: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, name="kueue-ledger", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            version = self.core.list_namespaced_pod(self.namespace).metadata.resource_version
            while not self.done.is_set():
                stream = watch.Watch().stream(
                    self.core.list_namespaced_pod, self.namespace, resource_version=version, timeout_seconds=2
                )
                for event in stream:
                    pod = event["object"]
                    version = pod.metadata.resource_version
                    self._see(event["type"], pod)
        except BaseException as exc:  # shown by stop(), in the test's thread
            self.failure.append(exc)

    def _see(self, kind: str, pod: Any) -> None:
        name = pod.metadata.name
        if kind == "DELETED":
            self.pods.pop(name, None)
            return
        self.pods[name] = pod
        if pod.spec.node_name and pod.metadata.uid not in self.handed:
            hand_over(self.plugin, pod)
            self.handed.add(pod.metadata.uid)
        held = {RESOURCE_MILLI_TFLOPS: 0, RESOURCE_VRAM: 0}
        for bound in self.pods.values():
            if bound.spec.node_name and bound.status.phase not in ("Succeeded", "Failed"):
                for grant in allocation_of(bound).gpus:
                    held[RESOURCE_MILLI_TFLOPS] += grant.tflops_request
                    held[RESOURCE_VRAM] += grant.vram_request
        self.peak = {k: max(v, held[k]) for k, v in self.peak.items()}

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)
        if self.failure:
            raise self.failure[0]


def job_pods(core: CoreV1Api, namespace: str, ask: Ask) -> list[Any]:
    return list(core.list_namespaced_pod(namespace, label_selector=f"job-name={ask.name}").items)


def all_bound(core: CoreV1Api, namespace: str, ask: Ask) -> list[Any] | None:
    pods = job_pods(core, namespace, ask)
    return pods if len(pods) == ask.pods and all(p.spec.node_name for p in pods) else None


def workload(custom: CustomObjectsApi, namespace: str, ask: Ask) -> dict[str, Any]:
    items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")["items"]
    (found,) = [w for w in items if any(o["name"] == ask.name for o in w["metadata"].get("ownerReferences", ()))]
    return found


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", ()) if c["type"] == kind), {})


def admitted_at(custom: CustomObjectsApi, namespace: str, ask: Ask) -> str:
    """When Kueue reserved the quota of the Job's workload (RFC 3339, in seconds)."""
    reservation = condition(workload(custom, namespace, ask), "QuotaReserved")
    assert reservation["status"] == "True", reservation
    return str(reservation["lastTransitionTime"])


def reserved(custom: CustomObjectsApi) -> dict[str, int]:
    """What the ClusterQueue has reserved for admitted workloads, per resource."""
    status = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", CLUSTER_QUEUE).get("status", {})
    (flavor,) = status.get("flavorsReservation") or [{"resources": []}]
    return {r["name"]: int(parse_quantity(r["total"])) for r in flavor["resources"]}


def held(custom: CustomObjectsApi, *asks: Ask) -> None:
    """Wait until the ClusterQueue's status (written a moment after admissions) reserves exactly ``asks``."""
    wanted = {k: sum(ask.totals()[k] for ask in asks) for k in QUOTA}
    eventually(f"the ClusterQueue reserving {wanted}", lambda: reserved(custom) == wanted, timeout=30)


def finish(core: CoreV1Api, batch: BatchV1Api, namespace: str, ask: Ask) -> None:
    """What the kubelet of a real node writes when every container of the Job's pods exited 0; then the Job
    controller marks the Job Complete."""
    for pod in job_pods(core, namespace, ask):
        core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {"phase": "Succeeded"}})

    def complete() -> bool:
        return any(c.type == "Complete" and c.status == "True" for c in batch.read_namespaced_job(ask.name,
                   namespace).status.conditions or ())  # fmt: skip

    eventually(f"job {ask.name} Complete", complete, timeout=60)


@pytest.fixture(scope="module")
def kueue(cluster: Cluster) -> Iterator[Kueue]:
    """Kueue for this module only; its log is shown with the cluster's when a test fails."""
    assert cluster.cp is not None and cluster.cp.pki is not None
    running = Kueue(cluster.admin, cluster.cp.pki, cluster.root / "kueue", cluster.cp.kubeconfig("admin"))
    with cluster.beside("kueue", running):
        yield running


def test_a_job_with_a_bad_pod_template_is_refused_when_created(kueue: Kueue, cluster: Cluster, fresh: str) -> None:
    cluster.ensure_pool(POOL)
    bad = job(J1)
    bad["spec"]["template"]["metadata"]["annotations"][Annotation.TFLOPS_REQUEST] = "lots"
    with pytest.raises(ApiException) as refused:
        BatchV1Api(cluster.admin).create_namespaced_job(fresh, bad)
    assert refused.value.status == 400
    message = json.loads(refused.value.body)["message"]
    assert message.startswith(
        f'admission webhook "jobs.tensor-fusion.ai" denied the request: spec.template: {Annotation.TFLOPS_REQUEST} '
        "'lots': "
    ), message


def test_a_queue_of_gpu_share_jobs_is_admitted_whole_in_order_within_quota(
    kueue: Kueue, cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    batch, custom = BatchV1Api(cluster.admin), CustomObjectsApi(cluster.admin)
    plugin = CoreV1Api(api_client(str(cluster.kubeconfigs["device-plugin"])))
    for node in NODES:
        cluster.add_fake_node(node, gpus(node, 2), pool=POOL)
    docs = queues(fresh, CLUSTER_QUEUE, {POOL: ({LABEL_NODE_POOL: POOL}, QUOTA)})
    apply(cluster.admin, docs)
    active(custom, CLUSTER_QUEUE)
    ledger = Ledger(core, plugin, fresh)
    try:
        for ask in (J1, J2, J3, J4):
            created = batch.create_namespaced_job(fresh, job(ask))
            assert created.spec.suspend is True  # Kueue's webhook: it waits for admission
            (main,) = created.spec.template.spec.containers  # our webhook: the pods' shares, as Kueue counts them
            per_pod = {k: v // ask.pods for k, v in ask.totals().items()}
            assert {k: int(parse_quantity(v)) for k, v in main.resources.requests.items()} == per_pod, main.resources
            time.sleep(1.1)  # Kueue orders by creation time, in seconds

        for ask in (J1, J2):
            eventually(f"{ask.name}'s {ask.pods} pods bound", lambda ask=ask: all_bound(core, fresh, ask), 90)
        message = eventually(f"{J3.name} pending on quota", lambda: condition(workload(custom, fresh, J3),
                             "QuotaReserved").get("message"))  # fmt: skip
        assert "insufficient unused quota" in message, message
        time.sleep(3)  # Kueue's cycles run every few ms: j4 would have been admitted by now if it could
        for ask in (J3, J4):
            assert batch.read_namespaced_job(ask.name, fresh).spec.suspend is True
            assert job_pods(core, fresh, ask) == [], f"{ask.name} is queued, yet has pods"
            assert "admission" not in workload(custom, fresh, ask).get("status", {})
        held(custom, J1, J2)
        times = [admitted_at(custom, fresh, ask) for ask in (J1, J2)]
        for ask in (J1, J2):
            for pod in job_pods(core, fresh, ask):
                grants = allocation_of(pod)
                assert pod.spec.scheduler_name == SCHEDULER_NAME and pod.spec.node_name in NODES
                assert pod.spec.node_selector == {LABEL_NODE_POOL: POOL}  # the flavor's, put there by Kueue
                assert grants.pool == POOL and len(grants.gpus) == 1
                assert (grants.gpus[0].tflops_request, grants.gpus[0].vram_request) == (ask.tflops * 1000,
                                                                                          ask.vram_gi * GI)  # fmt: skip

        finish(core, batch, fresh, J1)
        for ask in (J3, J4):
            eventually(f"{ask.name}'s {ask.pods} pods bound", lambda ask=ask: all_bound(core, fresh, ask), 90)
        held(custom, J2, J3, J4)
        times += [admitted_at(custom, fresh, ask) for ask in (J3, J4)]
        for ask in (J2, J3, J4):
            finish(core, batch, fresh, ask)
        eventually("the ClusterQueue empty", lambda: all(v == 0 for v in reserved(custom).values()), 60)
    finally:
        ledger.stop()
        cleaned(cluster, fresh, NODES, docs)

    assert times == sorted(times), times  # admitted in the order they were queued (RFC 3339: ordered as text)
    print(f"\nKueue: peak held {ledger.peak[RESOURCE_MILLI_TFLOPS] / 1000:g} TFLOPS, "
          f"{ledger.peak[RESOURCE_VRAM] / GI:g} GiB of a 200 TFLOPS / 40 GiB quota; admitted at {times}")  # fmt: skip
    assert ledger.peak[RESOURCE_MILLI_TFLOPS] == 180_000 and ledger.peak[RESOURCE_VRAM] == 36 * GI, ledger.peak


def test_a_job_lands_on_the_gpu_model_of_the_flavor_kueue_assigned(
    kueue: Kueue, cluster: Cluster, core: CoreV1Api, fresh: str
) -> None:
    """A ResourceFlavor per GPU model, in one resource group: Kueue gives the first Job the A100 flavor and the
    second, which no longer fits its quota, the H100 one; its nodeLabels become the pods' nodeSelector, which
    kube-scheduler applies before our extender places the pods (the Jobs name no model)."""
    batch, custom = BatchV1Api(cluster.admin), CustomObjectsApi(cluster.admin)
    plugin = CoreV1Api(api_client(str(cluster.kubeconfigs["device-plugin"])))
    nodes = {"a100": ("e2e-kueue-a100", "NVIDIA A100-SXM4-80GB"), "h100": ("e2e-kueue-h100", "NVIDIA H100 80GB HBM3")}
    flavors = {}
    for flavor, (node, product) in nodes.items():
        cluster.add_fake_node(node, gpus(node, 1, product), pool=MODELS_POOL)
        label = core.read_node(node).metadata.labels[LABEL_NODE_GPU_MODEL]  # the device plugin's label
        flavors[flavor] = ({LABEL_NODE_GPU_MODEL: label}, {RESOURCE_MILLI_TFLOPS: 100_000, RESOURCE_VRAM: 20 * GI,
                                                          RESOURCE_VGPU: 1})  # fmt: skip
    docs = queues(fresh, MODELS_QUEUE, flavors)
    apply(cluster.admin, docs)
    active(custom, MODELS_QUEUE)
    ledger = Ledger(core, plugin, fresh)
    first, second = Ask("m1", 1, 80, 10), Ask("m2", 1, 80, 10)
    try:
        for ask, flavor in ((first, "a100"), (second, "h100")):
            batch.create_namespaced_job(fresh, job(ask, MODELS_POOL))
            (pod,) = eventually(f"{ask.name}'s pod bound", lambda ask=ask: all_bound(core, fresh, ask), 90)
            (assigned,) = workload(custom, fresh, ask)["status"]["admission"]["podSetAssignments"]
            assert set(assigned["flavors"].values()) == {flavor}, assigned
            assert pod.spec.node_selector == flavors[flavor][0] and pod.spec.node_name == nodes[flavor][0]
            assert [g.uuid for g in allocation_of(pod).gpus] == [gpus(nodes[flavor][0], 1)[0].uuid]
    finally:
        ledger.stop()
        cleaned(cluster, fresh, tuple(node for node, _ in nodes.values()), docs)


def test_the_docs_example_is_accepted_as_written(kueue: Kueue, cluster: Cluster) -> None:
    """docs/kueue.md's example, created as a dry run: through every admission step, Kueue's webhooks and ours,
    with nothing stored; its Job's template comes back with the shares the page says Kueue counts."""
    (block,) = re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "kueue.md").read_text(), re.DOTALL)
    examples = [doc for doc in yaml.safe_load_all(block) if doc]
    namespace, pool = "team-a", "training-pool"  # what the example names
    cluster.namespace(namespace)
    cluster.ensure_pool(pool)
    dyn = DynamicClient(cluster.admin)
    try:
        answers = {}
        for doc in examples:
            resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            answer = resource.create(body=doc, namespace=doc["metadata"].get("namespace"), dry_run="All")
            answers[doc["kind"]] = answer.to_dict()
        assert set(answers) == {"ResourceFlavor", "ClusterQueue", "LocalQueue", "Job"}, set(answers)
        job = answers["Job"]
        assert job["spec"]["suspend"] is True  # Kueue's webhook
        (container,) = job["spec"]["template"]["spec"]["containers"]
        requests = {k: int(parse_quantity(v)) for k, v in container["resources"]["requests"].items()}
        assert requests == {"cpu": 4, "memory": 16 * GI, RESOURCE_MILLI_TFLOPS: 50_000, RESOURCE_VRAM: 10 * GI,
                            RESOURCE_VGPU: 1}  # fmt: skip
    finally:
        CustomObjectsApi(cluster.admin).delete_cluster_custom_object(CRD_GROUP, CRD_VERSION, PLURAL_GPU_POOL, pool)
        cluster.core.delete_namespace(namespace)
