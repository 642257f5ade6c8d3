"""The extender's FastAPI apps: ``create_app(settings, gateway)`` wires cache, informers, binder and
routes into the app kube-scheduler calls; ``public_app(extender)`` serves the same extender's
read-only routes alone.

Two apps because they listen in different places (``main.py``): the verbs app, on loopback by
default, serves every route; the public one, reachable from the cluster for probes, Prometheus and
``tfctl explain``, has no verb at all (a POST to ``/bind`` there is a 404/405).
No module globals: everything an app needs is built here and lives on ``app.state.extender``; the
verbs app's lifespan starts the informer threads and the event worker and stops them. The scheduler
must get HTTP 200 from every verb (any other status is a scheduling error with a useless message), so
a body that fails validation is answered 200 with the problem in ``Error`` (filter, bind) or with the
verb's neutral answer (prioritize: no scores; preempt: no victims); elsewhere it is a 422 naming it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import vgpu.scheduling.fragmentation  # noqa: F401  (registers the fragmentation policy)
from scheduler_extender import feeds, routes
from scheduler_extender.arbiter import Arbiter
from scheduler_extender.autoscaler.controller import (
    AutoscalerController,
    Report,
    autoscaler_off,
    dated,
    with_autoscaling,
)
from scheduler_extender.binder import CLOCK_SLACK, Binder
from scheduler_extender.cache import ClusterCache
from scheduler_extender.claim_board import ClaimBoard
from scheduler_extender.events import EventRecorder
from scheduler_extender.gateway import Kind, KubeGateway
from scheduler_extender.handoff import HandoffGate
from scheduler_extender.leader import LeaseElector, default_identity
from scheduler_extender.metrics import Metrics
from scheduler_extender.objects import as_version
from scheduler_extender.pool_status import pool_statuses
from scheduler_extender.preemptor import Preemptor
from scheduler_extender.refresh import Refresher
from scheduler_extender.settings import Settings
from scheduler_extender.shown import ShownPods
from scheduler_extender.status import ObjectRef, StatusKind, StatusWriter
from scheduler_extender.sweeper import reservation_sweeper
from scheduler_extender.verbs import Verbs
from scheduler_extender.workload_status import workload_statuses
from tf_shell.access import Gate
from tf_shell.catalog_file import load as load_catalog
from tf_shell.kube.client import own_namespace
from tf_shell.kube.list_watch import Informer
from tf_shell.periodic import Periodic
from tf_shell.usage_feed import HttpFetcher, UsageFeed, targets
from vgpu.catalog import Catalog
from vgpu.metric_names import AUTOSCALER
from vgpu.names import PLURAL_GPU_POOL, PLURAL_WORKLOAD
from vgpu.scheduling.policy import Policies

log = logging.getLogger(__name__)

# Seconds a pod the filter failed everywhere waits before the extender's own preemption looks at it: by
# then kube-scheduler's PostFilter of the same cycle has asked the preempt verb if its dry run found victims.
PREEMPTION_SETTLE = 1.0

# What a verb answers when its body could not even be parsed.
_NEUTRAL: dict[str, object] = {
    "filter": {"Nodes": None, "NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}},
    "bind": {},
    "prioritize": [],
    "preempt": {"NodeNameToMetaVictims": {}},
}


@dataclass
class Extender:
    """Everything one app owns."""

    settings: Settings
    gateway: KubeGateway
    cache: ClusterCache
    gate: HandoffGate
    access: Gate | None  # who may read explain off loopback (tf_shell.access); None: anyone (tests)
    verbs: Verbs
    binder: Binder
    events: EventRecorder
    metrics: Metrics
    informers: tuple[Informer, ...]
    status_writer: StatusWriter
    sweeper: Periodic
    preemptor: Preemptor
    elector: LeaseElector
    autoscaler: AutoscalerController
    autoscaler_loop: Periodic | None
    stop: threading.Event = field(default_factory=threading.Event)
    refresher: Refresher = field(default_factory=Refresher)  # learning policies' refresh, off the request path

    @property
    def ready(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    def start(self) -> None:
        self.stop.clear()
        self.events.start()
        for informer in self.informers:
            informer.start()
        self.elector.start()
        self.status_writer.start()
        self.sweeper.start()
        self.preemptor.worker.start()
        self.refresher.worker.start()
        if self.autoscaler_loop is not None:
            self.autoscaler_loop.start()

    def shutdown(self) -> None:
        self.stop.set()
        if self.autoscaler_loop is not None:
            self.autoscaler_loop.stop()
        self.refresher.worker.stop()
        self.preemptor.worker.stop()
        self.sweeper.stop()
        self.status_writer.stop()
        self.elector.stop()
        self.events.stop()


PLUGIN_FETCH_TIMEOUT: Final = 2.0  # seconds one device plugin has to answer GET /usage (as tf-metrics)
PLUGIN_FETCH_WORKERS: Final = 16


def build(
    settings: Settings,
    gateway: KubeGateway,
    *,
    clock: Callable[[], float] = time.time,
    catalog: Catalog | None = None,
    access: Gate | None = None,
    credentials: Callable[[], str | None] = lambda: None,
) -> Extender:
    """Wire one extender (without starting threads)."""
    catalog = catalog or load_catalog(Path(settings.gpu_catalog) if settings.gpu_catalog else None)
    gate = HandoffGate(ttl=settings.handoff_ttl, deletion_grace=settings.handoff_deletion_grace, clock=clock)
    cache = ClusterCache(default_pool=settings.default_pool, gate=gate, clock=clock)
    refresher = Refresher(cluster=cache.nodes)
    policies = Policies(settings.policy.value, on_create=refresher.track)
    metrics = Metrics(cache, gate)
    events = EventRecorder(
        gateway, interval=settings.event_interval, on_error=metrics.errors.labels("event", "api").inc
    )
    preemptor = Preemptor(
        gateway,
        cache,
        catalog,
        policies,
        events,
        settle=PREEMPTION_SETTLE,
        hold=settings.preemption_hold,
        on_result=lambda result: metrics.preemptions.labels(result).inc(),
    )
    shown = ShownPods()
    verbs = Verbs(
        cache,
        catalog,
        policies,
        events,
        shown,
        decide_in_filter=settings.decide_in_filter,
        reservation_ttl=settings.reservation_ttl,
        on_unschedulable=lambda reason: metrics.unschedulable.labels(reason).inc(),
        on_passed=lambda passed: metrics.filter_passes.labels(passed).inc(),
        on_stuck=preemptor.consider if settings.preemption_hold > 0 else lambda *_: None,
        on_preempting=preemptor.scheduler_preempts,
    )
    stop = threading.Event()

    def on_error(kind: Kind, reason: str) -> None:
        metrics.errors.labels(f"watch-{kind.lower()}", reason).inc()

    informers = tuple(
        feeds.informer(
            gateway,
            kind,
            cache,
            watch_timeout=settings.watch_timeout,
            backoff_max=settings.backoff_max,
            stop=stop,
            on_error=on_error,
        )
        for kind in (Kind.NODE, Kind.POD)
    )
    namespace = settings.lease_namespace or own_namespace()
    identity = settings.identity or default_identity()
    arbiter = Arbiter(
        ClaimBoard(gateway, namespace, identity, clock=clock),
        cache,
        gateway,
        lambda: max(as_version(informers[1].resource_version), cache.seen_version()),
        stale_after=settings.bind_timeout + CLOCK_SLACK,
        clock=clock,
        count=lambda result: metrics.claims.labels(result).inc(),
    )
    binder = Binder(
        gateway,
        cache,
        gate,
        catalog,
        policies,
        shown,
        arbiter,
        handoff_wait=settings.handoff_wait,
        bind_timeout=settings.bind_timeout,
        clock=clock,
    )
    elector = LeaseElector(
        gateway,
        namespace,
        settings.lease_name,
        identity,
        clock=clock,
        on_error=metrics.errors.labels("leader-election", "api").inc,
    )
    synced = lambda: all(i.synced.is_set() for i in informers)  # noqa: E731
    feed = UsageFeed(
        lambda: targets(gateway.list_endpoint_slices(namespace, settings.plugin_service), settings.plugin_port_name),
        HttpFetcher(PLUGIN_FETCH_TIMEOUT, credentials),
        PLUGIN_FETCH_WORKERS,
        metrics.registry,
        dated,
        prefix=AUTOSCALER,
    )
    autoscaler = AutoscalerController(
        gateway,
        cache,
        events,
        feed,
        arbiter,
        namespace=namespace,
        max_replicas=settings.autoscaler_max_replicas,
        checkpoint_interval=settings.autoscaler_checkpoint_interval,
        clock=clock,
        leading=elector.is_leader,
        ready=synced,
        registry=metrics.registry,
    )
    running = settings.autoscaler_interval > 0

    def report() -> Callable[[ObjectRef], Report | None]:  # once per status pass
        return autoscaler.report if running else autoscaler_off(cache, settings.autoscaler_max_replicas)

    status_writer = StatusWriter(
        gateway,
        (
            StatusKind(
                PLURAL_WORKLOAD, True, lambda: with_autoscaling(workload_statuses(*cache.workload_pods()), report())
            ),
            StatusKind(PLURAL_GPU_POOL, False, lambda: pool_statuses(cache.nodes(), cache.records())),
        ),
        interval=settings.workload_status_interval,
        clock=clock,
        ready=synced,
        leading=elector.is_leader,
        on_error=metrics.errors.labels("status", "api").inc,
    )
    sweeper = reservation_sweeper(cache)
    return Extender(
        settings,
        gateway,
        cache,
        gate,
        access,
        verbs,
        binder,
        events,
        metrics,
        informers,
        status_writer,
        sweeper,
        preemptor,
        elector,
        autoscaler,
        Periodic("autoscaler", settings.autoscaler_interval, autoscaler.tick) if running else None,
        stop,
        refresher,
    )


def create_app(
    settings: Settings,
    gateway: KubeGateway,
    *,
    clock: Callable[[], float] = time.time,
    access: Gate | None = None,
    credentials: Callable[[], str | None] = lambda: None,
) -> FastAPI:
    """The verbs' ASGI app, with every route. The informers start with its lifespan (``with TestClient(app)``
    in tests). ``access`` judges explain's callers off loopback; ``credentials()`` is the ``Authorization`` header
    shown to the device plugins' ``/usage`` (both None in tests)."""
    extender = build(settings, gateway, clock=clock, access=access, credentials=credentials)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        extender.start()
        try:
            yield
        finally:
            extender.shutdown()

    app = FastAPI(
        title="tensor-fusion scheduler extender",
        summary="kube-scheduler HTTP extender for fractional GPUs (filter, prioritize, bind, preempt)",
        version="1",
        lifespan=lifespan,
    )
    app.state.extender = extender
    app.include_router(routes.verbs)
    app.include_router(routes.public)
    if settings.url_prefix:
        app.include_router(routes.verbs, prefix=settings.url_prefix, include_in_schema=False)
    _answer_bad_bodies(
        app, extender, {f"/{v}": v for v in _NEUTRAL} | {f"{settings.url_prefix}/{v}": v for v in _NEUTRAL}
    )
    app.add_middleware(routes.HotVerbs, extender=extender, prefixes=tuple(dict.fromkeys(("", settings.url_prefix))))
    return app


