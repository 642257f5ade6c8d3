"""The one way the project calls the Kubernetes API: an ApiClient, timeouts, errors, raw JSON, drained responses.

Every program's adapter (the extender's gateway, the webhook's reads, the device plugin's calls,
tf-metrics' and tfctl's reads) makes its calls through :func:`call`, so all of them share one rule:
responses are raw JSON (``_preload_content=False``), never the client's models; every failure becomes
the :mod:`tf_shell.kube.api` taxonomy with its HTTP status; a response whose body is not needed is
read to its end and released (or its connection never returns to the pool); urllib3's own retries
are off, because every caller retries in its own loop and a hidden retry multiplies a timeout.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

import orjson
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from tf_shell.kube.api import GatewayError, GatewayTimeout, GoneError, Listing, RawObject, WatchEvent

MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
# (connect, read) seconds for single calls; a watch reads for its own timeout plus this slack.
CALL_TIMEOUT: Final = (5.0, 15.0)
LIST_TIMEOUT: Final = (5.0, 120.0)  # a LIST of every pod in a big cluster takes a while to read
WATCH_SLACK: Final = 30.0
SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"  # the label tying an EndpointSlice to its Service
RAW: Final[dict[str, Any]] = {"_preload_content": False, "_request_timeout": CALL_TIMEOUT}
WATCHED: Final = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})  # the event types a watch delivers
SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Seconds between two runs of the client's credential refresh. Its loaders re-read the credential only once it
# has expired (in-cluster: the token file, every minute; kubeconfig: 5 minutes before expiry), but each run
# also sets the host again, which reads every proxy variable of the environment: about 80 us of every call.
CREDENTIAL_REFRESH_S: Final = 1.0
T = TypeVar("T")


def api_client(kubeconfig: str | None, pool_size: int = 32) -> client.ApiClient:
    """An ApiClient from the kubeconfig at that path, else in-cluster config, else ~/.kube/config."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = pool_size
    configuration.retries = 0
    throttle_credential_refresh(configuration)
    return client.ApiClient(configuration)


