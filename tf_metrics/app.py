"""tf-metrics' HTTP shell: discovery and metric reads for the aggregator, health and Prometheus metrics for anyone.

Every ``/apis/...`` request must come from the API server's front proxy (``auth.authenticate``, 401
otherwise); a metric read is then authorised with a SubjectAccessReview, whose verdict is kept for
``ttl`` seconds per user and attributes, as the API server's delegating authorizer keeps its own, so
an HPA polling every 15 s costs one review per ``ttl``. Discovery needs no review: the API server's
``system:discovery`` role gives it to every user. Answers are the documents of ``api``, errors
included (a Status, never an HTML page): a bad request is a 4xx that says what is wrong; a 5xx only
when the API server cannot be asked. ``/healthz``, ``/livez``, ``/readyz`` and ``/metrics`` need no
certificate, for the kubelet's probes and Prometheus.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import orjson
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from starlette.exceptions import HTTPException

from tf_metrics import api
from tf_metrics.api import Answer, Query
from tf_metrics.auth import FrontProxy, Unauthenticated, access_review, authenticate, forbidden_message
from tf_metrics.peer import peer_common_name
from tf_shell.access import Expiring, User, Verdict, verdict
from tf_shell.kube.api import GatewayError, RawObject
from vgpu.metric_names import METRICS_API
from vgpu.names import CUSTOM_METRICS_GROUP
from vgpu.usage_samples import Snapshot

log = logging.getLogger(__name__)
PREFIX: Final = f"/apis/{CUSTOM_METRICS_GROUP}"


class MetricsReads(Protocol):
    """What the app asks the API server (``tf_shell.kube.reads.MetricsCluster``)."""

    def pods(self, namespace: str | None, label_selector: str) -> list[RawObject]: ...

    def review(self, body: RawObject) -> RawObject: ...


class Verdicts:
    """SubjectAccessReview verdicts per (user, query), each for ``ttl`` seconds."""

    def __init__(self, cluster: MetricsReads, ttl: float, clock: Callable[[], float]) -> None:
        self._cluster, self._ttl, self._clock = cluster, ttl, clock
        self._held: Expiring[tuple[User, Query], Verdict] = Expiring()

    def judge(self, user: User, query: Query) -> Verdict:
        """The verdict (GatewayError when the API server cannot be asked)."""
        now = self._clock()
        held = self._held.get((user, query), now)
        if held is not None:
            return held[0]
        answered = verdict(self._cluster.review(access_review(user, query)))
        self._held.keep((user, query), answered, now + self._ttl)
        return answered


def create_app(
    *,
    proxy: FrontProxy,
    samples: Callable[[], Snapshot],
    cluster: MetricsReads,
    ready: Callable[[], bool],
    registry: CollectorRegistry,
    ttl: float = 10.0,
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    """The app over the collector's ``samples``; ``ready`` says whether its first pass is done."""
    verdicts = Verdicts(cluster, ttl, clock)
    answers = Counter(
        f"{METRICS_API}_requests", "Custom metrics API requests by HTTP status.", ["code"], registry=registry
    )
    app = FastAPI(title="tensor-fusion custom metrics API", docs_url=None, redoc_url=None, openapi_url=None)

    def send(answer: Answer) -> Response:
        answers.labels(str(answer.code)).inc()
        return Response(orjson.dumps(answer.body), status_code=answer.code, media_type="application/json")

    def caller(request: Request) -> User | Answer:
        try:
            return authenticate(peer_common_name(request.scope), _headers(request), proxy)
        except Unauthenticated as exc:
            return Answer(401, api.status(401, "Unauthorized", str(exc)))

    @app.exception_handler(HTTPException)
    def _status(_request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 405:
            return send(Answer(405, api.status(405, "MethodNotAllowed", "only GET is served")))
        return send(api.no_such_path() if exc.status_code == 404 else api.bad_request(str(exc.detail)))

    @app.get("/healthz")
    @app.get("/livez")
    def healthz() -> Response:
        return Response("ok", media_type="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        if ready():
            return Response("ok", media_type="text/plain")
        return Response("waiting for the first pass over the device plugins", 503, media_type="text/plain")

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get(PREFIX)
    def group(request: Request) -> Response:
        user = caller(request)
        return send(user if isinstance(user, Answer) else Answer(200, api.api_group()))

    @app.get(PREFIX + "/{version}")
    def resources(request: Request, version: str) -> Response:
        user = caller(request)
        return send(user if isinstance(user, Answer) else api.resource_list(version))

    def read(request: Request, query: Query) -> Response:
        user = caller(request)
        if isinstance(user, Answer):
            return send(user)
        refused = api.check(query, request.query_params.get("metricLabelSelector", ""))
        if refused is not None:
            return send(refused)
        try:
            judged = verdicts.judge(user, query)
        except GatewayError as exc:
            log.warning("cannot authorise %s reading %s: %s", user.name, query, exc)
            return send(Answer(503, api.status(503, "ServiceUnavailable", f"cannot authorise the request: {exc}")))
        if not judged.allowed:
            reason = f": {judged.reason}" if judged.reason else ""
            return send(Answer(403, api.status(403, "Forbidden", forbidden_message(user, query) + reason)))
        selector = request.query_params.get("labelSelector", "")
        uids = None
        if selector:
            chosen = _chosen(cluster, query, selector)
            if isinstance(chosen, Answer):
                return send(chosen)
            uids = chosen
        return send(api.answer(query, samples(), clock(), uids))

    @app.get(PREFIX + "/{version}/namespaces/{namespace}/{resource}/{name}/{metric}")
    def namespaced(request: Request, version: str, namespace: str, resource: str, name: str, metric: str) -> Response:
        query = Query(version=version, resource=resource, namespace=namespace, name=name, metric=metric)
        return read(request, query)

    @app.get(PREFIX + "/{version}/{resource}/{name}/{metric}")
    def cluster_scoped(request: Request, version: str, resource: str, name: str, metric: str) -> Response:
        return read(request, Query(version=version, resource=resource, namespace=None, name=name, metric=metric))

    return app


def _headers(request: Request) -> Sequence[tuple[str, str]]:
    return [(key.decode("latin-1"), value.decode("latin-1")) for key, value in request.scope["headers"]]


def _chosen(cluster: MetricsReads, query: Query, selector: str) -> frozenset[str] | Answer:
    """The UIDs of the pods ``selector`` chooses in the query's namespace, or the error to answer."""
    if query.resource != "pods":
        return api.bad_request(f"labelSelector {selector!r}: only pod metrics are selected by label")
    namespace = None if query.namespace == api.ALL else query.namespace
    try:
        pods: list[dict[str, Any]] = cluster.pods(namespace, selector)
    except GatewayError as exc:
        if exc.status == 400:
            return api.bad_request(f"labelSelector {selector!r}: {exc}")
        return Answer(503, api.status(503, "ServiceUnavailable", f"cannot list the pods of the label selector: {exc}"))
    return frozenset(str((p.get("metadata") or {}).get("uid") or "") for p in pods)
