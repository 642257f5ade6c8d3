"""Who may read per-pod data off loopback (tf_shell.access): the reviews it asks, the verdicts it keeps, the refusals
it words, over a fake API server that knows two tokens and one right."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tf_shell.access import Access, Gate, Refusal, User, access_review, bearer, on_loopback, reviewed_user
from tf_shell.kube.api import GatewayError, RawObject
from tf_shell.kube.client import api_client
from tf_shell.kube.reviews import authorization_header

STATS = Access(verb="get", resource="nodes", subresource="stats", name="node-a")


class FakeReviews:
    """Tokens ``tf-metrics`` (may get nodes/stats of node-a) and ``tenant`` (may do nothing); ``down`` fails."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.reviews: list[dict[str, Any]] = []
        self.down = False

    def token_review(self, body: RawObject) -> RawObject:
        if self.down:
            raise GatewayError("connection refused")
        token = body["spec"]["token"]
        self.tokens.append(token)
        users = {"tf-metrics": "system:serviceaccount:tf:tf-metrics", "tenant": "system:serviceaccount:team-b:app"}
        if token not in users:
            return {"status": {"authenticated": False, "error": "invalid bearer token"}}
        user = {"username": users[token], "groups": ["system:serviceaccounts"], "uid": "u-1", "extra": {"x": ["1"]}}
        return {"status": {"authenticated": True, "user": user}}

    def review(self, body: RawObject) -> RawObject:
        self.reviews.append(body)
        spec = body["spec"]
        allowed = spec["user"].endswith(":tf-metrics") and spec["resourceAttributes"] == STATS.attributes()
        return {"status": {"allowed": allowed, **({} if allowed else {"reason": "no RBAC policy matched"})}}


def test_on_loopback_no_question_is_asked() -> None:
    reviews = FakeReviews()
    gate = Gate(reviews)
    for peer in ("127.0.0.1", "::1", "::ffff:127.0.0.1", "127.3.2.1"):
        assert gate.check(peer, None, STATS) is None
    assert reviews.tokens == [] and reviews.reviews == []
    assert not any(on_loopback(p) for p in ("10.0.0.7", "::ffff:10.0.0.7", "testclient", "", None))


def test_off_loopback_a_caller_needs_a_token_the_api_server_knows_and_the_right() -> None:
    reviews = FakeReviews()
    gate = Gate(reviews)
    assert gate.check("10.0.0.7", None, STATS) == Refusal(
        401, "Unauthorized: send a bearer token (a ServiceAccount's) in the Authorization header"
    )
    assert gate.check("10.0.0.7", "Basic abc", STATS) is not None and reviews.tokens == []
    assert gate.check("10.0.0.7", "Bearer forged", STATS) == Refusal(
        401, "Unauthorized: the API server did not authenticate the bearer token"
    )
    assert gate.check("10.0.0.7", "Bearer tf-metrics", STATS) is None
    denied = gate.check("10.0.0.7", "Bearer tenant", STATS)
    assert denied == Refusal(
        403,
        'Forbidden: User "system:serviceaccount:team-b:app" cannot get resource "nodes/stats" in API group "" '
        "(node-a): no RBAC policy matched",
    )
    other_node = Access(verb="get", resource="nodes", subresource="stats", name="node-b")
    assert gate.check("10.0.0.7", "bearer tf-metrics", other_node) is not None  # the right names the node


def test_answers_are_kept_ttl_seconds_per_token_and_attributes_and_a_refusal_30_at_most() -> None:
    reviews, now = FakeReviews(), [0.0]
    gate = Gate(reviews, clock=lambda: now[0])  # 120 s, as the kubelet keeps its token reviews
    for _ in range(3):
        assert gate.check("10.0.0.7", "Bearer tf-metrics", STATS) is None
        assert gate.check("10.0.0.7", "Bearer tenant", STATS) is not None
    assert (len(reviews.tokens), len(reviews.reviews)) == (2, 2)
    now[0] = 31.0  # the tenant's refusal is asked again (a grant made meanwhile is seen), the reader's kept
    assert gate.check("10.0.0.7", "Bearer tenant", STATS) is not None
    assert gate.check("10.0.0.7", "Bearer tf-metrics", STATS) is None
    assert (len(reviews.tokens), len(reviews.reviews)) == (2, 3)
    now[0] = 120.5
    assert gate.check("10.0.0.7", "Bearer tf-metrics", STATS) is None
    assert (len(reviews.tokens), len(reviews.reviews)) == (3, 4)


def test_an_api_server_that_cannot_be_asked_is_503_and_nothing_is_kept() -> None:
    reviews = FakeReviews()
    gate = Gate(reviews)
    reviews.down = True
    refused = gate.check("10.0.0.7", "Bearer tf-metrics", STATS)
    assert refused is not None and refused.code == 503 and "connection refused" in refused.message
    reviews.down = False
    assert gate.check("10.0.0.7", "Bearer tf-metrics", STATS) is None


def test_the_reviews_carry_the_user_the_token_review_named() -> None:
    user = reviewed_user(FakeReviews().token_review({"spec": {"token": "tenant"}}))
    assert user == User(
        name="system:serviceaccount:team-b:app", groups=("system:serviceaccounts",), extra=(("x", ("1",)),), uid="u-1"
    )
    explain = Access(verb="get", resource="pods", namespace="team-a", name="p")
    assert access_review(user, explain) == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "resourceAttributes": {"verb": "get", "group": "", "resource": "pods", "name": "p", "namespace": "team-a"},
            "user": "system:serviceaccount:team-b:app",
            "groups": ["system:serviceaccounts"],
            "extra": {"x": ["1"]},
            "uid": "u-1",
        },
    }


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Bearer ", None), ("Basic abc", None), (None, None)],
)
def test_bearer(header: str | None, token: str | None) -> None:
    assert bearer(header) == token


def test_our_programs_show_the_plugins_the_token_they_show_the_api_server(tmp_path: Path) -> None:
    def kubeconfig(user: dict[str, str]) -> str:
        path = tmp_path / "kubeconfig"
        cluster = {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
        path.write_text(yaml.safe_dump(doc))
        return str(path)

    assert authorization_header(api_client(kubeconfig({"token": "abc123"}))) == "Bearer abc123"
    assert authorization_header(api_client(kubeconfig({"username": "a", "password": "b"}))) is None
