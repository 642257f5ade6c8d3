"""The admission decision on AdmissionReview payloads shaped as the API server sends them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tf_webhook import review
from tf_webhook.cluster import ClusterUnavailable
from tf_webhook.decision import Decision, decide
from tf_webhook.plugin_env import set_by_plugin
from vgpu.contract import resolved
from vgpu.names import (
    LABEL_ENABLED,
    QOS_PRIORITY_VALUE,
    RESOURCE_MILLI_TFLOPS,
    RESOURCE_VGPU,
    RESOURCE_VRAM,
    SCHEDULER_NAME,
    Annotation,
    Env,
    Qos,
    SystemAnnotation,
)

from .builders import FakeCluster, apply_patch, decode_patch, default_pool, review_of, seed_review

A = Annotation
GI = 1024**3
BASIC = {A.TFLOPS_REQUEST.value: "10", A.VRAM_REQUEST.value: "4Gi"}
SEED_PROFILE = {"spec": {"gpuModel": "A100", "autoScalingConfig": {"autoSetLimits": {"enable": True}}}}


def run(doc: dict[str, Any], cluster: FakeCluster | None = None) -> tuple[dict[str, Any], Decision]:
    """AdmissionReview in, AdmissionReview response out (what the HTTP shell sends back)."""
    req = review.parse(json.dumps(doc).encode())
    decision = decide(req, cluster or FakeCluster())
    out = review.respond(req.uid, decision.verdict)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == doc["request"]["uid"]
    return out["response"], decision


def patched_pod(doc: dict[str, Any], cluster: FakeCluster | None = None) -> dict[str, Any]:
    response, _ = run(doc, cluster)
    assert response["allowed"] is True, response
    pod: dict[str, Any] = apply_patch(doc["request"]["object"], decode_patch(response))
    return pod


def denial(doc: dict[str, Any], cluster: FakeCluster | None = None) -> str:
    response, decision = run(doc, cluster)
    assert response["allowed"] is False and "patch" not in response
    assert decision.upsert is None
    message: str = response["status"]["message"]
    return message


def test_seed_pod_is_mutated_for_our_scheduler_and_device_plugin() -> None:
    cluster = FakeCluster(profiles={("default", "default-profile"): SEED_PROFILE})
    pod = patched_pod(seed_review(), cluster)
    resources = pod["spec"]["containers"][0]["resources"]
    ours = {RESOURCE_VGPU: "1", RESOURCE_MILLI_TFLOPS: "10000", RESOURCE_VRAM: str(4 * 1024**3)}
    assert resources == {"requests": ours, "limits": ours}  # the shares: 10 TFLOPS and 4Gi, on the node
    assert pod["spec"]["schedulerName"] == SCHEDULER_NAME
    assert pod["spec"]["priorityClassName"] == Qos.MEDIUM.priority_class
    assert pod["spec"]["priority"] == QOS_PRIORITY_VALUE[Qos.MEDIUM]
    got = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    assert (got.tflops_request, got.tflops_limit, got.vram_request, got.vram_limit) == (10_000, 20_000, 4 * GI, 4 * GI)
    assert (got.pool, got.containers, got.gpu_model, got.workload) == (
        "default-pool",
        ("python",),
        "A100",  # from the WorkloadProfile the pod names
        "pytorch-example",
    )
    assert pod["metadata"]["annotations"][A.TFLOPS_LIMIT] == "20"  # the tenant's own keys stay


def test_generate_workload_asks_for_the_resolved_spec_to_be_written() -> None:
    cluster = FakeCluster(profiles={("default", "default-profile"): SEED_PROFILE})
    _, decision = run(seed_review(), cluster)
    assert decision.upsert is not None
    assert (decision.upsert.namespace, decision.upsert.name) == ("default", "pytorch-example")
    spec = decision.upsert.spec
    assert spec["resources"] == {"requests": {"tflops": "10", "vram": "4Gi"}, "limits": {"tflops": "20", "vram": "4Gi"}}
    assert (spec["replicas"], spec["qos"], spec["gpuModel"], spec["isLocalGPU"]) == (1, "medium", "A100", True)
    assert spec["standaloneWorkerMode"] is False
    assert spec["autoScalingConfig"] == {"autoSetLimits": {"enable": True}}


def test_standalone_worker_mode_travels_through_the_generated_workload() -> None:
    local = {A.IS_LOCAL_GPU.value: "true", A.NO_STANDALONE_WORKER_MODE.value: "true", A.WORKLOAD.value: "w"}
    _, decision = run(review_of({**BASIC, **local, A.GENERATE_WORKLOAD.value: "true"}))
    assert decision.upsert is not None
    assert decision.upsert.spec["standaloneWorkerMode"] is True
    cluster = FakeCluster(workloads={("default", "w"): {"spec": decision.upsert.spec}})
    pod = patched_pod(review_of({A.WORKLOAD.value: "w", A.GENERATE_WORKLOAD.value: "false"}), cluster)
    assert resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST]).no_standalone_worker_mode


def test_namespace_comes_from_the_request_when_the_object_has_none() -> None:
    doc = review_of({**BASIC, A.WORKLOAD_PROFILE.value: "p"})
    doc["request"]["namespace"] = "team-a"
    del doc["request"]["object"]["metadata"]["namespace"]
    pod = patched_pod(doc, FakeCluster(profiles={("team-a", "p"): {"spec": {"gpuCount": 2}}}))
    assert pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE_VGPU] == "2"


@pytest.mark.parametrize("labels", [{}, {"app": "x"}, {LABEL_ENABLED: "false"}])
def test_pods_not_opted_in_are_untouched(labels: dict[str, str]) -> None:
    response, decision = run(review_of({A.TFLOPS_REQUEST.value: "nonsense"}, labels=labels))
    assert response == {"uid": response["uid"], "allowed": True}
    assert decision.upsert is None


@pytest.mark.parametrize("value", ["True", "yes", "1", ""])
def test_a_malformed_enabled_label_is_denied(value: str) -> None:
    message = denial(review_of(BASIC, labels={LABEL_ENABLED: value}))
    assert f"label {LABEL_ENABLED}" in message and '"true" or "false"' in message


def test_every_bad_annotation_is_reported_with_what_is_accepted() -> None:
    message = denial(review_of({A.TFLOPS_REQUEST.value: "ten", A.QOS.value: "urgent", A.GPU_COUNT.value: "0"}))
    assert f"{A.TFLOPS_REQUEST} 'ten'" in message and "Kubernetes quantity" in message
    assert f"{A.QOS} 'urgent': must be one of low, medium, high, critical" in message
    assert f"{A.GPU_COUNT} '0': must be a whole number from 1 to 128" in message


def test_request_above_limit_is_denied() -> None:
    message = denial(review_of({A.TFLOPS_REQUEST.value: "30", A.TFLOPS_LIMIT.value: "20", A.VRAM_REQUEST.value: "1Gi"}))
    assert "must not exceed the tflops limit" in message


def test_missing_profile_is_a_clear_denial() -> None:
    message = denial(review_of({**BASIC, A.WORKLOAD_PROFILE.value: "nope"}))
    assert message == f"{A.WORKLOAD_PROFILE} 'nope': WorkloadProfile default/nope not found; create it or fix the name"


def test_invalid_profile_is_denied_naming_its_field() -> None:
    cluster = FakeCluster(profiles={("default", "p"): {"spec": {"qos": "gold"}}})
    message = denial(review_of({**BASIC, A.WORKLOAD_PROFILE.value: "p"}), cluster)
    assert "WorkloadProfile default/p spec.qos 'gold': must be one of" in message


PREFER_FAST = {"weight": 80, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}
OWN_TERM = {"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}


def test_a_profiles_preferred_node_affinity_joins_the_pods_own_for_kube_scheduler_to_score() -> None:
    required = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": required,
                "preferredDuringSchedulingIgnoredDuringExecution": [PREFER_FAST]}  # fmt: skip
    cluster = FakeCluster(profiles={("default", "p"): {"spec": {"nodeAffinity": affinity}}})
    pod = patched_pod(review_of({**BASIC, A.WORKLOAD_PROFILE.value: "p"}), cluster)
    node_affinity = pod["spec"]["affinity"]["nodeAffinity"]
    # Only the preferred terms: the required ones stay the extender's (its reasons name them).
    assert node_affinity == {"preferredDuringSchedulingIgnoredDuringExecution": [PREFER_FAST]}
    own = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [OWN_TERM]},
                        "podAntiAffinity": {"x": 1}}}  # fmt: skip
    pod = patched_pod(review_of({**BASIC, A.WORKLOAD_PROFILE.value: "p"}, spec=own), cluster)
    assert pod["spec"]["affinity"] == {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [OWN_TERM, PREFER_FAST]},
        "podAntiAffinity": {"x": 1},
    }
    already = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [PREFER_FAST]}}}
    pod = patched_pod(review_of({**BASIC, A.WORKLOAD_PROFILE.value: "p"}, spec=already), cluster)
    assert pod["spec"]["affinity"] == already["affinity"]  # each term once


def test_a_malformed_preferred_term_in_a_profile_is_denied_naming_it() -> None:
    bad = [{"weight": 0, "preference": {}}, {"weight": 3}]
    affinity = {"preferredDuringSchedulingIgnoredDuringExecution": bad}
    cluster = FakeCluster(profiles={("default", "p"): {"spec": {"nodeAffinity": affinity}}})
    message = denial(review_of({**BASIC, A.WORKLOAD_PROFILE.value: "p"}), cluster)
    where = "WorkloadProfile default/p spec.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    assert f"{where}[0].weight '0': must be a whole number from 1 to 100" in message
    assert f"{where}[1].preference" in message and "must be a node selector term" in message


def test_a_malformed_auto_scaling_config_is_denied_naming_field_value_and_what_is_accepted() -> None:
    auto = {"autoSetRequests": {"percentileForAutoRequests": "95", "aggregationPeriod": "1 day"}}
    cluster = FakeCluster(profiles={("default", "p"): {"spec": {"autoScalingConfig": auto}}})
    message = denial(review_of({**BASIC, A.WORKLOAD_PROFILE.value: "p", A.AUTO_REQUESTS.value: "true"}), cluster)
    where = "WorkloadProfile default/p spec.autoScalingConfig.autoSetRequests"
    assert (
        f"{where}.percentileForAutoRequests '95': must be a ratio above 0 and at most 1, such as 0.8 or 80%" in message
    )
    assert f"{where}.aggregationPeriod '1 day': must be a duration above 0 and at most 365d" in message


def test_missing_pool_is_denied_listing_known_pools() -> None:
    message = denial(review_of({**BASIC, A.GPUPOOL.value: "fast"}))
    assert f"{A.GPUPOOL} 'fast': no such GPU pool; known: default-pool" in message


def test_no_pools_at_all_is_denied() -> None:
    message = denial(review_of(BASIC), FakeCluster(pools=[]))
    assert "no such GPU pool; known: none" in message


def test_pool_defaults_fill_what_the_pod_leaves_out() -> None:
    pools = [default_pool("shared", qos="high", gpuCount=2)]
    pod = patched_pod(review_of(BASIC), FakeCluster(pools=pools))
    got = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    assert (got.pool, got.qos, got.gpu_count) == ("shared", Qos.HIGH, 2)
    assert pod["spec"]["priorityClassName"] == "tensor-fusion-high" and pod["spec"]["priority"] == 10000


def test_several_default_pools_need_an_explicit_choice() -> None:
    cluster = FakeCluster(pools=[default_pool("a"), default_pool("b")])
    assert "several GPUPools are marked default (a, b)" in denial(review_of(BASIC), cluster)
    assert patched_pod(review_of({**BASIC, A.GPUPOOL.value: "b"}), cluster)


def test_a_broken_pool_is_reported_only_to_its_pods() -> None:
    cluster = FakeCluster(pools=[default_pool("good"), {"metadata": {"name": "bad"}, "spec": {"defaults": {"qos": 7}}}])
    assert patched_pod(review_of(BASIC), cluster)
    assert "GPUPool bad spec.defaults.qos" in denial(review_of({**BASIC, A.GPUPOOL.value: "bad"}), cluster)


def test_pools_read_once_admit_without_a_fresh_read() -> None:
    cluster = FakeCluster(live_pools=[])  # were the API server asked, nothing would be admitted
    assert patched_pod(review_of(BASIC), cluster) and cluster.fresh_reads == 0


def test_a_pool_the_cache_lacks_is_read_live_before_the_pod_is_refused() -> None:
    fast = {"metadata": {"name": "fast"}, "spec": {"defaults": {"qos": "high"}}}
    cluster = FakeCluster(live_pools=[default_pool(), fast])  # created a moment ago: the cache has not seen it
    pod = patched_pod(review_of({**BASIC, A.GPUPOOL.value: "fast"}), cluster)
    got = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    assert (got.pool, got.qos, cluster.fresh_reads) == ("fast", Qos.HIGH, 1)


def test_a_pool_named_by_the_profile_is_read_live_too() -> None:
    profile = {"spec": {"poolName": "fast"}}
    cluster = FakeCluster(profiles={("default", "p"): profile}, live_pools=[default_pool(), default_pool("fast")])
    pod = patched_pod(review_of({**BASIC, A.WORKLOAD_PROFILE.value: "p"}), cluster)
    assert resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST]).pool == "fast"


def test_a_pool_missing_live_too_is_refused_with_the_usual_message() -> None:
    cluster = FakeCluster(pools=[], live_pools=[default_pool()])
    message = denial(review_of({**BASIC, A.GPUPOOL.value: "fast"}), cluster)
    assert f"{A.GPUPOOL} 'fast': no such GPU pool; known: default-pool" in message and cluster.fresh_reads == 1


def test_pools_fixed_since_the_cache_saw_them_are_read_before_refusing() -> None:
    cluster = FakeCluster(pools=[default_pool("a"), default_pool("b")], live_pools=[default_pool("b")])
    got = patched_pod(review_of(BASIC), cluster)["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST]
    assert resolved.decode(got).pool == "b"


def test_a_failing_fresh_read_is_a_retryable_denial_not_the_cache_s_refusal() -> None:
    class LiveDown(FakeCluster):
        def gpu_pools(self, *, fresh: bool = False) -> list[dict[str, Any]]:
            if fresh:
                raise ClusterUnavailable("list gpupools: HTTP 503 Service Unavailable")
            return self.pools

    response, _ = run(review_of({**BASIC, A.GPUPOOL.value: "fast"}), LiveDown())
    assert response["allowed"] is False and response["status"]["code"] == 503
    assert "try again: list gpupools: HTTP 503" in response["status"]["message"]


def test_existing_workload_spec_is_used_when_not_generating() -> None:
    cluster = FakeCluster(workloads={("default", "w"): {"spec": {"resources": {"requests": {"tflops": "7"}}}}})
    doc = review_of({A.WORKLOAD.value: "w", A.GENERATE_WORKLOAD.value: "false"})
    pod = patched_pod(doc, cluster)
    got = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    assert (got.tflops_request, got.tflops_limit) == (7_000, 7_000)
    assert run(doc, cluster)[1].upsert is None


def test_missing_workload_is_denied_when_not_generating() -> None:
    message = denial(review_of({**BASIC, A.WORKLOAD.value: "w", A.GENERATE_WORKLOAD.value: "false"}))
    assert "TensorFusionWorkload default/w not found" in message


def test_generate_workload_without_a_name_is_denied() -> None:
    message = denial(review_of({**BASIC, A.GENERATE_WORKLOAD.value: "true"}))
    assert f"{A.GENERATE_WORKLOAD} 'true': needs {A.WORKLOAD}" in message


@pytest.mark.parametrize("key", [SystemAnnotation.ALLOCATION, SystemAnnotation.HANDOFF])
def test_tenant_written_system_annotations_are_stripped(key: SystemAnnotation) -> None:
    response, _ = run(review_of({**BASIC, key.value: '{"version":"v1","gpus":["GPU-stolen"]}'}))
    pod = apply_patch(review_of(BASIC)["request"]["object"], decode_patch(response))
    assert key.value not in pod["metadata"]["annotations"]
    assert any(key.value in w for w in response["warnings"])


def test_tenant_written_resolved_request_is_replaced_by_the_derived_one() -> None:
    forged = '{"version":"v1","gpuCount":8}'
    pod = patched_pod(review_of({**BASIC, SystemAnnotation.RESOLVED_REQUEST.value: forged}))
    value = pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST]
    assert value != forged and resolved.decode(value).gpu_count == 1


def test_forged_annotation_does_not_hide_a_denial() -> None:
    doc = review_of({A.QOS.value: "x", SystemAnnotation.ALLOCATION.value: "{}"})
    response, _ = run(doc)
    assert response["allowed"] is False and response["warnings"]


def test_a_chosen_priority_class_is_kept() -> None:
    pod = patched_pod(review_of(BASIC, spec={"priorityClassName": "batch", "priority": 5}))
    assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == ("batch", 5)
    ours = patched_pod(review_of({**BASIC, A.QOS.value: "high"}, spec={"priorityClassName": "tensor-fusion-high"}))
    assert ours["spec"]["priorityClassName"] == "tensor-fusion-high"


@pytest.mark.parametrize(
    ("qos", "chosen"),
    [
        ("critical", "tensor-fusion-medium"),  # a lower class beside a higher qos: what quota would have let through
        ("low", "tensor-fusion-critical"),
        (None, "tensor-fusion-high"),  # no qos named: medium, whose class this is not
        ("high", "batch"),  # a class of the cluster's own beside a named qos
    ],
)
def test_a_priority_class_contradicting_the_qos_is_refused(qos: str | None, chosen: str) -> None:
    annotations = BASIC if qos is None else {**BASIC, A.QOS.value: qos}
    wanted = qos or "medium"
    assert denial(review_of(annotations, spec={"priorityClassName": chosen})) == (
        f"spec.priorityClassName '{chosen}': contradicts tensor-fusion.ai/qos {wanted}, whose class is "
        f"tensor-fusion-{wanted}: a tensor-fusion pod's priority is its QoS's (preemption and quota read the "
        "class); remove spec.priorityClassName (the webhook sets it) or make the two agree"
    )


def test_only_inject_containers_get_the_vgpu_resource() -> None:
    sidecar_res = {"limits": {RESOURCE_VGPU: "4", "cpu": "1"}, "requests": {"cpu": "1"}}
    doc = review_of({**BASIC, A.INJECT_CONTAINER.value: "python"}, containers=("python", "sidecar"))
    doc["request"]["object"]["spec"]["containers"][1]["resources"] = sidecar_res
    doc["request"]["object"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": "1Gi"}}
    response, _ = run(doc)
    pod = apply_patch(doc["request"]["object"], decode_patch(response))
    python, sidecar = pod["spec"]["containers"]
    ours = {RESOURCE_VGPU: "1", RESOURCE_MILLI_TFLOPS: "10000", RESOURCE_VRAM: str(4 * 1024**3)}
    assert python["resources"] == {"limits": {"memory": "1Gi", **ours}, "requests": ours}
    assert sidecar["resources"] == {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}
    assert any("sidecar" in w for w in response["warnings"])


def test_multi_container_pod_without_inject_container_is_denied() -> None:
    message = denial(review_of(BASIC, containers=("a", "b")))
    assert f"{A.INJECT_CONTAINER}: required when the pod has several containers; choose from a, b" in message


def test_container_gpu_count_gives_each_container_its_count_and_the_pod_their_sum() -> None:
    """TensorFusion v2's map, without inject-container: it names the inject containers, each gets its own count
    of vgpu devices (what the kubelet's Allocate for it carries), the pod their sum of GPU shares."""
    split = {**BASIC, A.CONTAINER_GPU_COUNT.value: '{"inference": 2, "pre": 1}'}
    doc = review_of(split, containers=("pre", "inference", "log"))
    before = doc["request"]["object"]["spec"]["containers"][2].get("resources")
    pod = patched_pod(doc)
    pre, inference, log = pod["spec"]["containers"]
    shares = {RESOURCE_MILLI_TFLOPS: "30000", RESOURCE_VRAM: str(12 * GI)}  # 3 GPUs of 10 TFLOPS / 4Gi each
    assert pre["resources"]["limits"] == pre["resources"]["requests"] == {RESOURCE_VGPU: "1", **shares}
    assert inference["resources"]["limits"] == inference["resources"]["requests"] == {RESOURCE_VGPU: "2"}
    assert log.get("resources") == before
    got = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    assert (got.gpu_count, got.container_gpu_counts) == (3, (("pre", 1), ("inference", 2)))


def test_pod_without_containers_is_denied() -> None:
    assert "no containers" in denial(review_of(BASIC, containers=()))


def test_cluster_read_failure_is_a_retryable_denial() -> None:
    response, _ = run(review_of({**BASIC, A.WORKLOAD_PROFILE.value: "p"}), FakeCluster(down=True))
    assert response["allowed"] is False and response["status"]["code"] == 503
    assert response["status"]["reason"] == "ServiceUnavailable"
    assert "try again" in response["status"]["message"]


# metav1.StatusReason for each HTTP code (k8s.io/apimachinery/pkg/apis/meta/v1/types.go).
STATUS_REASON = {400: "BadRequest", 500: "InternalError", 503: "ServiceUnavailable"}


@pytest.mark.parametrize("kind", list(review.Denial), ids=lambda d: d.name)
def test_every_denial_goes_out_with_the_status_reason_of_its_code(kind: review.Denial) -> None:
    status = review.respond("u", review.deny("no", denial=kind))["response"]["status"]
    assert (status["code"], status["reason"]) == (kind.code, STATUS_REASON[kind.code])


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_create_is_mutated(operation: str) -> None:
    response, _ = run(review_of({A.QOS.value: "bogus"}, operation=operation))
    assert response["allowed"] is True and "patch" not in response


def test_patching_twice_changes_nothing_more() -> None:
    doc = seed_review()
    cluster = FakeCluster(profiles={("default", "default-profile"): SEED_PROFILE})
    once = patched_pod(doc, cluster)
    doc["request"]["object"] = once
    assert patched_pod(doc, cluster) == once


@pytest.mark.parametrize(
    ("where", "value", "problem"),
    [
        ("labels", {LABEL_ENABLED: 1}, "metadata.labels must map strings to strings"),
        ("containers", ["python"], "spec.containers must be a list of objects"),
    ],
)
def test_an_unreadable_pod_is_denied_as_malformed(where: str, value: Any, problem: str) -> None:
    doc = review_of(BASIC)
    obj = doc["request"]["object"]
    (obj["metadata"] if where == "labels" else obj["spec"])[where] = value
    assert denial(doc) == f"malformed pod: {problem}"


def test_a_gpu_pod_that_names_its_node_is_denied_and_a_plain_one_is_not_ours_to_judge() -> None:
    # A preset nodeName skips the scheduler and its grant: the kubelet would admit the pod beside a
    # pod in hand-off, and its Allocate could not be told apart from that pod's.
    message = denial(review_of(BASIC, spec={"nodeName": "gpu-node-1"}))
    assert message == (
        "spec.nodeName 'gpu-node-1': a tensor-fusion pod is placed by the tensor-fusion scheduler, which grants "
        "its GPU share at bind; remove spec.nodeName and pin the pod with spec.nodeSelector, node affinity or "
        "tensor-fusion.ai/gpupool instead (static pods cannot use tensor-fusion GPUs)"
    )
    response, _ = run(review_of(BASIC, labels={"app": "x"}, spec={"nodeName": "gpu-node-1"}))
    assert response["allowed"] is True and "patch" not in response
    assert patched_pod(review_of(BASIC, spec={"nodeName": ""}))["spec"]["schedulerName"] == SCHEDULER_NAME


def test_accepted_values_nothing_acts_on_are_named_in_warnings() -> None:
    # Never silence: replicas (without auto-replicas) and standaloneWorkerMode are stored but not acted on;
    # the autoscaling layers are acted on by the autoscaler, so auto-limits warns no more.
    annotations = {
        **BASIC,
        A.AUTO_LIMITS.value: "true",
        A.AUTO_REPLICAS.value: "false",
        A.REPLICAS.value: "3",
        A.IS_LOCAL_GPU.value: "true",
        A.NO_STANDALONE_WORKER_MODE.value: "true",
    }
    response, _ = run(review_of(annotations))
    assert response["allowed"] is True
    unkept = [w for w in response["warnings"] if "not acted on" in w or "recorded" in w]
    assert unkept == [
        "tensor-fusion.ai/replicas / replicas '3': recorded on the TensorFusionWorkload only; it creates and "
        "scales no pods (the owning Deployment or StatefulSet's replicas decide). With "
        "tensor-fusion.ai/auto-replicas it is the fewest replicas the autoscaler keeps",
        "tensor-fusion.ai/no-standalone-worker-mode / standaloneWorkerMode: recorded only; every pod uses its "
        "granted GPU from its own containers (there is no separate worker to run or skip)",
    ]
    quiet, _ = run(review_of(BASIC))
    assert not [w for w in quiet.get("warnings") or [] if "not acted on" in w or "recorded" in w]
    # With auto-replicas, replicas is the HPA's minimum: acted on, not warned about.
    scaled, _ = run(review_of({**BASIC, A.AUTO_REPLICAS.value: "true", A.REPLICAS.value: "3"}))
    assert not [w for w in scaled.get("warnings") or [] if "recorded" in w]


def test_tensorfusions_own_keys_that_mean_nothing_here_are_admitted_with_a_warning_each() -> None:
    annotations = {**BASIC, "tensor-fusion.ai/embedded-worker": "true", "tensor-fusion.ai/gpu-ids": "gpu-1"}
    response, _ = run(review_of(annotations))
    assert response["allowed"] is True
    said = [w for w in response["warnings"] if "TensorFusion's, ignored here" in w]
    assert said == [
        "tensor-fusion.ai/embedded-worker: TensorFusion's, ignored here: TensorFusion's remote-GPU workers; here "
        "every pod uses its granted GPUs from its own containers, and no worker is run",
        "tensor-fusion.ai/gpu-ids: TensorFusion's, ignored here: written by TensorFusion's own components; here the "
        "grant is tensor-fusion.ai/allocation, written by the scheduler extender",
    ]


@pytest.mark.parametrize(
    ("key", "value", "instead"),
    [
        ("partition-template-id", "mig-1g", "a MIG unit is asked for by its profile in tensor-fusion.ai/gpu-model"),
    ],
)
def test_tensorfusions_keys_that_would_change_the_grant_are_refused_saying_what_to_write(
    key: str, value: str, instead: str
) -> None:
    message = denial(review_of({**BASIC, f"tensor-fusion.ai/{key}": value}))
    assert f"tensor-fusion.ai/{key} '{value}': TensorFusion's tensor-fusion.ai/{key} is not supported" in message
    assert instead in message and "unknown" not in message


def _pool_of(sizes: dict[str, str], name: str = "default-pool") -> dict[str, Any]:
    return {**default_pool(name), "status": {"gpuTflops": sizes}}


def test_a_compute_percent_is_charged_its_share_of_the_largest_gpu_it_may_land_on() -> None:
    cluster = FakeCluster(pools=[_pool_of({"NVIDIA A100-SXM4-80GB": "312", "NVIDIA L4": "121"})])
    half = {A.COMPUTE_PERCENT_REQUEST.value: "50", A.VRAM_REQUEST.value: "4Gi"}
    pod = patched_pod(review_of(half), cluster)
    got = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    assert (got.compute_percent_request, got.tflops_request, got.tflops_limit) == (50_000, 156_000, 156_000)
    assert pod["spec"]["containers"][0]["resources"]["requests"][RESOURCE_MILLI_TFLOPS] == "156000"
    # a model narrows the charge to that model's GPUs in the pool
    pinned = patched_pod(review_of({**half, A.GPU_MODEL.value: "L4"}), cluster)
    got = resolved.decode(pinned["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    assert (got.tflops_request, got.gpu_model) == (60_500, "L4")
    # a pool that lists no GPU yet charges a known model by the catalog, and refuses when nothing says
    empty = FakeCluster(pools=[default_pool()])
    got = resolved.decode(
        patched_pod(review_of({**half, A.GPU_MODEL.value: "A100"}), empty)["metadata"]["annotations"][
            SystemAnnotation.RESOLVED_REQUEST
        ]
    )
    assert got.tflops_request == 156_000
    assert "GPUPool default-pool lists no GPU yet (status.gpuTflops)" in denial(review_of(half), empty)


def test_autoscale_is_the_requests_and_limits_layers_on_its_target() -> None:
    pod = patched_pod(
        review_of({**BASIC, "tensor-fusion.ai/autoscale": "true", "tensor-fusion.ai/autoscale-target": "compute"})
    )
    got = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    layers = {block: (conf.get("enable"), conf.get("targetResource")) for block, conf in got.auto_scaling.items()}
    assert layers == {"autoSetRequests": (True, "tflops"), "autoSetLimits": (True, "tflops")}
    # An auto-* key says more precisely, and wins.
    pod = patched_pod(review_of({**BASIC, "tensor-fusion.ai/autoscale": "true", A.AUTO_LIMITS.value: "false"}))
    got = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    assert {b: c.get("enable") for b, c in got.auto_scaling.items()} == {
        "autoSetRequests": True,
        "autoSetLimits": False,
    }


@pytest.mark.parametrize(
    ("annotations", "said"),
    [
        ({"tensor-fusion.ai/autoscale-target": "vram"}, "'vram': only with tensor-fusion.ai/autoscale: \"true\""),
        ({"tensor-fusion.ai/autoscale": "true", "tensor-fusion.ai/autoscale-target": "gpu"},
         "tensor-fusion.ai/autoscale-target 'gpu': must be one of compute, vram, all"),
    ],
)  # fmt: skip
def test_a_malformed_autoscale_short_form_is_refused_naming_it(annotations: dict[str, str], said: str) -> None:
    assert said in denial(review_of({**BASIC, **annotations}))


def test_a_profiles_prediction_block_is_named_as_not_implemented() -> None:
    profile = {"spec": {"autoScalingConfig": {"autoSetRequests": {"enable": False, "prediction": {"enable": True}}}}}
    cluster = FakeCluster(profiles={("default", "predicting"): profile})
    response, _ = run(review_of({**BASIC, A.WORKLOAD_PROFILE.value: "predicting"}), cluster)
    assert response["allowed"] is True
    assert [w for w in response["warnings"] if "prediction" in w] == [
        "autoScalingConfig.autoSetRequests.prediction.enable: accepted but not implemented: no usage prediction is "
        "made (decisions use measured usage only)"
    ]


NVIDIA = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("existing", "added"),
    [
        (None, [NVIDIA]),
        ([{"key": "other", "operator": "Exists"}], [NVIDIA]),
        ([{"key": "nvidia.com/gpu", "operator": "Exists"}], []),  # any effect covers NoSchedule
        ([{"operator": "Exists"}], []),  # tolerates every taint
        ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}], [NVIDIA]),
        ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], [NVIDIA]),
    ],
    ids=["none", "other-key", "same-key-any-effect", "everything", "one-value-only", "other-effect"],
)
def test_gpu_pods_tolerate_the_gpu_nodes_taint_unless_they_already_do(
    existing: list[dict[str, str]] | None, added: list[dict[str, str]]
) -> None:
    def review_with(labels: dict[str, str] | None) -> review.ReviewRequest:
        doc = review_of(BASIC, labels=labels)
        pod_spec = doc["request"]["object"]["spec"]
        pod_spec.pop("tolerations", None)
        if existing is not None:
            pod_spec["tolerations"] = existing
        return review.parse(json.dumps(doc).encode())

    req = review_with(None)
    response = review.respond(req.uid, decide(req, FakeCluster(), [NVIDIA]).verdict)["response"]
    pod = apply_patch(req.object, decode_patch(response))
    assert pod["spec"].get("tolerations", []) == (existing or []) + added
    plain = review_with({"app": "x"})
    assert not decide(plain, FakeCluster(), [NVIDIA]).verdict.patch  # not a GPU pod: untouched


