"""The rendered chart (deploy/manifests, kept fresh by deploy/check.sh) and the standalone scheduler
config carry the names vgpu/names.py defines and the settings the design depends on."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from device_plugin.main import settings_from as plugin_settings
from scheduler_extender.main import settings_from as extender_settings
from scheduler_extender.settings import Settings
from tf_shell import catalog_file
from tf_webhook.app import MIGRATE_PATHS, MUTATE_PATH
from tf_webhook.migration import ReplicaShare
from tf_webhook.settings import WebhookSettings
from vgpu.names import (
    EXTENDER_PUBLIC_PORT,
    EXTENDER_VERBS_PORT,
    LABEL_ENABLED,
    LABEL_MIGRATE_NVIDIA,
    LABEL_NAMESPACE_MAX_QOS,
    NODE_RESOURCES,
    NVIDIA_GPU,
    NVIDIA_GPU_SHARED,
    NVIDIA_MIG_PREFIX,
    QOS_PRIORITY_VALUE,
    RESOURCE_VGPU,
    SCHEDULER_NAME,
    MigrationMode,
    Qos,
    SystemAnnotation,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def objects() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "manifests").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    return docs


def one(kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [o for o in objects() if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, (kind, name_suffix, len(found))
    return found[0]


def chart_scheduler_config() -> dict[str, Any]:
    doc = yaml.safe_load(one("ConfigMap", "scheduler-config")["data"]["config.yaml"])
    assert isinstance(doc, dict)
    return doc


def standalone_scheduler_config() -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "scheduler-config.yaml").read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def test_scheduler_config_routes_our_pods_to_the_extender() -> None:
    for config in (chart_scheduler_config(), standalone_scheduler_config()):
        assert config["percentageOfNodesToScore"] == 100
        assert [p["schedulerName"] for p in config["profiles"]] == [SCHEDULER_NAME]
        for profile in config["profiles"]:  # ignoredByScheduler needs NodeResourcesFit args in every profile
            assert "NodeResourcesFit" in [c["name"] for c in profile["pluginConfig"]]
        (extender,) = config["extenders"]
        assert extender["managedResources"] == [{"name": RESOURCE_VGPU, "ignoredByScheduler": True}]
        assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False
        verbs = (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"], extender["preemptVerb"])
        assert verbs == ("filter", "prioritize", "bind", "preempt")
        assert extender["weight"] > 0 and extender["httpTimeout"] == "10s"


def test_standalone_config_equals_the_charts_apart_from_the_placeholders() -> None:
    chart, alone = chart_scheduler_config(), standalone_scheduler_config()
    assert alone["clientConnection"].pop("kubeconfig") == "__KUBECONFIG__"
    assert alone["clientConnection"] == chart["clientConnection"] == {"qps": 1000, "burst": 2000}
    assert alone["extenders"][0]["urlPrefix"] == "http://127.0.0.1:__EXTENDER_VERBS_PORT__/extender"
    assert chart["extenders"][0]["urlPrefix"] == f"http://127.0.0.1:{EXTENDER_VERBS_PORT}/extender"
    assert alone.pop("leaderElection") == {"leaderElect": False}  # one kube-scheduler, nothing to elect
    assert chart.pop("leaderElection")["leaderElect"] is True  # replicas elect one (test_leader_election.py)
    for doc in (chart, alone):
        doc.pop("clientConnection", None)
        doc["extenders"][0].pop("urlPrefix")
    assert chart == alone


def test_only_the_read_only_listener_leaves_the_scheduler_pod() -> None:
    """kube-scheduler calls the verbs on loopback, where the extender's own flags put them; the pod's
    port, its probes and the Service are the read-only listener's, which serves no verb."""
    spec = one("Deployment", "scheduler")["spec"]["template"]["spec"]
    extender = container(spec, "extender")
    settings = extender_settings(extender["args"])  # read by the binary's own flag parser
    assert (settings.verbs_address, settings.verbs_port) == ("127.0.0.1", EXTENDER_VERBS_PORT)
    assert (settings.public_address, settings.public_port) == ("0.0.0.0", EXTENDER_PUBLIC_PORT)
    url = f"http://127.0.0.1:{settings.verbs_port}{settings.url_prefix}"
    assert chart_scheduler_config()["extenders"][0]["urlPrefix"] == url
    assert extender["ports"] == [{"name": "http", "containerPort": settings.public_port}]
    assert extender["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert extender["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    (service,) = [o for o in objects() if o["kind"] == "Service" and o["metadata"]["name"].endswith("-extender")]
    assert service["spec"]["ports"] == [{"name": "http", "port": settings.public_port, "targetPort": "http"}]


def test_webhook_fails_closed_for_opted_in_pods_only() -> None:
    hook = one("MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["name"] == "pods.tensor-fusion.ai"
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "NoneOnDryRun"
    assert hook["admissionReviewVersions"] == ["v1"] and hook["clientConfig"]["service"]["path"] == MUTATE_PATH
    assert hook["rules"][0]["operations"] == ["CREATE"] and hook["rules"][0]["resources"] == ["pods"]
    assert hook["objectSelector"]["matchExpressions"] == [
        {"key": LABEL_ENABLED, "operator": "Exists"},
        {"key": LABEL_ENABLED, "operator": "NotIn", "values": ["false"]},
    ]
    assert "tensor-fusion-system" in hook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert hook["timeoutSeconds"] <= 10


def test_jobs_whose_pod_template_opts_in_are_sent_as_pods_are() -> None:
    """Kueue counts a Job's template (docs/kueue.md): the jobs entry calls the pods' path on Job creates, fails
    as the pods entry does, and is asked only for Jobs whose template carries the label the pods entry selects."""
    pods, jobs, *_ = one("MutatingWebhookConfiguration")["webhooks"]
    assert jobs["name"] == "jobs.tensor-fusion.ai" and jobs["clientConfig"] == pods["clientConfig"]
    same = ("failurePolicy", "sideEffects", "reinvocationPolicy", "timeoutSeconds", "namespaceSelector")
    assert {k: jobs[k] for k in same} == {k: pods[k] for k in same}
    assert jobs["rules"] == [{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["jobs"], "scope": "Namespaced"}]  # fmt: skip
    assert "objectSelector" not in jobs  # a Job's own labels say nothing of its pods
    (condition,) = jobs["matchConditions"]
    labels = "object.spec.template.metadata.labels"
    assert f"'{LABEL_ENABLED}' in {labels}" in condition["expression"]
    assert f"{labels}['{LABEL_ENABLED}'] != 'false'" in condition["expression"]  # as the pods' NotIn false


def test_migration_entries_see_only_unlabelled_nvidia_gpu_pods_of_labelled_namespaces() -> None:
    """One entry per value of the namespace label, after the pods entry: the label they add must not send the
    pod there too (reinvocationPolicy Never). A pod of an unlabelled namespace never reaches them."""
    pods, _jobs, *migration = one("MutatingWebhookConfiguration")["webhooks"]
    assert [h["name"] for h in migration] == ["whole.migrate.tensor-fusion.ai", "time-sliced.migrate.tensor-fusion.ai"]
    for hook, mode in zip(migration, MigrationMode, strict=True):
        assert hook["clientConfig"]["service"]["path"] == MIGRATE_PATHS[mode]
        same = ("failurePolicy", "sideEffects", "rules", "reinvocationPolicy", "timeoutSeconds")
        assert {k: hook[k] for k in same} == {k: pods[k] for k in same}
        assert hook["objectSelector"] == {"matchExpressions": [{"key": LABEL_ENABLED, "operator": "DoesNotExist"}]}
        excluded, selected = hook["namespaceSelector"]["matchExpressions"]
        assert excluded == pods["namespaceSelector"]["matchExpressions"][0]
        assert selected == {"key": LABEL_MIGRATE_NVIDIA, "operator": "In", "values": [mode.value]}
        (condition,) = hook["matchConditions"]
        expression = condition["expression"]
        for name in (NVIDIA_GPU, NVIDIA_GPU_SHARED):
            assert f"r == '{name}'" in expression
        assert f"r.startsWith('{NVIDIA_MIG_PREFIX}')" in expression and "initContainers" in expression


def test_the_webhook_reads_the_charts_replica_share(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    share = {"webhook": {"migration": {"replicaShare": {"tflops": 25, "vram": "10Gi"}}}}
    for values, expected in (({}, ReplicaShare()), (share, ReplicaShare(tflops=25_000, vram=10 * 1024**3))):
        spec = pod_spec(render(values, tmp_path), "Deployment", "tensor-fusion-webhook")
        env = {e["name"]: e["value"] for e in container(spec, "webhook")["env"] if "value" in e}
        for name in ("TF_WEBHOOK_MIGRATION_REPLICA_TFLOPS", "TF_WEBHOOK_MIGRATION_REPLICA_VRAM"):
            monkeypatch.setenv(name, env[name])
        assert WebhookSettings().replica_share == expected  # unset by default: replicas are refused, not guessed


def test_migration_entries_follow_an_external_url_and_can_be_left_out(tmp_path: Path) -> None:
    external = {"webhook": {"externalURL": "https://10.0.0.5:9443/mutate"}}
    (config,) = [d for d in render(external, tmp_path) if d["kind"] == "MutatingWebhookConfiguration"]
    urls = [h["clientConfig"]["url"] for h in config["webhooks"]]
    assert urls == [f"https://10.0.0.5:9443{path}" for path in (MUTATE_PATH, MUTATE_PATH, *MIGRATE_PATHS.values())]
    with pytest.raises(subprocess.CalledProcessError) as failed:
        render({"webhook": {"externalURL": "https://10.0.0.5:9443/hook"}}, tmp_path)
    assert "webhook.externalURL must end in /mutate" in failed.value.stderr
    off = {"webhook": {"migration": {"enabled": False}}}
    (config,) = [d for d in render(off, tmp_path) if d["kind"] == "MutatingWebhookConfiguration"]
    assert [h["name"] for h in config["webhooks"]] == ["pods.tensor-fusion.ai", "jobs.tensor-fusion.ai"]


def test_priority_classes_match_qos() -> None:
    classes = {o["metadata"]["name"]: o["value"] for o in objects() if o["kind"] == "PriorityClass"}
    assert classes == {q.priority_class: QOS_PRIORITY_VALUE[q] for q in Qos}


def test_admission_policy_protects_every_system_annotation() -> None:
    text = (DEPLOY / "manifests" / "admission-policy.yaml").read_text(encoding="utf-8")
    for key in SystemAnnotation:
        assert f"'{key.value}'" in text, key
    assert f"'{RESOURCE_VGPU}'" in text and f"'{LABEL_ENABLED}'" in text
    bindings = [o for o in objects() if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    policies = {o["metadata"]["name"] for o in objects() if o["kind"] == "ValidatingAdmissionPolicy"}
    assert {b["spec"]["policyName"] for b in bindings} == policies and len(policies) == 3
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)


def test_the_qos_rule_reads_the_namespace_label_and_names_our_high_classes() -> None:
    """Static: the classes it guards are the webhook's for high and critical, and the label it reads is the one
    the docs tell operators to set. Only a real API server evaluates the CEL: tests/e2e/test_preemption.py."""
    policy = one("ValidatingAdmissionPolicy", "pod-contract")["spec"]
    (rule,) = [v for v in policy["validations"] if "variables.granted" in v["expression"]]
    text = json.dumps([rule, policy["variables"]])
    assert LABEL_NAMESPACE_MAX_QOS in text
    assert all(f"'{q.priority_class}'" in text for q in (Qos.HIGH, Qos.CRITICAL))
    assert f"'{Qos.MEDIUM.priority_class}'" not in text and f"'{Qos.LOW.priority_class}'" not in text
    assert rule["expression"].startswith("request.operation != 'CREATE' ||")  # a pod's class is fixed at creation


def test_vgpu_bypass_check_covers_init_containers() -> None:
    """Static: the kubelet Allocates devices for init containers too, so the check that refuses the
    vGPU resource on pods the webhook did not see must walk them as well. (Ephemeral containers
    cannot carry resources.) Only a real API server evaluates the CEL: tests/e2e installs this policy
    for every pod it creates, but has no case for a pod that bypasses the webhook."""
    policy = one("ValidatingAdmissionPolicy", "pod-contract")["spec"]
    variables = {v["name"]: " ".join(v["expression"].split()) for v in policy["variables"]}
    assert variables["containers"] == (
        "object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])"
    )
    (check,) = [v["expression"] for v in policy["variables"] if f"'{RESOURCE_VGPU}'" in v["expression"]]
    assert "variables.containers.exists(" in check
    assert all(f"'{name}'" in check for name in (RESOURCE_VGPU, *NODE_RESOURCES))  # every resource the webhook sets
    assert "object.spec.containers" not in check
    users = [v["expression"] for v in policy["validations"] if "variables.requestsOurs" in v["expression"]]
    assert len(users) == 2  # the webhook-bypass check, and the preset-node check (tests/e2e/test_tenant_isolation.py)


def test_device_plugin_mounts_only_the_kubelet_dirs_its_own_state_dirs_the_cdi_dirs_and_the_toolkit() -> None:
    spec = one("DaemonSet")["spec"]["template"]["spec"]
    assert {v["hostPath"]["path"] for v in spec["volumes"]} == {
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
        "/var/lib/tensor-fusion/limits",
        "/var/lib/tensor-fusion/handoff",  # the node's hand-off receipts, kept across reboots
        "/var/run/cdi",
        "/etc/cdi",  # NVIDIA's CDI specs
        "/etc/nvidia-container-runtime",  # the toolkit's configuration
        "/dev/null",  # NVML's GPUs, as a volume-mount device request
    }
    # NVML's process list carries host PIDs; mapping them to pods reads the host's /proc.
    assert spec["hostPID"] is True
    (container,) = spec["containers"]
    # Allocate answers name host paths under --live-limits-dir: the plugin must see that directory at the same path.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (live,) = [v for v in spec["volumes"] if v["name"] == "live-limits"]
    assert f"--live-limits-dir={live['hostPath']['path']}" in container["args"]
    assert mounts["live-limits"] == live["hostPath"]["path"]
    (receipts,) = [v for v in spec["volumes"] if v["name"] == "receipts"]
    assert f"--receipts-file={receipts['hostPath']['path']}/receipts.json" in container["args"]
    assert mounts["receipts"] == receipts["hostPath"]["path"]
    # The CDI specs the plugin writes are read by the container runtime from the same host directory.
    (cdi,) = [v for v in spec["volumes"] if v["hostPath"]["path"] == "/var/run/cdi"]
    assert f"--cdi-dir={cdi['hostPath']['path']}" in container["args"]
    assert mounts[cdi["name"]] == cdi["hostPath"]["path"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "privileged" not in container["securityContext"]
    # What it only reads is mounted read-only; the toolkit check reads the file its argument names.
    read_only = {m["mountPath"] for m in container["volumeMounts"] if m.get("readOnly")}
    assert {"/etc/cdi", "/etc/nvidia-container-runtime", "/var/run/nvidia-container-devices/all"} <= read_only
    assert "--nvidia-toolkit-config=/etc/nvidia-container-runtime/config.toml" in container["args"]


def test_every_workload_runs_as_an_existing_service_account_with_bound_roles() -> None:
    accounts = {o["metadata"]["name"] for o in objects() if o["kind"] == "ServiceAccount"}
    used = {
        o["spec"]["template"]["spec"]["serviceAccountName"]
        for o in objects()
        if o["kind"] in ("Deployment", "DaemonSet")
    }
    subjects = [s for o in objects() if o["kind"].endswith("Binding") and "subjects" in o for s in o["subjects"]]
    bound = {s["name"] for s in subjects if s["namespace"] == "tensor-fusion-system"}
    assert used == accounts == bound
    # The one subject elsewhere: the HPA controller, which reads the custom metrics API.
    assert {(s["namespace"], s["name"]) for s in subjects} - {("tensor-fusion-system", a) for a in accounts} == {
        ("kube-system", "horizontal-pod-autoscaler")
    }


def test_webhook_and_extender_run_non_root() -> None:
    for name in ("scheduler", "webhook"):
        pod = one("Deployment", name)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True


def role_rules(name_suffix: str, kind: str = "ClusterRole") -> set[tuple[str, str, str]]:
    """A ClusterRole's (or Role's) rules as (apiGroup, resource, verb) triples."""
    rules = one(kind, name_suffix)["rules"]
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def triples(group: str, resource: str, *verbs: str) -> set[tuple[str, str, str]]:
    return {(group, resource, v) for v in verbs}


def test_each_component_role_grants_exactly_what_its_code_calls() -> None:
    tf = "tensor-fusion.ai"
    # scheduler_extender/kube/gateway.py (informers, binder, /explain, events, the preemptor's evictions
    # and nominations), plus the status writer: it lists TensorFusionWorkloads and GPUPools and patches
    # their status.
    assert role_rules("-extender") == (
        triples("", "pods", "get", "list", "watch", "patch")
        | triples("", "pods/binding", "create")
        | triples("", "pods/eviction", "create")
        | triples("", "pods/status", "patch")
        | triples("", "nodes", "list", "watch")
        | triples("", "events", "create")
        | triples(tf, "tensorfusionworkloads", "get", "list", "watch")
        | triples(tf, "tensorfusionworkloads/status", "patch")
        | triples(tf, "gpupools", "list")
        | triples(tf, "gpupools/status", "patch")
        # the autoscaler (scheduler_extender/autoscaler/): a pod's controller (opted in?), and its HPAs
        | triples("apps", "replicasets", "get")
        | triples("apps", "deployments", "get")
        | triples("apps", "statefulsets", "get")
        | triples("autoscaling", "horizontalpodautoscalers", "get", "list", "create", "update", "delete")
        | triples("", "nodes/stats", "get")  # each device plugin's /usage (tf_shell/access.py)
    )
    # ... and in the release namespace only: the plugins' EndpointSlices and its checkpoint ConfigMaps.
    assert role_rules("-autoscaler", "Role") == (
        triples("discovery.k8s.io", "endpointslices", "list")
        | triples("", "configmaps", "get", "list", "create", "update")
    )
    # tf_webhook/kube.py (GPUPools listed and watched into tf_webhook/pool_cache.py)
    assert role_rules("-webhook") == (
        triples(tf, "workloadprofiles", "get")
        | triples(tf, "gpupools", "list", "watch")
        | triples(tf, "tensorfusionworkloads", "get", "create", "update")
    )
    # device_plugin/cluster/kube.py
    assert role_rules("-device-plugin") == (
        triples("", "nodes", "get", "patch")
        | triples("", "nodes/status", "patch")  # the node's TFLOPS and VRAM totals
        | triples("", "pods", "list", "watch", "patch")
        | triples("", "events", "create")  # GpuUnhealthy / GpuHealthy on its node
    )
    # Those that judge callers of per-pod data off loopback (explain; /metrics and /usage) ask the API server
    # about them, as every delegating server does.
    delegating = {
        s["name"]
        for o in objects()
        if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == "system:auth-delegator"
        for s in o["subjects"]
    }
    assert {"tensor-fusion-scheduler", "tensor-fusion-device-plugin"} <= delegating


CHART = DEPLOY / "helm" / "tensor-fusion"


def helm_template(
    values: dict[str, Any], tmp_path: Path, *helm_args: str, kube_version: str | None = "1.36.2", chart: Path = CHART
) -> str:
    """``helm template`` of the chart by the pinned helm deploy/check.sh uses, as deploy/manifests is
    rendered, with ``values`` on top, for ``kube_version`` (None: helm's own default) and ``helm_args``."""
    helm = subprocess.run([DEPLOY / "build-helm.sh"], check=True, capture_output=True, text=True).stdout.strip()
    given = tmp_path / "values.yaml"
    given.write_text(yaml.safe_dump(values), encoding="utf-8")
    command = [helm, "template", "tensor-fusion", str(chart), "-n", "tensor-fusion-system", *helm_args]
    command += ["--kube-version", kube_version] if kube_version else []
    command += ["-f", str(DEPLOY / "manifests-values.yaml"), "-f", str(given)]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def render(
    values: dict[str, Any], tmp_path: Path, *helm_args: str, kube_version: str | None = "1.36.2"
) -> list[dict[str, Any]]:
    """The objects :func:`helm_template` renders."""
    out = helm_template(values, tmp_path, *helm_args, kube_version=kube_version)
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind_and_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


WORKLOADS = (
    ("Deployment", "tensor-fusion-scheduler", "extender"),
    ("DaemonSet", "tensor-fusion-device-plugin", "device-plugin"),
)


def pod_spec(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    workload = by_kind_and_name(docs)[(kind, name)]
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in spec["containers"] if c["name"] == name]
    return found


def test_gpu_catalog_is_one_file_given_to_the_extender_and_every_device_plugin(tmp_path: Path) -> None:
    entry = {"key": "A10G", "tflops": "70", "memoryMiB": 22731, "nvmlNames": ["NVIDIA A10G"], "aliases": ["g5"]}
    docs = render({"gpuCatalog": [entry]}, tmp_path)
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-gpu-catalog")]
    shipped = tmp_path / "catalog.yaml"
    shipped.write_text(config_map["data"]["catalog.yaml"], encoding="utf-8")
    models = catalog_file.load(shipped)  # what either binary makes of the file
    a10g = models.lookup("NVIDIA A10G")
    assert a10g is not None and (a10g.tflops_milli, a10g.memory_mib) == (70_000, 22731)
    assert models.matches("g5", "NVIDIA A10G")
    for kind, workload, name in WORKLOADS:
        spec = pod_spec(docs, kind, workload)
        (volume,) = [v for v in spec["volumes"] if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]]
        (mount,) = [m for m in container(spec, name)["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True
        args = container(spec, name)["args"]  # read by the binary's own flag parser
        given = extender_settings(args).gpu_catalog if name == "extender" else plugin_settings(args).gpu_catalog
        assert given == f"{mount['mountPath']}/catalog.yaml", name


def test_no_gpu_catalog_renders_nothing_extra(tmp_path: Path) -> None:
    empty = render({"gpuCatalog": []}, tmp_path)
    assert by_kind_and_name(empty) == by_kind_and_name(objects())  # the committed manifests, default gpuCatalog
    assert "gpu-catalog" not in yaml.safe_dump_all(empty)
    for kind, workload, name in WORKLOADS:
        assert not any(a.startswith("--gpu-catalog") for a in container(pod_spec(empty, kind, workload), name)["args"])


def test_two_schedulers_roll_one_at_a_time_with_leader_election_and_a_budget_each() -> None:
    """Two scheduler replicas, kube-scheduler's leader election picking the active one, a rolling update
    that starts a new pod before an old one goes, and a PodDisruptionBudget keeping one scheduler and
    one webhook up through drains."""
    scheduler = one("Deployment", "scheduler")
    assert scheduler["spec"]["replicas"] == 2
    assert scheduler["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    namespace = scheduler["metadata"]["namespace"]
    election = chart_scheduler_config()["leaderElection"]
    named = {"leaderElect": True, "resourceName": SCHEDULER_NAME, "resourceNamespace": namespace}
    assert election.items() >= named.items()  # and its durations (test_leader_election.py)
    for name in ("scheduler", "webhook"):
        pods = one("Deployment", name)["spec"]["template"]["metadata"]["labels"]
        budget = one("PodDisruptionBudget", name)
        assert budget["spec"]["minAvailable"] == 1
        assert budget["metadata"]["namespace"] == namespace
        assert budget["spec"]["selector"]["matchLabels"].items() <= pods.items()


def test_the_extender_elects_its_status_writer_with_a_lease_it_may_use() -> None:
    """Each extender names itself by its pod and uses the Lease in its own namespace, where the scheduler's
    service account may get, create and update leases (kube-scheduler's and the extender's)."""
    scheduler = one("Deployment", "scheduler")
    spec = scheduler["spec"]["template"]["spec"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container(spec, "extender")["env"]}
    assert env == {"TF_EXTENDER_IDENTITY": "metadata.name", "TF_EXTENDER_LEASE_NAMESPACE": "metadata.namespace"}
    fields = {f"TF_EXTENDER_{f.upper()}" for f in Settings.model_fields}
    assert set(env) <= fields
    namespace = scheduler["metadata"]["namespace"]
    bindings = [
        o
        for o in objects()
        if o["kind"] == "RoleBinding"
        and o["metadata"]["namespace"] == namespace
        and {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": namespace} in o["subjects"]
    ]
    roles = [one("Role", binding["roleRef"]["name"]) for binding in bindings]
    assert {role["metadata"]["namespace"] for role in roles} == {namespace}
    granted = {
        (g, r, v)
        for role in roles
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert triples("coordination.k8s.io", "leases", "get", "create", "update") <= granted


def test_the_webhook_reads_the_charts_gpu_tolerations(monkeypatch: pytest.MonkeyPatch) -> None:
    (container,) = one("Deployment", "webhook")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    monkeypatch.setenv("TF_WEBHOOK_GPU_TOLERATIONS", env["TF_WEBHOOK_GPU_TOLERATIONS"])
    assert WebhookSettings().gpu_tolerations == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_under_mps_the_plugin_shares_the_daemons_pipe_log_and_shm_directories_with_its_flags(tmp_path: Path) -> None:
    spec = pod_spec(render({"devicePlugin": {"backend": "mps"}}, tmp_path), *WORKLOADS[1][:2])
    plugin = container(spec, "device-plugin")
    hosts = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    assert (hosts["mps"], mounts["mps"]) == ("/run/nvidia/mps", "/run/nvidia/mps")
    # The MPS server (the plugin's child) and its clients share memory in the same host directory.
    assert (hosts["mps-shm"], mounts["mps-shm"]) == ("/run/nvidia/mps/shm", "/dev/shm")
    flags = {a.split("=")[0]: a.split("=", 1)[1] for a in plugin["args"] if "=" in a}
    assert (flags["--mps-pipe-host"], flags["--mps-log-dir"], flags["--mps-shm-host"]) == (
        "/run/nvidia/mps/pipe",
        "/run/nvidia/mps/log",
        "/run/nvidia/mps/shm",
    )
    assert {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility,compute"} in plugin["env"]
    assert "privileged" not in plugin["securityContext"]


@pytest.mark.parametrize(("action", "added"), [("kill", ["KILL"]), ("report", None), ("off", None)])
def test_the_plugin_gets_the_kill_capability_only_where_its_vram_guard_kills(
    action: str, added: list[str] | None, tmp_path: Path
) -> None:
    values = {"devicePlugin": {"vramOveruse": action, "vramOveruseTolerance": "1Gi"}}
    plugin = container(pod_spec(render(values, tmp_path), *WORKLOADS[1][:2]), "device-plugin")
    assert plugin["securityContext"]["capabilities"].get("add") == added
    assert plugin["securityContext"]["capabilities"]["drop"] == ["ALL"]
    given = plugin_settings(plugin["args"])  # read by the binary's own flag parser
    assert (given.vram_overuse.value, given.vram_tolerance) == (action, 1024**3)