def public_app(extender: Extender) -> FastAPI:
    """The read-only routes of ``extender`` (explain, health, readiness, metrics) and nothing else.

    It owns no lifespan: the verbs app's starts and stops the extender they share.
    """
    app = FastAPI(
        title="tensor-fusion scheduler extender (read-only)",
        summary="explain, health, readiness and metrics of the GPU extender; the verbs are served on loopback only",
        version="1",
    )
    app.state.extender = extender
    app.include_router(routes.public)
    _answer_bad_bodies(app, extender, {})
    return app


def _answer_bad_bodies(app: FastAPI, extender: Extender, verbs: dict[str, str]) -> None:
    """A body that is not what a route takes: the verb's neutral 200 for ``verbs`` (path -> verb), else 422."""

    def neutral(verb: str, problem: str) -> Response:
        extender.metrics.errors.labels(verb, "invalid-body").inc()
        body = _NEUTRAL[verb]
        if isinstance(body, dict) and verb in ("filter", "bind"):
            body = {**body, "Error": f"invalid {verb} request: {problem}"}
        return JSONResponse(body, status_code=200)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> Response:
        verb = verbs.get(request.url.path)
        if verb is None:
            return JSONResponse({"detail": _describe(exc)}, status_code=422)
        return neutral(verb, _describe(exc))

    @app.exception_handler(StarletteHTTPException)
    async def unreadable_body(request: Request, exc: StarletteHTTPException) -> Response:
        verb = verbs.get(request.url.path)
        if verb is None or request.method != "POST":
            return await http_exception_handler(request, exc)
        return neutral(verb, str(exc.detail))


def _describe(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        if error.get("type") == "json_invalid":  # strict_json's message says what and where
            parts.append(str(error.get("ctx", {}).get("error", "the body is not valid JSON")))
            continue
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid body"
