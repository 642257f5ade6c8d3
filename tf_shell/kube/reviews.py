"""The API server's two reviews, asked with the official client: whose is a bearer token (TokenReview), and may a
user do something (SubjectAccessReview). The port they fill is :class:`tf_shell.access.Reviews`; errors are
:class:`~tf_shell.kube.api.GatewayError`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from tf_shell.kube.api import RawObject
from tf_shell.kube.client import CALL_TIMEOUT, call, json_body


class KubeReviews:
    """Over one ApiClient (thread-safe)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.authentication = client.AuthenticationV1Api(api)
        self.authorization = client.AuthorizationV1Api(api)

    def token_review(self, body: RawObject) -> RawObject:
        """Create a TokenReview; the API server's answer, its status filled in."""
        return _created("create tokenreview", self.authentication.create_token_review, body)

    def review(self, body: RawObject) -> RawObject:
        """Create a SubjectAccessReview; the API server's answer, its status filled in."""
        return _created("create subjectaccessreview", self.authorization.create_subject_access_review, body)


def _created(what: str, create: Callable[..., Any], body: RawObject) -> RawObject:
    return call(what, lambda: json_body(create(body, _preload_content=False, _request_timeout=CALL_TIMEOUT)))


def authorization_header(api: client.ApiClient) -> str | None:
    """The ``Authorization`` header this client sends the API server (``Bearer <token>``; in a pod, its
    ServiceAccount's token, re-read as the client refreshes it); None for a client that authenticates by
    certificate or password (never sent anywhere else). Our programs show the same identity to the device
    plugins' ``/usage``."""
    for setting in api.configuration.auth_settings().values():  # runs the client's token refresh hook
        value = str(setting.get("value") or "")
        if setting.get("in") == "header" and value.lower().startswith("bearer "):
            return value
    return None  # a certificate, or a password: nothing a plugin may be shown
