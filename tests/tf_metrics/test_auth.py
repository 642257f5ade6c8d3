"""The front proxy's configuration as the API server publishes it; the user headers believed only from a
certificate the requestheader CA verified with an allowed name; the SubjectAccessReview the API server's
own request info would give the same read."""

from __future__ import annotations

import pytest

from tf_metrics.api import Query
from tf_metrics.auth import FrontProxy, Unauthenticated, access_review, authenticate, front_proxy
from tf_shell.access import User, verdict

# What kube-apiserver writes into kube-system/extension-apiserver-authentication (the e2e flags').
PUBLISHED = {
    "client-ca-file": "-----BEGIN CERTIFICATE-----\nclient\n-----END CERTIFICATE-----\n",
    "requestheader-client-ca-file": "-----BEGIN CERTIFICATE-----\nproxy\n-----END CERTIFICATE-----\n",
    "requestheader-allowed-names": '["front-proxy-client"]',
    "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    "requestheader-group-headers": '["X-Remote-Group"]',
    "requestheader-username-headers": '["X-Remote-User"]',
    "requestheader-uid-headers": '["X-Remote-Uid"]',
}
PROXY = front_proxy(PUBLISHED)


def test_the_published_configuration_is_read() -> None:
    assert front_proxy(PUBLISHED) == FrontProxy(
        client_ca=PUBLISHED["requestheader-client-ca-file"].strip(),
        allowed_names=frozenset({"front-proxy-client"}),
        username_headers=("X-Remote-User",),
        group_headers=("X-Remote-Group",),
        extra_prefixes=("X-Remote-Extra-",),
        uid_headers=("X-Remote-Uid",),
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"client-ca-file": "x"}, "its aggregation layer is not configured"),
        ({**PUBLISHED, "requestheader-allowed-names": "front-proxy-client"}, "is not a JSON list"),
        ({**PUBLISHED, "requestheader-group-headers": "[1]"}, "is not a JSON list of strings"),
        ({**PUBLISHED, "requestheader-username-headers": "[]"}, "no header names the user"),
    ],
)
def test_a_configuration_that_cannot_be_used_says_why(data: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        front_proxy(data)


def test_the_front_proxy_names_the_user_groups_and_extras() -> None:
    headers = [
        ("x-remote-user", "alice"),
        ("X-Remote-Group", "devs"),
        ("x-remote-group", "system:authenticated"),
        ("X-Remote-Extra-Scopes", "a"),
        ("x-remote-extra-scopes", "b"),
        ("X-Remote-Extra-Acme.com%2Fproject", "p1"),
        ("X-Remote-Uid", "u-1"),
        ("X-Other", "ignored"),
    ]
    assert authenticate("front-proxy-client", headers, PROXY) == User(
        name="alice",
        groups=("devs", "system:authenticated"),
        extra=(("acme.com/project", ("p1",)), ("scopes", ("a", "b"))),
        uid="u-1",
    )


@pytest.mark.parametrize(
    ("common_name", "headers", "message"),
    [
        (None, [("X-Remote-User", "admin")], "no client certificate signed by the API server's requestheader"),
        ("someone-else", [("X-Remote-User", "admin")], "CN 'someone-else' is not one of the allowed names"),
        ("front-proxy-client", [("X-Remote-Group", "system:masters")], "named no user"),
    ],
)
def test_headers_are_believed_only_from_the_front_proxy(
    common_name: str | None, headers: list[tuple[str, str]], message: str
) -> None:
    with pytest.raises(Unauthenticated, match=message):
        authenticate(common_name, headers, PROXY)


def test_any_certificate_of_the_ca_when_no_name_is_required() -> None:
    anyone = front_proxy({**PUBLISHED, "requestheader-allowed-names": "[]"})
    assert authenticate("other", [("X-Remote-User", "bob")], anyone).name == "bob"


def test_the_review_asks_what_the_api_server_authorised() -> None:
    user = User(name="alice", groups=("devs",), extra=(("scopes", ("a",)),), uid="u-1")
    query = Query(version="v1beta1", resource="pods", namespace="team-a", name="*", metric="gpu_utilization")
    assert access_review(user, query) == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "verb": "get", "group": "custom.metrics.k8s.io", "version": "v1beta1", "resource": "pods",
                "subresource": "gpu_utilization", "name": "*", "namespace": "team-a",
            },
            "user": "alice", "groups": ["devs"], "extra": {"scopes": ["a"]}, "uid": "u-1",
        },
    }  # fmt: skip
    nodes = Query(version="v1beta2", resource="nodes", namespace=None, name="n1", metric="gpu_tflops")
    assert "namespace" not in access_review(User(name="bob"), nodes)["spec"]["resourceAttributes"]


@pytest.mark.parametrize(
    ("status", "allowed", "reason"),
    [
        ({"allowed": True, "reason": 'RBAC: allowed by ClusterRoleBinding "x"'}, True, 'RBAC: allowed by ClusterRoleBinding "x"'),
        ({"allowed": False}, False, ""),
        ({"allowed": True, "denied": True}, False, ""),
        ({"allowed": False, "evaluationError": "webhook down"}, False, "webhook down"),
        ({}, False, ""),
    ],
)  # fmt: skip
def test_the_verdict(status: dict[str, object], allowed: bool, reason: str) -> None:
    judged = verdict({"status": status})
    assert (judged.allowed, judged.reason) == (allowed, reason)
