"""``scripts/demo``: a local cluster with fake GPU nodes runs deploy/examples/, then shows what each pod got.

The example Deployment lands on the kubelet node (4 fake A100s in the default pool) and runs; one
more pod asks for an H100 in a second pool of two kubelet-less nodes, to show model and pool
selection (it is placed and granted a share, but no kubelet runs it).

WHY: the first thing a newcomer runs. It uses the same cluster as the end-to-end tests (real
API server, scheduler, kubelet; our webhook, extender and device plugin), so what it prints is
what the tests check: pod → node, GPU UUID, TFLOPS and VRAM granted, and the env one container
was created with, what the device plugin measured of each running container's GPU use (scripted in
the fake GPU file, read back from its ``/usage``), and the status the extender wrote on the generated
TensorFusionWorkload; what a container that rewrites its own live limits meets (put back, said on the pod,
counted for the alert); then
what a pod that tries to skip the scheduler meets (admission denies a preset node; a pod bound by
hand is admitted by the kubelet but the device plugin refuses to start it), what a pod setting the plugin's
variables through envFrom gets (its grant), and what a pod that is not ours asking for every GPU by
environment gets (none: the node's NVIDIA toolkit is set as docs/security.md asks); and QoS preemption on
fragmented GPUs: the node's four GPUs each hold a high and a low pod, a critical pod fits the node's
totals but no single GPU, and the extender evicts one low pod and runs the critical one in its place;
and autoscaling: a Deployment with autoSetLimits, autoSetRequests and autoSetReplicas under a scripted
load gets its TFLOPS limit raised in place, is scaled out by the HPA the autoscaler owns, admits a new
replica with the recommended request, and comes back down when the load drops.
Everything is stopped before it returns.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes.client import ApiException, AppsV1Api, CoordinationV1Api, CoreV1Api, CustomObjectsApi

from device_plugin.cluster.node_events import (
    REASON_COMPUTE_OVERUSE,
    REASON_LIVE_LIMITS_RESTORED,
    REASON_VRAM_OVERUSE,
)
from device_plugin.cluster.receipts import ReceiptFile
from scheduler_extender.claim_board import lease_name
from vgpu.contract import allocation, usage
from vgpu.contract import claims as claims_contract
from vgpu.contract.allocation import decode_handoff
from vgpu.names import (
    CRD_GROUP,
    CRD_VERSION,
    LABEL_ENABLED,
    LABEL_NODE_DEVICE_DELIVERY,
    LABEL_NODE_ENVVAR_GUARD,
    LIVE_LIMITS_FILE,
    PLURAL_WORKLOAD,
    RESOURCE_MILLI_TFLOPS,
    Annotation,
    Env,
    Qos,
    SystemAnnotation,
)
from vgpu.quantity import format_bytes, format_milli, humanize_bytes, humanize_tflops, parse_milli

from . import deploy
from .autoscaling import (
    HIGH_SM,
    LOW_SM,
    NAMESPACE,
    PROFILE,
    WORKLOAD,
    Load,
    condition,
    deployment,
    live_limits,
    replicas_now,
    running,
    workload_status,
)
from .cluster import REAL_NODE, Cluster
from .fake_nodes import fake_nvml_yaml, gpus
from .kube import (
    api_client,
    apply,
    bind_by_hand,
    events_for,
    eventually,
    service_account_token,
    wait_bound,
    wait_running,
)
from .pods import IMAGE, allocation_of, created_env, created_gpus, gpu_pod, hand_over, rewrite_as_tenant
from .procs import non_loopback_ipv4

DEMO_POOL = "demo-pool"  # kubelet-less nodes: they hold a GPU share but never run the pod
DEMO_NOWHERE = "demo-no-nodes"  # a pool without nodes: a pod there waits for a Binding posted by hand


def rows(pods: Sequence[Any]) -> list[tuple[str, ...]]:
    out = [("POD", "NODE", "GPU", "TFLOPS req/limit", "VRAM req/limit", "PHASE")]
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        alloc = allocation_of(pod)
        for grant in alloc.gpus:
            out.append(
                (
                    pod.metadata.name,
                    pod.spec.node_name,
                    grant.uuid,
                    f"{format_milli(grant.tflops_request)}/{format_milli(grant.tflops_limit)}",
                    f"{format_bytes(grant.vram_request)}/{format_bytes(grant.vram_limit)}",
                    pod.status.phase,
                )
            )
    return out


def table(lines: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in lines)


def run(keep: bool) -> None:
    started = time.monotonic()
    with Cluster(gpus=gpus("demo0", 4), keep_root=keep) as cluster:
        kept = f" (logs kept under {cluster.root})" if keep else ""
        print(f"cluster up in {time.monotonic() - started:.0f}s{kept}")
        cluster.add_fake_node("demo-fake-a100", gpus("demo1", 2), pool=DEMO_POOL)
        cluster.add_fake_node("demo-fake-h100", gpus("demo2", 2, "NVIDIA H100 80GB HBM3"), pool=DEMO_POOL)
        docs = deploy.examples()
        apply(cluster.admin, docs)
        print(f"applied deploy/examples/: {', '.join(d['kind'] + '/' + d['metadata']['name'] for d in docs)}")
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        namespace = deployment["metadata"].get("namespace", "default")
        extra = gpu_pod("inference-h100", {Annotation.GPUPOOL: DEMO_POOL, Annotation.GPU_MODEL: "H100",
                                           Annotation.TFLOPS_REQUEST: "100", Annotation.VRAM_REQUEST: "20Gi"})  # fmt: skip
        cluster.core.create_namespaced_pod(namespace, extra)
        print(f"created pod/inference-h100 asking for an H100 in {DEMO_POOL} (its nodes have no kubelet)")
        replicas = int(deployment["spec"].get("replicas", 1))
        wanted = replicas + 1  # the Deployment's pods and inference-h100

        def placed() -> list[Any] | None:
            pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"{LABEL_ENABLED}=true").items
            done = [p for p in pods if allocation.KEY in (p.metadata.annotations or {})]
            done = [p for p in done if p.status.phase == "Running" or p.spec.node_name != REAL_NODE]
            return done if len(done) >= wanted else None

        pods = eventually(f"{wanted} GPU pods placed", placed, timeout=180)
        print()
        print(table(rows(pods)))
        running = sorted((p for p in pods if p.status.phase == "Running"), key=lambda p: p.metadata.name)
        if running:
            pod = running[0]
            container = allocation_of(pod).containers[0]
            env = created_env(cluster.node, pod, container)
            print(f"\nenv of {pod.metadata.name}/{container} as the kubelet created it (fake runtime's record):")
            for key in sorted(k for k in env if k.startswith(("NVIDIA_", "TENSOR_FUSION_", "CUDA_"))):
                print(f"  {key}={env[key]}")
            print(
                f"  GPUs the NVIDIA toolkit gives it (by volume mounts): {created_gpus(cluster.node, pod, container)}"
            )
            measured(cluster, running)
            side_doors(cluster, namespace)
            tampering(cluster, pod, container)
            past_its_limit(cluster, pod, container)
            lean_bind(cluster, running[0])
        workloads = CustomObjectsApi(cluster.admin)

        def workload_statuses() -> list[tuple[str, ...]] | None:
            items = workloads.list_namespaced_custom_object(CRD_GROUP, CRD_VERSION, namespace, PLURAL_WORKLOAD)["items"]
            found = [(w["metadata"]["name"], w.get("status") or {}) for w in items]
            if sum(s.get("replicas") or 0 for _, s in found) < replicas:  # the Deployment's workload
                return None  # the extender writes them within its status interval
            return [("NAME", "REPLICAS", "TFLOPS", "VRAM")] + [
                (n, str(s["replicas"]), str(s["allocatedTflops"]), str(s["allocatedVram"])) for n, s in found
            ]

        print(f"\nkubectl get tensorfusionworkloads -n {namespace} (status written by the extender):")
        print(table(eventually("workload status", workload_statuses, timeout=30)))
        skipping_the_scheduler(cluster, namespace)
        isolation_modes(cluster, namespace)
        compute_percent(cluster, namespace)
        preemption(cluster)
        autoscaling(cluster)
        print("\nstopping the cluster")
    print(f"demo took {time.monotonic() - started:.0f}s")


def lean_bind(cluster: Cluster, pod: Any) -> None:
    """What binding a GPU pod wrote: one pod write (the Binding, carrying the allocation), a claim on the node's
    claims Lease, and the receipt in a file on the node (scheduler_extender/HANDOFF.md, "Bind"); and how often
    the extender's filter chose the node alone."""
    lease = CoordinationV1Api(cluster.admin).read_namespaced_lease(lease_name(REAL_NODE), deploy.system_namespace())
    claims = claims_contract.decode((lease.metadata.annotations or {})[claims_contract.KEY])
    writers = sorted({f.manager for f in pod.metadata.managed_fields or () if f.operation == "Update"})
    receipts = ReceiptFile(cluster.root / "handoff" / "receipts.json").load()
    devices = dict(decode_handoff(receipts[pod.metadata.uid]).devices) if pod.metadata.uid in receipts else {}
    print(f"\nthe lean bind of pod/{pod.metadata.name}: its allocation came with its Binding (the pod's writers, from "
          f"its managedFields: {', '.join(writers) or 'none'}; none of ours); claims Lease {lease.metadata.name}: "
          f"{len(claims.claims)} bind(s) in flight, horizon {claims.horizon}; its hand-off receipt, in the "
          f"node's file: {devices}")  # fmt: skip
    passed = {k: int(cluster.extender_metric(f'tf_extender_filter_passes_total{{passed="{k}"}}'))
              for k in ("one", "tie", "every")}  # fmt: skip
    print(f"GPU pods' filter answers so far (deploy/README.md, \"GPU fit decides\"): {passed['one']} passed one node, "
          f"bound by kube-scheduler without scoring; {passed['tie']} a tie its own scores broke; {passed['every']} "
          "every fitting node (soft preferences), ranked by prioritize")  # fmt: skip


