"""The throughput benchmark's price list reads kube-apiserver's counters as the API server writes them."""

from __future__ import annotations

from benchmarks.api_calls import beyond, counts, per_pod

# The shape of kube-apiserver v1.36's /metrics for these families (trimmed to the lines that matter).
BEFORE = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 100
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 100
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 40
# HELP apiserver_watch_events_total [ALPHA] Number of events sent in watch clients
# TYPE apiserver_watch_events_total counter
apiserver_watch_events_total{group="",resource="pods",version="v1"} 500
# HELP apiserver_admission_webhook_admission_duration_seconds [STABLE] Admission webhook latency histogram in seconds, identified by name and broken out for each operation and API resource and type (validate or admit).
# TYPE apiserver_admission_webhook_admission_duration_seconds histogram
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.tensor-fusion.ai",operation="CREATE",rejected="false",type="admit",le="0.005"} 3
apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.tensor-fusion.ai",operation="CREATE",rejected="false",type="admit",le="+Inf"} 10
apiserver_admission_webhook_admission_duration_seconds_sum{name="pods.tensor-fusion.ai",operation="CREATE",rejected="false",type="admit"} 0.04
apiserver_admission_webhook_admission_duration_seconds_count{name="pods.tensor-fusion.ai",operation="CREATE",rejected="false",type="admit"} 10
"""


def after(pods: int) -> str:
    """BEFORE after ``pods`` GPU pods: each created (its webhook called), bound, its node's claims Lease
    written, and seen by three watchers twice (created, bound)."""
    return (
        BEFORE.replace("} 100", f"}} {100 + pods}")
        .replace("} 40", f"}} {40 + pods}")
        .replace("} 500", f"}} {500 + 6 * pods}")
        .replace('type="admit"} 10', f'type="admit"}} {10 + pods}')
        .replace('le="+Inf"} 10', f'le="+Inf"}} {10 + pods}')
    )


def test_requests_are_keyed_by_verb_and_resource_with_codes_summed_and_the_group_named() -> None:
    found = counts(BEFORE)
    assert found["POST pods"] == 100
    assert found["POST pods/binding"] == 102  # 201s and 409s alike: each reached the API server
    assert found["PUT leases.coordination.k8s.io"] == 40
    assert found["watch events pods"] == 500
    assert found["webhook pods.tensor-fusion.ai"] == 10  # the histogram's count, not a bucket or its sum


def test_per_pod_is_the_difference_over_the_case_largest_first() -> None:
    spent = per_pod(counts(BEFORE), counts(after(50)), 50)
    assert spent == {
        "watch events pods": 6.0,
        "POST pods": 1.0,
        "POST pods/binding": 1.0,
        "PUT leases.coordination.k8s.io": 1.0,
        "webhook pods.tensor-fusion.ai": 1.0,
    }
    assert next(iter(spent)) == "watch events pods"


def test_per_pod_leaves_out_what_a_pod_barely_costs() -> None:
    background = BEFORE.replace("} 40", "} 41")  # one Lease renewal over 100 pods: the cluster's, not theirs
    assert "PUT leases.coordination.k8s.io" not in per_pod(counts(BEFORE), counts(background), 100)


def test_beyond_a_plain_pod_names_only_what_differs() -> None:
    plain = {"POST pods": 1.0, "POST pods/binding": 1.0, "watch events pods": 4.0}
    gpu = {"POST pods": 1.0, "POST pods/binding": 1.0, "watch events pods": 6.0, "PUT leases.coordination.k8s.io": 1.0}
    assert beyond(gpu, plain) == {"watch events pods": 2.0, "PUT leases.coordination.k8s.io": 1.0}
    assert beyond({"POST events": 0.5}, {"POST events": 1.0}) == {"POST events": -0.5}