def throttle_credential_refresh(
    configuration: client.Configuration,
    seconds: float = CREDENTIAL_REFRESH_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Make ``configuration``'s credential refresh hook run at most once every ``seconds`` (the first call runs it).
    The client's loaders install a new hook each time theirs runs; it is kept as the one to run next."""
    refresh: Callable[[Any], None] | None = configuration.refresh_api_key_hook
    if refresh is None:
        return
    lock = threading.Lock()
    last: float | None = None

    def throttled(config: Any) -> None:
        nonlocal last, refresh
        now = clock()
        with lock:
            if last is not None and now - last < seconds:
                return
            last = now
            run = refresh
        if run is None:
            return
        run(config)
        renewed = config.refresh_api_key_hook
        if renewed is not throttled:
            with lock:
                refresh = renewed
            config.refresh_api_key_hook = throttled

    configuration.refresh_api_key_hook = throttled  # type: ignore[assignment]  # the stubs type the hook as None


def own_namespace(path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The pod's namespace, from its service account; 'default' outside a pod."""
    try:
        return path.read_text().strip() or "default"
    except OSError:
        return "default"


def call(what: str, fn: Callable[[], T], timeout: float | tuple[float, float] = CALL_TIMEOUT) -> T:
    """``fn()``, its failure as :class:`GatewayError` (410: :class:`GoneError`; no answer within ``timeout``:
    :class:`GatewayTimeout`) naming ``what`` and the HTTP status."""
    try:
        return fn()
    except ApiException as exc:
        if exc.status == 410:
            raise GoneError(f"{what}: {exc.reason}") from None
        raise GatewayError(f"{what}: HTTP {exc.status} {exc.reason}: {_message(exc)}", exc.status) from None
    except (HTTPError, OSError) as exc:
        cause = exc.reason if isinstance(exc, MaxRetryError) else exc
        # urllib3 makes a refused connection a kind of connect timeout; it is not one: nothing was sent.
        if isinstance(cause, Urllib3Timeout | TimeoutError) and not isinstance(cause, NewConnectionError):
            raise GatewayTimeout(
                f"{what}: the API server did not answer within {_seconds(timeout)} (stalled?)"
            ) from None
        raise GatewayError(f"{what}: {exc.__class__.__name__}: {exc}") from None


def _seconds(timeout: float | tuple[float, float]) -> str:
    if isinstance(timeout, tuple):
        return f"{timeout[0]:g}s to connect and {timeout[1]:g}s to read"
    return f"{timeout:.1f}s"


def drained(response: Any) -> None:
    """Read the rest of a response whose body is not needed and give its connection back to the pool."""
    try:
        response.drain_conn()
    finally:
        response.release_conn()


def _message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return str(exc.body or "")[:200]
    return str(body.get("message") or "") if isinstance(body, dict) else ""


def send(
    api: client.ApiClient, method: str, path: str, body: RawObject, what: str, timeout: float | tuple[float, float]
) -> RawObject:
    """``method`` ``path`` with ``body`` sent as written; the answer's body, or :func:`call`'s errors.

    The client's typed methods parse a dict body into their model (pydantic) and serialise that: MicroTimes come
    back through ``datetime.isoformat``, which drops the fraction of a whole second (``…:54+00:00``, refused by
    the API server), and the round trip costs more CPU than the request. Writes on a hot path, or with a
    MicroTime (Leases), go this way: encoded once (orjson) and sent on the client's own connection pool, with its
    TLS, proxy and retry settings and its credential, past the layers that would walk the body again."""
    config = api.configuration
    headers = {**api.default_headers, "Content-Type": "application/json", "Accept": "application/json"}
    for auth in config.auth_settings().values():  # the bearer token; a client certificate is in the pool's TLS
        if auth["in"] == "header" and auth["value"]:
            headers[auth["key"]] = auth["value"]
    data = orjson.dumps(body)
    url = config.host + path
    limit = (
        urllib3.Timeout(connect=timeout[0], read=timeout[1])
        if isinstance(timeout, tuple)
        else urllib3.Timeout(total=timeout)
    )

    def once() -> RawObject:
        response = api.rest_client.pool_manager.request(method, url, body=data, headers=headers, timeout=limit)
        if not 200 <= int(response.status) < 300:
            raise ApiException(
                status=response.status, reason=response.reason, body=response.data.decode(errors="replace")
            )
        return json_body(response)

    return call(what, once, timeout)


def json_body(response: Any) -> RawObject:
    data = json.loads(response.data)
    if not isinstance(data, dict):
        raise GatewayError(f"unexpected response: {str(data)[:100]}")
    return data


def absent_is_none(what: str, read: Callable[[], Any]) -> RawObject | None:
    try:
        return call(what, lambda: json_body(read()))
    except GatewayError as exc:
        if exc.status == 404:
            return None
        raise


def items(what: str, lister: Callable[[], Any]) -> list[RawObject]:
    body = call(what, lambda: json_body(lister()), LIST_TIMEOUT)
    return [i for i in body.get("items") or [] if isinstance(i, dict)]


def upsert(
    what: str,
    body: RawObject,
    *,
    create: Callable[[RawObject], Any],
    read: Callable[[str], Any],
    replace: Callable[[str, RawObject], Any],
) -> None:
    """Create ``body``; when one of its name exists, replace it at the resourceVersion just read (a 409 from
    a concurrent writer surfaces: the caller's next pass retries)."""
    try:
        call(f"create {what}", lambda: drained(create(body)))
        return
    except GatewayError as exc:
        if exc.status != 409:
            raise
    name = str(body["metadata"]["name"])
    current = call(f"get {what}", lambda: json_body(read(name)))
    replaced = {**body, "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
    call(f"replace {what}", lambda: drained(replace(name, replaced)))


def listing(what: str, lister: Callable[..., Any], timeout: float | tuple[float, float] = LIST_TIMEOUT) -> Listing:
    """A LIST by ``lister`` (a client's list method, its options bound): the items and the list's resourceVersion."""
    body = call(what, lambda: json_body(lister(_preload_content=False, _request_timeout=timeout)), timeout)
    rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
    return Listing(items=[i for i in body.get("items") or [] if isinstance(i, dict)], resource_version=rv)


def watching(
    what: str, lister: Callable[..., Any], resource_version: str, timeout_seconds: int
) -> Iterator[WatchEvent]:
    """A watch by ``lister`` (a client's list method, its options bound) from ``resource_version``, bookmarks
    asked for; the server ends it after ``timeout_seconds`` (read for as long, and WATCH_SLACK more)."""
    limit = (CALL_TIMEOUT[0], timeout_seconds + WATCH_SLACK)
    response = call(
        what,
        lambda: lister(
            watch=True,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=limit,
        ),
        limit,
    )
    for type_, obj in watch_events(response, what):
        if type_ in WATCHED:
            yield WatchEvent(type_, obj)  # type: ignore[arg-type]  # narrowed by the test above


def watch_events(response: Any, what: str) -> Iterator[tuple[str, RawObject]]:
    """The (type, object) events of a watch response, line by line; ``ERROR`` events raise (:class:`GoneError`
    on 410), transport failures become :class:`GatewayError`, and the connection is released at the end."""
    try:
        for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
            event = json.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise GoneError(str(obj.get("message") or "resourceVersion too old"))
                raise GatewayError(f"{what}: {obj.get('message')}", obj.get("code"))
            yield str(kind), obj
    except (HTTPError, OSError, ValueError) as exc:
        raise GatewayError(f"{what}: {exc.__class__.__name__}: {exc}") from None
    finally:
        response.release_conn()