def _workload_recommending(requests: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {}, "status": {"autoScaling": {"requests": requests}}}


def test_auto_requests_admits_new_pods_with_the_workloads_recommendation_and_says_so() -> None:
    cluster = FakeCluster(
        workloads={("default", "train"): _workload_recommending({"tflopsRequest": "23", "vramRequest": "6Gi"})}
    )
    annotations = {**BASIC, A.WORKLOAD.value: "train", A.AUTO_REQUESTS.value: "true", A.TFLOPS_LIMIT.value: "20"}
    response, _ = run(review_of(annotations), cluster)
    pod = patched_pod(review_of(annotations), cluster)
    req = resolved.decode(pod["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST])
    # The request is the recommendation; a limit below it is raised to it (20 → 23), VRAM's limit too.
    assert (req.tflops_request, req.tflops_limit) == (23_000, 23_000)
    assert (req.vram_request, req.vram_limit) == (6 * 1024**3, 6 * 1024**3)
    assert req.auto_requests == (
        "TensorFusionWorkload default/train status.autoScaling.requests (autoSetRequests): "
        "tflops request 10 → 23, vram request 4Gi → 6Gi"
    )
    assert [w for w in response["warnings"] if w.startswith("requests set by")] == [
        f"requests set by {req.auto_requests}"
    ]


def test_auto_requests_changes_nothing_without_a_recommendation_or_outside_its_target() -> None:
    waiting = FakeCluster(workloads={("default", "train"): _workload_recommending({"reason": "WaitingForHistory"})})
    annotations = {**BASIC, A.WORKLOAD.value: "train", A.AUTO_REQUESTS.value: "true"}
    req = resolved.decode(
        patched_pod(review_of(annotations), waiting)["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST]
    )
    assert (req.tflops_request, req.auto_requests) == (10_000, None)
    # The layer off: the recommendation is not used.
    recommending = FakeCluster(workloads={("default", "train"): _workload_recommending({"tflopsRequest": "23"})})
    off = {**BASIC, A.WORKLOAD.value: "train"}
    req = resolved.decode(
        patched_pod(review_of(off), recommending)["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST]
    )
    assert (req.tflops_request, req.auto_requests) == (10_000, None)
    # targetResource vram: the TFLOPS recommendation is left alone.
    profile = {"spec": {"autoScalingConfig": {"autoSetRequests": {"enable": True, "targetResource": "vram"}}}}
    recommending.profiles[("default", "p")] = profile
    vram_only = {**BASIC, A.WORKLOAD.value: "train", A.WORKLOAD_PROFILE.value: "p"}
    req = resolved.decode(
        patched_pod(review_of(vram_only), recommending)["metadata"]["annotations"][SystemAnnotation.RESOLVED_REQUEST]
    )
    assert (req.tflops_request, req.auto_requests) == (10_000, None)


FOUR_GPUS = ",".join(f"GPU-{i}" for i in range(4))


def test_the_device_plugins_variables_are_removed_from_every_container_of_a_gpu_pod_naming_key_and_value() -> None:
    # The kubelet puts a container's own env after the plugin's answer and the runtime keeps the last:
    # without this, a tenant's NVIDIA_VISIBLE_DEVICES and HAMi-core limits would be the ones in force.
    doc = review_of({**BASIC, A.INJECT_CONTAINER.value: "python"}, containers=("python", "sidecar"))
    spec = doc["request"]["object"]["spec"]
    spec["containers"][0]["env"] = [
        {"name": "HOME", "value": "/home/me"},
        {"name": Env.NVIDIA_VISIBLE_DEVICES.value, "value": FOUR_GPUS},
        {"name": f"{Env.HAMI_MEMORY_LIMIT_PREFIX}0", "value": "81920m"},
        {"name": Env.HAMI_SM_LIMIT.value, "value": "100"},
        {"name": Env.HAMI_SHARED_REGION.value, "value": "/tmp/own.cache"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},  # not the plugin's: kept
    ]
    spec["containers"][1]["env"] = [
        {"name": f"{Env.HAMI_SM_LIMIT}_3", "value": "100"},
        {"name": Env.TF_POD_NAME.value, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    spec["initContainers"] = [{"name": "setup", "image": "busybox", "env": [{"name": "NVIDIA_VISIBLE_DEVICES",
                                                                           "value": "all"}]}]  # fmt: skip
    response, _ = run(doc)
    assert response["allowed"] is True, response
    pod = apply_patch(doc["request"]["object"], decode_patch(response))
    envs = [c.get("env") for c in (*pod["spec"]["initContainers"], *pod["spec"]["containers"])]
    assert envs == [[], [{"name": "HOME", "value": "/home/me"}, {"name": "CUDA_VISIBLE_DEVICES", "value": "0"}], []]
    problem = (
        "set by the device plugin; removed: a container's own value is not accepted, the plugin sets it from "
        "the pod's GPU grant (its tensor-fusion.ai/ annotations)"
    )
    assert [w for w in response["warnings"] if "set by the device plugin" in w] == [
        f"spec.initContainers[setup].env[NVIDIA_VISIBLE_DEVICES] 'all': {problem}",
        f"spec.containers[python].env[NVIDIA_VISIBLE_DEVICES] '{FOUR_GPUS}': {problem}",
        f"spec.containers[python].env[CUDA_DEVICE_MEMORY_LIMIT_0] '81920m': {problem}",
        f"spec.containers[python].env[CUDA_DEVICE_SM_LIMIT] '100': {problem}",
        f"spec.containers[python].env[CUDA_DEVICE_MEMORY_SHARED_CACHE] '/tmp/own.cache': {problem}",
        f"spec.containers[sidecar].env[CUDA_DEVICE_SM_LIMIT_3] '100': {problem}",
        f"spec.containers[sidecar].env[TENSOR_FUSION_POD_NAME] 'valueFrom fieldRef': {problem}",
    ]


def test_a_pod_not_opted_in_keeps_such_variables_and_other_names_are_not_the_plugins() -> None:
    plain = review_of(BASIC, labels={"app": "x"})
    plain["request"]["object"]["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    response, _ = run(plain)
    assert response["allowed"] is True and "patch" not in response
    assert not any(set_by_plugin(n) for n in ("CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUDA_DEVICE"))


@pytest.mark.parametrize(
    ("mode", "limit", "said"),
    [
        ("shared", "20", "tensor-fusion.ai/isolation 'shared': the TFLOPS limit 20 is not enforced"),
        ("soft", "20", "tensor-fusion.ai/isolation 'soft': the TFLOPS limit 20 is held by HAMi-core inside the pod"),
        ("hard", "20", "tensor-fusion.ai/isolation 'hard': each pod may use up to its TFLOPS limit (20 here)"),
        # limit = request: the request holds where its neighbours do the same, but the limit is each process's
        ("hard", "10", "tensor-fusion.ai/isolation 'hard': the TFLOPS limit 10 holds each of the pod's processes"),
        (None, "20", None),  # no mode named: the node's own, whose promise the docs state
    ],
)
def test_an_isolation_mode_that_does_not_hold_a_value_says_so(mode: str | None, limit: str, said: str | None) -> None:
    annotations = {**BASIC, A.TFLOPS_REQUEST.value: "10", A.TFLOPS_LIMIT.value: limit}
    if mode is not None:
        annotations[A.ISOLATION.value] = mode
    response, _ = run(review_of(annotations))
    assert response["allowed"] is True
    warned = [w for w in response.get("warnings") or [] if w.startswith(A.ISOLATION.value)]
    assert warned == [] if said is None else (len(warned) == 1 and warned[0].startswith(said)), warned
    if mode is not None:
        assert resolved.decode(patched_pod(review_of(annotations))["metadata"]["annotations"][resolved.KEY]).isolation


@pytest.mark.parametrize(
    ("extra", "compute"),
    [
        ({}, "its TFLOPS limit 20 holds each one alone, so together they may use up to 3 times it; "),
        ({A.ISOLATION.value: "shared"}, ""),  # shared holds no TFLOPS limit at all: its own warning says so
    ],
)
def test_inject_containers_that_share_the_pods_gpus_are_told_which_limits_hold_them_together(
    extra: dict[str, str], compute: str
) -> None:
    annotations = {**BASIC, A.TFLOPS_LIMIT.value: "20", A.INJECT_CONTAINER.value: "a,b,c", **extra}
    response, _ = run(review_of(annotations, containers=("a", "b", "c")))
    assert response["allowed"] is True
    assert [w for w in response["warnings"] if w.startswith(A.INJECT_CONTAINER.value)] == [
        f"{A.INJECT_CONTAINER.value} 'a,b,c': these 3 containers share the pod's GPUs, and each is given the pod's "
        f"whole grant, its limiter holding each one alone: {compute}the pod's VRAM limit 4Gi holds for them "
        "together only by the driver's count, the device plugin killing the largest of their processes once "
        "together they stay past it (docs/security.md). For limits that hold each container, give each its own "
        f"GPUs ({A.CONTAINER_GPU_COUNT.value}) or the GPU to one"
    ]


@pytest.mark.parametrize(
    ("annotations", "containers"),
    [
        pytest.param({**BASIC, A.INJECT_CONTAINER.value: "a"}, ("a", "b"), id="one-inject-container"),
        pytest.param({**BASIC, A.CONTAINER_GPU_COUNT.value: '{"a": 1, "b": 1}'}, ("a", "b"), id="each-its-own-gpus"),
        pytest.param({A.INJECT_CONTAINER.value: "a,b", A.DEDICATED_GPU.value: "true"}, ("a", "b"), id="whole-gpus"),
    ],
)
def test_inject_containers_that_do_not_share_a_grant_are_not_warned(
    annotations: dict[str, str], containers: tuple[str, ...]
) -> None:
    response, _ = run(review_of(annotations, containers=containers))
    assert response["allowed"] is True, response
    assert not [w for w in response.get("warnings") or [] if w.startswith(A.INJECT_CONTAINER.value)]
