"""The HTTP routes: the four extender verbs (``verbs``), and the read-only ones (``public``):
explain, health, readiness and metrics.

Two routers because two listeners: anyone who can reach ``/bind`` can pin a pod to a node, so the verbs
listen on loopback for the kube-scheduler beside the extender (``app.py``, ``main.py``). Every JSON
body is decoded by ``strict_json``. bind's work runs in the thread pool with its deadline taken on
arrival; filter and prioritize run on the event loop while the cache's lock is free. A good JSON body
reaches these three past FastAPI's request handling (``HotVerbs``). Any unexpected exception in a verb
still becomes HTTP 200 with an ``Error`` or the verb's neutral answer: kube-scheduler cannot read a 5xx.
Why, and what it saves: scheduler_extender/README.md, section "Request handling".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler_extender.binder import BindError
from scheduler_extender.deadline import Deadline
from scheduler_extender.events import REASON_GRANTED
from scheduler_extender.explain import MalformedPod, explain_pod, explain_submission
from scheduler_extender.objects import PodRef
from scheduler_extender.verbs import offered
from scheduler_extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    host_priorities_json,
)
from tf_shell import strict_json
from tf_shell.access import Access
from tf_shell.kube.api import GatewayError

if TYPE_CHECKING:
    from scheduler_extender.app import Extender

log = logging.getLogger(__name__)


class _StrictJsonRequest(Request):
    async def json(self) -> Any:
        return strict_json.loads(await self.body())


class _StrictJsonRoute(APIRoute):
    """A route whose JSON body is decoded by ``strict_json`` instead of the standard ``json`` module."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJsonRequest(request.scope, request.receive))

        return strict


verbs = APIRouter(route_class=_StrictJsonRoute)
public = APIRouter(route_class=_StrictJsonRoute)

NOT_READY = "the GPU extender is starting: its cluster cache has not synced yet; the scheduler will retry"


def _json(result: ExtenderFilterResult) -> Response:
    """Serialised once by pydantic's core (thousands of node names: no second validation pass)."""
    return Response(result.model_dump_json(), media_type="application/json")


def _extender(request: Request) -> Extender:
    extender: Extender = request.app.state.extender
    return extender


async def _without_blocking(ext: Extender, work: Callable[[], Response]) -> Response:
    """Run ``work`` here, on the loop, if the cache's lock is free now; else in the thread pool."""
    lock = ext.cache.lock
    if lock.acquire(blocking=False):
        try:
            return work()
        finally:
            lock.release()
    return await run_in_threadpool(work)


@verbs.post("/filter", tags=["extender"], response_model=ExtenderFilterResult)
async def filter_(request: Request, args: ExtenderArgs) -> Response:
    """Which of the offered nodes can hold the pod's GPU request, with a reason for each that cannot."""
    return await _filtered(_extender(request), args)


def _filter(ext: Extender, args: ExtenderArgs) -> Response:
    with ext.metrics.latency.labels("filter").time():
        if not ext.ready:
            ext.metrics.errors.labels("filter", "not-ready").inc()
            return _json(ExtenderFilterResult(NodeNames=[], Error=NOT_READY))
        try:
            result = ext.verbs.filter(args)
        except Exception as exc:
            log.exception("filter failed")
            ext.metrics.errors.labels("filter", "internal").inc()
            error = f"GPU extender filter failed: {exc.__class__.__name__}: {exc}"
            return _json(ExtenderFilterResult(NodeNames=[], Error=error))
        if result.Error:
            ext.metrics.errors.labels("filter", "request").inc()
        return _json(result)


@verbs.post("/prioritize", tags=["extender"], response_model=list[HostPriority])
async def prioritize(request: Request, args: ExtenderArgs) -> Response:
    """A 0–10 score for every offered node (nodes that cannot hold the pod get 0)."""
    return await _prioritized(_extender(request), args)


def _prioritize(ext: Extender, args: ExtenderArgs) -> Response:
    with ext.metrics.latency.labels("prioritize").time():
        try:
            if not ext.ready:
                raise RuntimeError(NOT_READY)
            scores = ext.verbs.prioritize(args)
        except Exception:
            log.exception("prioritize failed")
            ext.metrics.errors.labels("prioritize", "internal").inc()
            scores = dict.fromkeys(offered(args).names, 0)
        return Response(host_priorities_json(scores), media_type="application/json")


