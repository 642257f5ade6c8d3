"""The webhook's HTTP shell: FastAPI app factory, lifespan-owned cluster client, one POST route.

Thin on purpose: parse, ``decision.decide``, do the workload write the decision asked for, encode.
One route per webhook entry: ``/mutate`` for pods labelled for us and Jobs whose pod template is
(``job_template.py``), and one per value of the namespace
label that migrates NVIDIA GPU pods (the API server does not tell a webhook the namespace's labels,
so the entry that called says which value selected the namespace).
Every path answers HTTP 200 with a well-formed AdmissionReview, because anything else becomes the
webhook's failurePolicy (Fail) and the user sees a transport error instead of our reason.
Blocking Kubernetes calls run in the thread pool, never on the event loop; the GPUPools are watched into
a cache (``pool_cache.py``) by a daemon thread that runs as long as the app.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any, Final, TypedDict

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, ProcessCollector, generate_latest
from starlette.concurrency import run_in_threadpool

from tf_webhook import review
from tf_webhook.cluster import AdmissionCluster, ClusterUnavailable
from tf_webhook.decision import decide
from tf_webhook.job_template import decide_job, is_job_create
from tf_webhook.kube import KubeAdmission
from tf_webhook.migration import Migration
from tf_webhook.pool_cache import PoolCache, PoolFeed
from tf_webhook.settings import WebhookSettings
from vgpu import metric_names
from vgpu.names import DISTRIBUTION, MigrationMode

log = logging.getLogger(__name__)
MUTATE_PATH: Final = "/mutate"
MIGRATE_PATHS: Final = {MigrationMode.WHOLE: "/migrate/whole", MigrationMode.TIME_SLICED: "/migrate/time-sliced"}


class State(TypedDict):
    cluster: AdmissionCluster
    admissions: Counter
    registry: CollectorRegistry


def handle(
    body: bytes,
    cluster: AdmissionCluster,
    admissions: Counter,
    tolerations: Sequence[Mapping[str, Any]] = (),
    migration: Migration | None = None,
) -> dict[str, Any]:
    """One admission call, end to end; always returns an AdmissionReview response document."""
    try:
        req = review.parse(body)
    except review.MalformedReview as exc:
        admissions.labels("malformed").inc()
        return review.respond(exc.uid, review.deny(f"malformed AdmissionReview: {exc}"))
    try:
        if is_job_create(req):  # a Job whose pod template opts in (the entry's matchConditions)
            decision = decide_job(req, lambda pod: decide(pod, cluster, tolerations))
        else:
            decision = decide(req, cluster, tolerations, migration)
        verdict = decision.verdict
        if decision.upsert is not None and verdict.allowed and not req.dry_run:
            try:
                cluster.upsert_workload(decision.upsert)
            except ClusterUnavailable as exc:
                verdict = review.deny(
                    f"could not create or update the workload, try again: {exc}",
                    denial=review.Denial.SERVICE_UNAVAILABLE,
                )
    except Exception:  # a bug must still produce an explained denial, not a transport failure
        log.exception("admission %s failed", req.uid)
        verdict = review.deny(
            "internal error in the tensor-fusion webhook; see its log", denial=review.Denial.INTERNAL_ERROR
        )
    result = "patched" if verdict.patch else "allowed" if verdict.allowed else "denied"
    admissions.labels(result).inc()
    if not verdict.allowed:
        log.info("denied %s/%s (%s): %s", req.namespace, _pod_name(req), req.uid, verdict.message)
    return review.respond(req.uid, verdict)


def create_app(settings: WebhookSettings, cluster: AdmissionCluster | None = None) -> FastAPI:
    """The app; ``cluster`` is injected by tests, otherwise connected at startup from ``settings``."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[State]:
        feed = None
        if cluster is None:
            kubeconfig = str(settings.kubeconfig) if settings.kubeconfig else None
            pools = PoolCache()
            kube = KubeAdmission.connect(kubeconfig, settings.kube_timeout_s, pools)
            feed = PoolFeed(kube.pool_source(), pools)
            feed.start()
            connected: AdmissionCluster = kube
        else:
            connected = cluster
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        info = metric_names.BUILD_INFO
        Gauge(info.name, info.help, info.labels, registry=registry).labels("webhook", version(DISTRIBUTION)).set(1)
        admissions = Counter(
            f"{metric_names.WEBHOOK}_admissions",
            "Admissions of pods, and of Jobs whose pod template opts in, by result "
            "(patched, allowed untouched, denied, malformed)",
            ["result"],
            registry=registry,
        )
        try:
            yield {"cluster": connected, "admissions": admissions, "registry": registry}
        finally:
            if feed is not None:
                feed.stop()

    app = FastAPI(title="tensor-fusion webhook", lifespan=lifespan, docs_url=None, redoc_url=None)

    def route(migration: Migration | None) -> Callable[[Request], Awaitable[Response]]:
        async def mutate(request: Request) -> Response:
            body = await request.body()
            state = request.state
            doc = await run_in_threadpool(
                handle, body, state.cluster, state.admissions, settings.gpu_tolerations, migration
            )
            return Response(json.dumps(doc, ensure_ascii=False), media_type="application/json")

        return mutate

    app.post(MUTATE_PATH)(route(None))
    for mode, path in MIGRATE_PATHS.items():
        app.post(path)(route(Migration(mode, settings.replica_share)))

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics(request: Request) -> Response:
        return Response(generate_latest(request.state.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _pod_name(req: review.ReviewRequest) -> str:
    meta = req.object.get("metadata")
    if not isinstance(meta, dict):
        return "?"
    return str(meta.get("name") or meta.get("generateName") or "?")