def isolation_modes(cluster: Cluster, namespace: str) -> None:
    """tensor-fusion.ai/isolation: a shared pod's container gets no compute cap; a hard pod finds no GPU serving
    hard (every GPU here runs HAMi-core) and waits, with the scheduler's reason."""
    print("\nisolation modes (docs/isolation.md): every GPU here runs HAMi-core, so serves shared and soft")
    share = {Annotation.TFLOPS_REQUEST: "10", Annotation.TFLOPS_LIMIT: "20", Annotation.VRAM_REQUEST: "2Gi"}
    shared = gpu_pod("isolation-shared", {**share, Annotation.ISOLATION: "shared"})
    shared["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    cluster.core.create_namespaced_pod(namespace, shared)
    cluster.core.create_namespaced_pod(namespace, gpu_pod("isolation-hard", {**share, Annotation.ISOLATION: "hard"}))
    env = created_env(cluster.node, wait_running(cluster.core, namespace, "isolation-shared"), "main")
    print(
        f"  pod/isolation-shared (20 TFLOPS limit): {Env.HAMI_SM_LIMIT}={env[Env.HAMI_SM_LIMIT]} (no compute cap), "
        f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0={env[f'{Env.HAMI_MEMORY_LIMIT_PREFIX}0']}"
    )

    def waiting() -> str | None:
        lines = [e for e in events_for(cluster.core, namespace, "isolation-hard") if "isolation hard" in e]
        return lines[0] if lines else None

    print(f"  pod/isolation-hard Pending: {eventually('the hard pod explained', waiting, timeout=30)}")


def compute_percent(cluster: Cluster, namespace: str) -> None:
    """compute-percent-request 50 (TensorFusion v2): the same share is half of an A100 on the kubelet node and half
    of an H100 in the demo pool, converted on the GPU each lands on; each is charged (its resource requests, what
    quota counts) the share of the largest GPU of its model in its pool."""
    print('\ncompute in percent of a GPU (docs/architecture.md, "Compute in percent"): two pods asking for 50')
    plugin = CoreV1Api(api_client(str(cluster.kubeconfigs["device-plugin"])))
    hand_over(plugin, cluster.core.read_namespaced_pod("inference-h100", namespace))  # its node has no kubelet
    half = {Annotation.COMPUTE_PERCENT_REQUEST: "50", Annotation.VRAM_REQUEST: "2Gi"}
    a100 = gpu_pod("half-of-an-a100", {**half, Annotation.GPU_MODEL: "A100"})
    a100["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    h100 = gpu_pod("half-of-an-h100", {**half, Annotation.GPUPOOL: DEMO_POOL, Annotation.GPU_MODEL: "H100"})
    for pod in (a100, h100):
        cluster.core.create_namespaced_pod(namespace, pod)
    for pod in (
        wait_running(cluster.core, namespace, "half-of-an-a100"),
        wait_bound(cluster.core, namespace, "half-of-an-h100"),
    ):
        (grant,) = allocation_of(pod).gpus
        charged = parse_milli(pod.spec.containers[0].resources.requests[RESOURCE_MILLI_TFLOPS]) // 1000
        print(
            f"  pod/{pod.metadata.name} on {pod.spec.node_name}: granted {humanize_tflops(grant.tflops_request)} of "
            f"{humanize_tflops(grant.gpu_tflops)} TFLOPS; charged {humanize_tflops(charged)} ({RESOURCE_MILLI_TFLOPS})"
        )


def preemption(cluster: Cluster) -> None:
    """High (200 TFLOPS) and low (60) pods on each of the kubelet node's GPUs leave at most 52 free on any
    GPU but more on the node; a critical 100-TFLOPS pod makes the extender evict one low pod for it."""
    ns = cluster.namespace("demo-preemption")
    cluster.grant_qos(ns, Qos.CRITICAL)  # an operator's grant: without it the shipped policy refuses high and critical

    def pinned(name: str, tflops: str, qos: str) -> dict[str, Any]:
        pod = gpu_pod(name, {Annotation.TFLOPS_REQUEST: tflops, Annotation.VRAM_REQUEST: "1Gi", Annotation.QOS: qos})
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
        return pod

    for group in (
        [pinned(f"high-{i}", "200", "high") for i in range(4)],
        [pinned(f"low-{i}", "60", "low") for i in range(4)],
    ):
        for pod in group:
            cluster.core.create_namespaced_pod(ns, pod)
        for pod in group:
            wait_running(cluster.core, ns, pod["metadata"]["name"], timeout=120)
    print(f"\nQoS preemption on fragmented GPUs: 4 high (200 TFLOPS) + 4 low (60) pods on {REAL_NODE}'s 4 A100s")
    cluster.core.create_namespaced_pod(ns, pinned("critical", "100", "critical"))
    critical = wait_running(cluster.core, ns, "critical", timeout=120)
    print(f"  pod/critical (100 TFLOPS, qos critical) Running on {allocation_of(critical).gpus[0].uuid}")
    for name in ["critical", *(f"low-{i}" for i in range(4))]:
        for line in events_for(cluster.core, ns, name):
            if line.startswith(("Preempted:", "GpuPreemption:")):
                print(f"  {name}: {line}")


def autoscaling(cluster: Cluster) -> None:
    """A Deployment whose profile enables all three layers (tests/e2e/autoscaling.py), its pods' use scripted
    at 31.2 TFLOPS each, then 3.1; prints what the autoscaler and the HPA it owns did."""
    cluster.start_metrics_api()  # the HPA reads gpu_tflops through the custom metrics API
    core, apps = cluster.core, AppsV1Api(cluster.admin)
    cluster.namespace(NAMESPACE)
    apply(cluster.admin, [PROFILE], NAMESPACE)
    apps.create_namespaced_deployment(NAMESPACE, deployment())
    first = eventually("the first replica", lambda: running(core) or None, timeout=90)[0]
    name, uid = first.metadata.name, first.metadata.uid
    print(f"\nautoscaling: Deployment {WORKLOAD} (10 TFLOPS request, 20 limit; maxRatioToRequests 3, HPA target")
    print(f"50 % of what a limit may reach, 8 s aggregation) with its pods' use scripted at {HIGH_SM} % of an A100")
    replicas = [1]

    def follow() -> None:
        now = replicas_now(apps)
        if now != replicas[-1]:
            replicas.append(now)

    with Load(cluster, HIGH_SM):

        def raised() -> Any:
            follow()
            pod = core.read_namespaced_pod(name, NAMESPACE)
            return pod if allocation_of(pod).gpus[0].tflops_limit == 30_000 else None

        pod = eventually("the limit raised", raised, timeout=60)
        live = live_limits(uid) or {}
        gpu = allocation_of(pod).gpus[0].uuid
        restarts = pod.status.container_statuses[0].restart_count
        print(f"  pod/{name}: TFLOPS limit 20 -> 30 in place (restarts: {restarts}); live limit file: "
              f"{live['gpus'][gpu]['tflopsLimit']} TFLOPS, SM {live['gpus'][gpu]['smPercent']} %")  # fmt: skip
        for line in events_for(core, NAMESPACE, name):
            if line.startswith(("AtMaxRatio:", "LimitsRaised:")):
                print(f"    {line}")

        def recommended() -> Any:
            follow()
            requests = (workload_status(cluster).get("autoScaling") or {}).get("requests") or {}
            return requests if requests.get("tflopsRequest") and len(running(core)) == 3 else None

        requests = eventually("a recommendation and 3 replicas", recommended, timeout=90)
        print(f"  HPA tf-{WORKLOAD} scaled the Deployment {' -> '.join(map(str, replicas))}")
        reason = (condition(workload_status(cluster), "RequestsAutoSet") or {}).get("reason")
        print(f"  workload status: requests recommended {requests['tflopsRequest']} TFLOPS ({reason})")
        core.delete_namespaced_pod(running(core)[0].metadata.name, NAMESPACE, grace_period_seconds=0)

        def admitted() -> Any:
            follow()
            for p in running(core):
                text = (p.metadata.annotations or {}).get(SystemAnnotation.RESOLVED_REQUEST, "")
                if "autoRequests" in text:
                    return p
            return None

        fresh = eventually("a replica with the recommended request", admitted, timeout=60)
        print(f"  new replica pod/{fresh.metadata.name} admitted with request "
              f"{humanize_tflops(allocation_of(fresh).gpus[0].tflops_request)} TFLOPS")  # fmt: skip
    print(f"  load dropped to {LOW_SM} % of an A100")
    with Load(cluster, LOW_SM):

        def settled() -> bool:
            follow()
            pods = running(core)
            return replicas_now(apps) == 1 and all(allocation_of(p).gpus[0].tflops_limit <= 20_000 for p in pods)

        eventually("back to one replica at its admitted limit", settled, timeout=90)
        print(f"  limits back to 20 TFLOPS; HPA scaled {' -> '.join(map(str, replicas))}")
    apps.delete_namespaced_deployment(WORKLOAD, NAMESPACE)


def measured(cluster: Cluster, running: Sequence[Any]) -> None:
    """Script each running pod's first GPU container at 3 %, 6 %, … of its GPU's SMs and 1, 2, … GiB in the
    fake GPU file, and print what the device plugin attributes to each, from its GET /usage."""
    script = [
        {
            "pod": p.metadata.uid,
            "container": allocation_of(p).containers[0],
            "gpu": allocation_of(p).gpus[0].uuid,
            "smPercent": 3 * (i + 1),
            "vramMiB": 1024 * (i + 1),
        }
        for i, p in enumerate(running)
    ]
    cluster.write_fake_nvml(fake_nvml_yaml(cluster.gpus, {}, usage=script))

    def sampled() -> list[usage.ContainerUsage] | None:
        found = usage.decode(cluster.plugin_get(usage.PATH)).containers
        return list(found) if {c.pod_uid for c in found} >= {p.metadata.uid for p in running} else None

    lines = [("POD", "CONTAINER", "GPU", "TFLOPS used/limit", "VRAM used/limit")] + [
        (
            c.pod,
            c.container,
            c.gpu,
            f"{humanize_tflops(c.tflops_used)}/{humanize_tflops(c.tflops_limit)}",
            f"{humanize_bytes(c.vram_used)}/{humanize_bytes(c.vram_limit)}",
        )
        for c in eventually("the device plugin's usage sample", sampled, timeout=30)
    ]
    print(f"\nGPU use the device plugin measured (GET {usage.PATH}; scripted in the fake GPU file):")
    print(table(lines))


def side_doors(cluster: Cluster, namespace: str) -> None:
    """The same GET /usage from the pod network: a tenant's token is refused, the extender's ServiceAccount reads."""
    address = non_loopback_ipv4()
    if address is None:
        return
    url = f"http://{address}:{cluster.plugin_metrics_port}{usage.PATH}"
    service_account_token(cluster.admin, namespace, "tenant-app")  # creates the ServiceAccount
    answers = []
    for who, token in (
        ("a tenant's ServiceAccount", service_account_token(cluster.admin, namespace, "tenant-app")),
        ("the extender's", service_account_token(cluster.admin, *deploy.service_accounts()["extender"])),
    ):
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                found = len(usage.decode(answer.read().decode()).containers)
                answers.append(f"  {who}: {answer.status}, {found} containers")
        except urllib.error.HTTPError as error:
            with error:
                answers.append(f"  {who}: {error.code} {error.read().decode().strip()}")
    print(
        f'\nthe same GET {usage.PATH} off loopback (the pod network\'s view; docs/security.md, "Who reads per-pod data"):'
    )
    print("\n".join(answers))


def tampering(cluster: Cluster, pod: Any, container: str) -> None:
    """The container rewrites its own limits.json, as it can on the path it sees (docs/security.md, "Tampering with
    live limits"): the device plugin puts it back, says so on the pod, and counts it for the alert."""
    limits = cluster.live_limits_dir / pod.metadata.uid / container / LIVE_LIMITS_FILE
    kept = limits.read_text()
    lifted = kept.replace('"vramLimitBytes": ', '"vramLimitBytes": 9').replace('"smPercent": ', '"smPercent": 9')
    began = time.monotonic()
    rewrite_as_tenant(limits, lifted)
    eventually("the tampered limits put back", lambda: limits.read_text() == kept, timeout=10, every=0.005)
    back = time.monotonic() - began
    name, namespace = pod.metadata.name, pod.metadata.namespace

    def said() -> list[str] | None:
        lines = [e for e in events_for(cluster.core, namespace, name) if e.startswith(REASON_LIVE_LIMITS_RESTORED)]
        return lines or None

    counted = int(cluster.tamper_count())
    print(f"\npod/{name} rewrites its own {LIVE_LIMITS_FILE} (VRAM and compute limits lifted) on the path it sees:")
    print(f"  the device plugin put it back in {back * 1000:.0f} ms; the pod's Event:")
    print(f"  {eventually('the tampering said on the pod', said, timeout=15)[0]}")
    print(f"  tampering counted on the node: {counted} (alert TensorFusionLiveLimitsTampered, deploy/alerts)")


def past_its_limit(cluster: Cluster, pod: Any, container: str) -> None:
    """A process of the container holds 2Gi more than the pod's VRAM limit by the driver's count, another keeps
    90 % of the GPU's SMs busy (both scripted in the fake GPU file: processes that left the limiter inside its
    container): the device plugin kills the first two samples later, reports the second over its window, and
    says both on the pod (docs/security.md, "VRAM past its limit, by the driver's count" and "Compute past its
    limit, by the driver's count")."""
    grant = allocation_of(pod).gpus[0]
    over = grant.vram_limit // (1024 * 1024) + 2048
    script = [
        {"pod": pod.metadata.uid, "container": container, "gpu": grant.uuid, "vramMiB": over},
        {"pod": pod.metadata.uid, "container": container, "gpu": grant.uuid, "smPercent": 90, "vramMiB": 256},
    ]
    cluster.write_fake_nvml(fake_nvml_yaml(cluster.gpus, {}, usage=script))
    name, namespace = pod.metadata.name, pod.metadata.namespace

    def said(reason: str) -> Callable[[], list[str] | None]:
        return lambda: [e for e in events_for(cluster.core, namespace, name) if e.startswith(reason)] or None

    over_text, limit_text = humanize_bytes(over * 1024 * 1024), humanize_bytes(grant.vram_limit)
    print(f"\na process of pod/{name} holds {over_text} of its GPU by the driver's count, past its {limit_text} VRAM "
          "limit, and another keeps 90 % of the GPU's SMs busy (both left HAMi-core); the device plugin kills the "
          "first and reports the second, and the pod's Events say why:")  # fmt: skip
    print(f"  {eventually('the kill said on the pod', said(REASON_VRAM_OVERUSE), timeout=30)[0]}")
    print(f"  {eventually('the report said on the pod', said(REASON_COMPUTE_OVERUSE), timeout=30)[0]}")
    cluster.set_gpu_faults({})


def skipping_the_scheduler(cluster: Cluster, namespace: str) -> None:
    """What a pod that tries to skip the scheduler meets: admission, then the device plugin's proof."""
    share = {Annotation.TFLOPS_REQUEST: "10", Annotation.VRAM_REQUEST: "1Gi"}
    preset = gpu_pod("skips-the-scheduler", share)
    preset["spec"]["nodeName"] = REAL_NODE
    try:
        cluster.core.create_namespaced_pod(namespace, preset)
        print("\nBUG: a GPU pod with a preset spec.nodeName was admitted")
    except ApiException as exc:
        message = json.loads(exc.body)["message"]
        print(f"\na GPU pod with spec.nodeName preset is denied ({exc.status}):\n  {message}")
    cluster.ensure_pool(DEMO_NOWHERE)
    cluster.core.create_namespaced_pod(namespace, gpu_pod("bound-by-hand", {**share, Annotation.GPUPOOL: DEMO_NOWHERE}))
    bind_by_hand(cluster.core, namespace, "bound-by-hand", REAL_NODE)
    print(f"pod/bound-by-hand: a Binding to {REAL_NODE} posted by hand, without the extender's grant")

    def refused() -> str | None:
        lines = [e for e in events_for(cluster.core, namespace, "bound-by-hand") if "tensor-fusion" in e]
        return lines[0] if lines else None

    print(f"  kubelet event: {eventually('the kubelet refusing bound-by-hand', refused, timeout=30)}")
    overriding(cluster, namespace)
    not_ours(cluster, namespace)


def overriding(cluster: Cluster, namespace: str) -> None:
    """A pod that sets the plugin's variables itself, through envFrom a ConfigMap no admission check can read:
    the runtime applies the plugin's CDI device last, so the container gets its grant."""
    lifted = {
        Env.NVIDIA_VISIBLE_DEVICES: ",".join(g.uuid for g in cluster.gpus),
        f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0": "81920m",
        Env.HAMI_SM_LIMIT: "100",
        Env.HAMI_UTILIZATION_POLICY: "disable",  # HAMi-core's limiter off
    }
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "lift"}, "data": lifted}
    cluster.core.create_namespaced_config_map(namespace, body)
    pod = gpu_pod("lifts-its-limits", {Annotation.TFLOPS_REQUEST: "1", Annotation.VRAM_REQUEST: "1Gi"})
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "lift"}}]
    cluster.core.create_namespaced_pod(namespace, pod)
    running = wait_running(cluster.core, namespace, "lifts-its-limits")
    env = created_env(cluster.node, running, allocation_of(running).containers[0])
    print("pod/lifts-its-limits (1 TFLOPS / 1 GiB) sets the plugin's variables through envFrom a ConfigMap;")
    print("  the runtime applies the plugin's CDI device after it, so the container gets its grant:")
    for key, wanted in lifted.items():
        print(f"  {key}: ConfigMap {wanted!r} -> container {env.get(key)!r}")
    print(f"  GPUs the NVIDIA toolkit gives it: {created_gpus(cluster.node, running, 'main')}")