class HotVerbs:
    """ASGI middleware: filter, prioritize and bind straight to their verb functions when the body is good."""

    def __init__(self, app: ASGIApp, extender: Extender, prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.extender = extender
        self.verbs: dict[str, tuple[type[BaseModel], Callable[[Extender, Any], Awaitable[Response]]]] = {}
        for prefix in prefixes:
            self.verbs[f"{prefix}/filter"] = (ExtenderArgs, _filtered)
            self.verbs[f"{prefix}/prioritize"] = (ExtenderArgs, _prioritized)
            self.verbs[f"{prefix}/bind"] = (ExtenderBindingArgs, _bound)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = self.verbs.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if verb is None or not _says_json(scope):
            await self.app(scope, receive, send)
            return
        model, answer = verb
        body, rest = await _read_body(receive)
        try:
            args = model.model_validate(strict_json.loads(body))
        except (ValueError, ValidationError):  # json.JSONDecodeError is a ValueError
            await self.app(scope, _replaying(body, rest), send)
            return
        response = await answer(self.extender, args)
        await response(scope, rest, send)


async def _filtered(ext: Extender, args: ExtenderArgs) -> Response:
    """filter's answer, for its route and for ``HotVerbs``: on the event loop while the cache's lock is free."""
    return await _without_blocking(ext, lambda: _filter(ext, args))


async def _prioritized(ext: Extender, args: ExtenderArgs) -> Response:
    """prioritize's answer, as filter's."""
    return await _without_blocking(ext, lambda: _prioritize(ext, args))


async def _bound(ext: Extender, args: ExtenderBindingArgs) -> Response:
    """bind's answer, for its route and for ``HotVerbs``: the deadline taken on arrival, the work in the thread pool."""
    result = await run_in_threadpool(_bind, ext, args, ext.binder.deadline())
    return Response(result.model_dump_json(), media_type="application/json")


def _says_json(scope: Scope) -> bool:
    """Whether the request's Content-Type is JSON, by FastAPI's rule (``application/json`` or ``…+json``;
    without one, FastAPI reads the body as bytes, which no verb takes)."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-type":
            text = bytes(value).decode("latin-1")
            maintype, _, subtype = text.partition(";")[0].strip().lower().partition("/")
            return maintype == "application" and (subtype == "json" or subtype.endswith("+json"))
    return False


async def _read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The whole request body, and what to receive from after it (a disconnect, while the reply is sent)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left: nothing more will come
            return b"".join(chunks), _replaying_message(message, receive)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), receive


def _replaying_message(first: Message, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return first

    return replay


def _replaying(body: bytes, rest: Receive) -> Receive:
    """``receive`` for the app: the body already read, in one message, then whatever comes after it."""
    return _replaying_message({"type": "http.request", "body": body, "more_body": False}, rest)


@verbs.post("/bind", tags=["extender"], response_model=ExtenderBindingResult)
async def bind(request: Request, args: ExtenderBindingArgs) -> Response:
    """Choose the pod's GPUs on the node, record them on the pod and create the Binding — or undo all of it."""
    return await _bound(_extender(request), args)


def _bind(ext: Extender, args: ExtenderBindingArgs, deadline: Deadline) -> ExtenderBindingResult:
    with ext.metrics.latency.labels("bind").time():
        if not ext.ready:
            ext.metrics.binds.labels("not-ready").inc()
            return ExtenderBindingResult(Error=NOT_READY)
        try:
            outcome = ext.binder.bind(args, deadline)
        except BindError as exc:
            ext.metrics.binds.labels(exc.stage).inc()
            ext.metrics.errors.labels("bind", exc.stage).inc()
            pod = f"{args.PodNamespace}/{args.PodName}"
            log.info("bind %s -> %s failed: %s", pod, args.Node, exc, extra={"pod": pod, "node": args.Node})
            return ExtenderBindingResult(Error=str(exc))
        except Exception as exc:
            log.exception("bind failed")
            ext.metrics.binds.labels("internal").inc()
            ext.metrics.errors.labels("bind", "internal").inc()
            return ExtenderBindingResult(Error=f"GPU extender bind failed: {exc.__class__.__name__}: {exc}")
        ext.metrics.gate_wait.observe(outcome.gate_wait)
        pod = f"{args.PodNamespace}/{args.PodName}"
        gpus = [g.uuid for g in outcome.allocation.gpus] if outcome.allocation is not None else []
        if outcome.allocation is not None:
            ref = PodRef(namespace=args.PodNamespace, name=args.PodName, uid=args.PodUID)
            ext.events.normal(ref, REASON_GRANTED, outcome.allocation.describe())
        log.info(
            "bound %s -> %s, GPUs %s",
            pod,
            args.Node,
            gpus or "none",
            extra={"pod": pod, "node": args.Node, "gpus": gpus},
        )
        ext.metrics.binds.labels("bound" if outcome.allocation is not None else "bound-without-gpu").inc()
        return ExtenderBindingResult(Error="")


@verbs.post("/preempt", tags=["extender"])
def preempt(request: Request, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
    """Per candidate node, the fewest lowest-QoS GPU pods to evict; nodes where none would do are left out."""
    ext = _extender(request)
    with ext.metrics.latency.labels("preempt").time():
        try:
            if not ext.ready:
                raise RuntimeError(NOT_READY)
            result: ExtenderPreemptionResult = ext.verbs.preempt(args)
            return result
        except Exception:
            log.exception("preempt failed")
            ext.metrics.errors.labels("preempt", "internal").inc()
            return ExtenderPreemptionResult()


def _refused(request: Request, access: Access) -> JSONResponse | None:
    """Explain names a pod's request and why it waits: off loopback, only for a caller the API server lets do
    ``access`` (tf_shell.access); the refusal otherwise, with the API server's status code."""
    gate = _extender(request).access
    peer = request.client.host if request.client else None
    refused = None if gate is None else gate.check(peer, request.headers.get("authorization"), access)
    return None if refused is None else JSONResponse({"detail": refused.message}, status_code=refused.code)


@public.get("/explain/{namespace}/{name}", tags=["explain"])
def explain(request: Request, namespace: str, name: str) -> JSONResponse:
    """Why is this pod pending (or where did it go): its request, per-node verdicts, summary, allocation. Off
    loopback, for a caller who may ``get`` that pod."""
    ext = _extender(request)
    refused = _refused(request, Access(verb="get", resource="pods", namespace=namespace, name=name))
    if refused is not None:
        return refused
    try:
        pod = ext.gateway.get_pod(namespace, name)
    except GatewayError as exc:
        return JSONResponse({"detail": f"could not read pod: {exc}"}, status_code=503)
    if pod is None:
        return JSONResponse({"detail": f"pod {namespace}/{name} not found"}, status_code=404)
    return JSONResponse(explain_pod(ext.verbs, ext.gate, pod))


@public.post("/explain", tags=["explain"])
def explain_spec(request: Request, pod: Annotated[dict[str, Any], Body()]) -> JSONResponse:
    """What would happen if this pod were submitted now: the webhook's verdict and each node's. Off loopback,
    for a caller who may ``create`` pods in its namespace.

    422 when the body is not shaped like a Pod (the detail names each bad field).
    """
    metadata = pod.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    where = namespace if isinstance(namespace, str) and namespace else "default"
    refused = _refused(request, Access(verb="create", resource="pods", namespace=where))
    if refused is not None:
        return refused
    try:
        return JSONResponse(explain_submission(_extender(request).verbs, pod))
    except MalformedPod as exc:
        return JSONResponse({"detail": f"not a Pod: {exc}"}, status_code=422)


@public.get("/healthz", tags=["ops"])
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@public.get("/readyz", tags=["ops"])
def readyz(request: Request) -> JSONResponse:
    ext = _extender(request)
    synced = {i.name: i.synced.is_set() for i in ext.informers}
    return JSONResponse({"ready": ext.ready, "synced": synced}, status_code=200 if ext.ready else 503)


@public.get("/metrics", tags=["ops"])
def metrics(request: Request) -> Response:
    return Response(generate_latest(_extender(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)
