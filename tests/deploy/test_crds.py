"""The CRDs in deploy/crds agree with what vgpu/profile.py accepts, so the API server and the
webhook can never disagree on a field; the examples are valid under both, and so is the status the
extender writes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from scheduler_extender.objects import PodRef, WorkloadPod, node_state
from scheduler_extender.pool_status import pool_statuses
from scheduler_extender.status import status_patch
from scheduler_extender.workload_status import workload_statuses
from vgpu import fields
from vgpu.autoscale import config as autoscale_config
from vgpu.autoscale.config import AUTO_BLOCKS
from vgpu.errors import DomainError
from vgpu.names import (
    CRD_GROUP,
    CRD_VERSION,
    KIND_GPU_POOL,
    KIND_WORKLOAD,
    KIND_WORKLOAD_PROFILE,
    LABEL_NODE_POOL,
    PLURAL_GPU_POOL,
    PLURAL_WORKLOAD,
    PLURAL_WORKLOAD_PROFILE,
    IsolationMode,
    Qos,
)
from vgpu.profile import ProfileSpec, Resources, parse_spec, to_crd
from vgpu.quantity import parse

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CRDS = {
    KIND_WORKLOAD_PROFILE: ("workloadprofiles.yaml", PLURAL_WORKLOAD_PROFILE, "Namespaced"),
    KIND_WORKLOAD: ("tensorfusionworkloads.yaml", PLURAL_WORKLOAD, "Namespaced"),
    KIND_GPU_POOL: ("gpupools.yaml", PLURAL_GPU_POOL, "Cluster"),
}
PREDICTION_FIELDS = {"enable", "model", "historyDataPeriod", "predictionPeriod"}
READY_COLUMN = '.status.conditions[?(@.type=="Ready")].status'


def crd(kind: str) -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "crds" / CRDS[kind][0]).read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def root_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def spec_schema(kind: str) -> dict[str, Any]:
    props = root_schema(kind)["properties"]
    schema: dict[str, Any] = props["spec"]["properties"]["defaults"] if kind == KIND_GPU_POOL else props["spec"]
    return schema


def strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def validator(kind: str) -> Any:
    return jsonschema_rs.validator_for(json.loads(json.dumps(root_schema(kind))))


@pytest.mark.parametrize("kind", list(CRDS))
def test_names_come_from_vgpu_names(kind: str) -> None:
    doc = crd(kind)
    _, plural, scope = CRDS[kind]
    assert doc["metadata"]["name"] == f"{plural}.{CRD_GROUP}"
    assert (doc["spec"]["group"], doc["spec"]["scope"]) == (CRD_GROUP, scope)
    assert (doc["spec"]["names"]["kind"], doc["spec"]["names"]["plural"]) == (kind, plural)
    assert [v["name"] for v in doc["spec"]["versions"]] == [CRD_VERSION]


def test_profile_workload_and_pool_defaults_share_one_spec_schema() -> None:
    shapes = [strip_descriptions(spec_schema(kind)) for kind in CRDS]
    assert shapes[0] == shapes[1] == shapes[2]


def test_auto_scaling_tree_matches_vgpu_profile_exactly() -> None:
    tree = spec_schema(KIND_WORKLOAD_PROFILE)["properties"]["autoScalingConfig"]["properties"]
    assert set(tree) == set(AUTO_BLOCKS)
    for block, schema in AUTO_BLOCKS.items():
        assert set(tree[block]["properties"]) == set(schema), block
        for key, kind in schema.items():
            if kind == "prediction":
                assert set(tree[block]["properties"][key]["properties"]) == PREDICTION_FIELDS


AUTO_TEXTS = {
    "ratio": ["0.2", "20%", "5.0", "500%", "0", "12.5%", "1", "20 %", ".2", "1e2", "-1", "0.2.1", "%", "five"],
    "duration": ["5m", "1h30m", "0.5s", "7d", "250us", "2w", "0s", "5", "5 m", "-5m", "1y", "m"],
    "steps": ["2", "50%", "1000000", "1", "0", "0.2", "02", "-1", "2 %", "half"],
}


@pytest.mark.parametrize(("block", "key"), [(b, k) for b, s in AUTO_BLOCKS.items() for k in s if s[k] in AUTO_TEXTS])
def test_the_crd_refuses_no_auto_scaling_value_the_webhook_accepts(block: str, key: str) -> None:
    """The API server checks syntax only (the webhook also checks ranges), and never refuses what admits a pod."""
    tree = spec_schema(KIND_WORKLOAD_PROFILE)["properties"]["autoScalingConfig"]["properties"]
    pattern = re.compile(tree[block]["properties"][key]["pattern"])
    for text in AUTO_TEXTS[AUTO_BLOCKS[block][key]]:
        try:
            autoscale_config.parse({block: {key: text}})
        except DomainError:
            continue
        assert pattern.search(text), text
    assert not pattern.search("20 percent") and not pattern.search("")


def test_every_crd_field_is_accepted_by_parse_spec_and_every_parsed_field_is_in_the_crd() -> None:
    props = spec_schema(KIND_WORKLOAD_PROFILE)["properties"]
    samples = {
        "resources": {"requests": {"tflops": "1"}},
        "replicas": 1,
        "poolName": "p",
        "qos": "low",
        "isLocalGPU": True,
        "standaloneWorkerMode": False,
        "gpuModel": "A100",
        "gpuCount": 2,
        "nodeAffinity": {},
        "autoScalingConfig": {"autoSetLimits": {"enable": True}},
        "isolation": "hard",
    }
    assert set(samples) == set(props)
    for key, value in samples.items():
        parse_spec({key: value}, where="crd")  # raises on a field vgpu does not know
    full = ProfileSpec(
        resources=Resources(tflops_request=1, tflops_limit=1, vram_request=1, vram_limit=1),
        replicas=1,
        pool_name="p",
        qos=Qos.LOW,
        is_local_gpu=True,
        standalone_worker_mode=True,
        gpu_model="A100",
        gpu_count=1,
        node_affinity={},
        auto_scaling={"autoSetLimits": {"enable": True}},
        isolation=IsolationMode.SOFT,
    )
    assert set(to_crd(full)) == set(props)
    assert parse_spec(to_crd(full), where="crd") == full


def test_enums_and_ranges_match_vgpu() -> None:
    props = spec_schema(KIND_WORKLOAD_PROFILE)["properties"]
    assert props["qos"]["enum"] == [q.value for q in Qos]
    assert props["isolation"]["enum"] == [m.value for m in IsolationMode]
    assert (props["gpuCount"]["minimum"], props["gpuCount"]["maximum"]) == (1, fields.MAX_GPU_COUNT)
    assert (props["replicas"]["minimum"], props["replicas"]["maximum"]) == (0, fields.MAX_REPLICAS)


QUANTITY = re.compile(
    spec_schema(KIND_WORKLOAD_PROFILE)["properties"]["resources"]["properties"]["requests"]["properties"]["tflops"][
        "pattern"
    ]
)


@given(text=st.from_regex(r"\A[+]?[0-9.]{0,6}([eE][+-]?[0-9.]{0,3}|[KMGTPE]i?|[numk]|Xi)?\Z") | st.text(max_size=8))
@example(text="0E0.")  # the API server takes whole exponents only; vgpu once read this as 0
@example(text="1e1.0")
def test_crd_quantity_pattern_agrees_with_the_webhook_parser(text: str) -> None:
    try:
        parse(text)
        parsed = True
    except DomainError:
        parsed = False
    exponent_too_big = bool(re.search(r"[eE][+-]?0*([3-9][0-9]|[1-9][0-9]{2,}|3[1-9])", text))
    negative_zero = text.startswith("-")  # vgpu reads "-0" as 0; the CRD simply refuses any sign but +
    if not exponent_too_big and not negative_zero and text == text.strip():
        assert bool(QUANTITY.match(text)) == parsed, text


def test_examples_are_valid_for_the_api_server_and_the_webhook() -> None:
    for name, kind in (("workloadprofile.yaml", KIND_WORKLOAD_PROFILE), ("gpupool.yaml", KIND_GPU_POOL)):
        doc = yaml.safe_load((DEPLOY / "examples" / name).read_text(encoding="utf-8"))
        assert doc["kind"] == kind and doc["apiVersion"] == f"{CRD_GROUP}/{CRD_VERSION}"
        validator(kind).validate(doc)
        spec = doc["spec"]["defaults"] if kind == KIND_GPU_POOL else doc["spec"]
        parse_spec(spec, where=name)


def test_schema_rejects_what_the_webhook_rejects() -> None:
    bad = {"apiVersion": "tensor-fusion.ai/v1", "kind": KIND_WORKLOAD_PROFILE, "metadata": {}}
    check = validator(KIND_WORKLOAD_PROFILE)
    for spec in ({"qos": "gold"}, {"gpuCount": 0}, {"gpuCount": 129}, {"resources": {"limits": {"vram": "4GB"}}}):
        assert not check.is_valid({**bad, "spec": spec}), spec


def test_workload_status_holds_replicas_and_allocated_resources() -> None:
    version = crd(KIND_WORKLOAD)["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"replicas", "allocatedTflops", "allocatedVram", "conditions"} <= set(status)
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Replicas"] == ".status.replicas" and columns["TFLOPS"] == ".status.allocatedTflops"
    assert columns["Ready"] == READY_COLUMN


def test_pool_status_holds_nodes_gpus_capacity_and_allocation() -> None:
    version = crd(KIND_GPU_POOL)["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Ready"] == READY_COLUMN and columns["Nodes"] == ".status.nodes"
    assert (columns["TFLOPS"], columns["Allocated"]) == (".status.capacityTflops", ".status.allocatedTflops")


def written_status(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the status the extender's writer patches onto it (one node, one pod holding GPUs)."""
    node = {"metadata": {"name": "n1", "labels": {LABEL_NODE_POOL: "default-pool"}}}
    statuses = {
        KIND_WORKLOAD: workload_statuses([], [WorkloadPod(PodRef(namespace="ns", name="p", uid="u"), "w")]),
        KIND_GPU_POOL: pool_statuses([node_state(node, "default-pool")], []),
    }[kind]
    meta = obj["metadata"]
    patch = status_patch(obj, statuses((meta.get("namespace"), meta["name"]), obj), "2027-01-15T08:00:00Z")
    assert patch is not None
    return {**obj, **patch}


@pytest.mark.parametrize("kind", [KIND_WORKLOAD, KIND_GPU_POOL])
def test_the_status_the_extender_writes_is_valid_and_conditions_are_metav1_shaped(kind: str) -> None:
    meta = {"name": "w", "generation": 2} | ({"namespace": "ns"} if kind == KIND_WORKLOAD else {})
    obj = written_status(kind, {"apiVersion": f"{CRD_GROUP}/{CRD_VERSION}", "kind": kind, "metadata": meta, "spec": {}})
    validator(kind).validate(obj)
    (condition,) = obj["status"]["conditions"]
    assert condition["status"] == "False" and condition["observedGeneration"] == 2
    bad = {**obj, "status": {**obj["status"], "conditions": [{**condition, "reason": "not camel case"}]}}
    assert not validator(kind).is_valid(bad)