def not_ours(cluster: Cluster, namespace: str) -> None:
    """A pod that is not ours (no label, no GPU resource) asks for every GPU by environment: the kubelet node's
    toolkit is set as the docs ask, so it gets none, and the device plugin publishes that the node is guarded."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-ours"},
        "spec": {
            "nodeName": REAL_NODE,
            "containers": [
                {"name": "main", "image": IMAGE, "env": [{"name": str(Env.NVIDIA_VISIBLE_DEVICES), "value": "all"}]}
            ],
        },
    }
    cluster.core.create_namespaced_pod(namespace, pod)
    running = wait_running(cluster.core, namespace, "not-ours")
    got = created_gpus(cluster.node, running, "main") or "none"
    labels = cluster.core.read_node(REAL_NODE).metadata.labels or {}
    print(f"pod/not-ours (no label, no GPU resource) sets NVIDIA_VISIBLE_DEVICES=all on {REAL_NODE}: GPUs {got}")
    print(
        f"  {REAL_NODE}: {LABEL_NODE_ENVVAR_GUARD}={labels.get(LABEL_NODE_ENVVAR_GUARD)}, "
        f"{LABEL_NODE_DEVICE_DELIVERY}={labels.get(LABEL_NODE_DEVICE_DELIVERY)} (what tfctl nodes shows)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the cluster's logs and data directory")
    args = parser.parse_args(argv)
    run(keep=args.keep)


if __name__ == "__main__":
    main()
