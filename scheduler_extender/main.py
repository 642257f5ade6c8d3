"""``tf-extender``: run the scheduler extender (flags override ``TF_EXTENDER_*`` environment variables).

Every :class:`Settings` field is a flag, spelled with dashes (``--handoff-wait 5``); ``--help``
prints each with its description, its variable and its default (:mod:`tf_shell.settings_cli`). The
process builds the Kubernetes gateway from ``--kubeconfig`` (or in-cluster config), creates the apps
and serves them with uvicorn on one event loop: the verbs on ``--verbs-address``/``--verbs-port``
(loopback, for the kube-scheduler in the same pod: whoever reaches bind can place pods), the
read-only routes on ``--public-address``/``--public-port``.

    tf-extender --kubeconfig ~/.kube/config --verbs-port 8080 --public-port 8081 --url-prefix /extender
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Literal

import uvicorn
import uvloop
from fastapi import FastAPI

from scheduler_extender.app import create_app, public_app
from scheduler_extender.kube.gateway import KubernetesGateway
from scheduler_extender.settings import Settings
from tf_shell import settings_cli
from tf_shell.access import Gate
from tf_shell.catalog_file import CatalogFileError
from tf_shell.kube.client import api_client
from tf_shell.kube.reviews import KubeReviews, authorization_header
from tf_shell.logfmt import formatter
from tf_shell.serving import KEEP_ALIVE_S


def settings_from(argv: Sequence[str] | None = None) -> Settings:
    """Settings from the ``TF_EXTENDER_*`` environment, overridden by the flags given."""
    return settings_cli.settings_from(
        Settings,
        "tf-extender",
        "kube-scheduler HTTP extender for fractional GPUs (tensor-fusion.ai pod interface).",
        argv,
    )


def main(argv: Sequence[str] | None = None) -> None:
    settings = settings_from(argv)
    logging.basicConfig(level=settings.log_level.upper())
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter(settings.log_format))
    api = api_client(settings.kubeconfig)
    gateway = KubernetesGateway(api)
    access = Gate(KubeReviews(api), settings.access_review_ttl)
    try:
        app = create_app(settings, gateway, access=access, credentials=lambda: authorization_header(api))
    except CatalogFileError as exc:
        raise SystemExit(f"tf-extender: --gpu-catalog {exc}") from None
    uvloop.run(serve(listeners(settings, app)))


def listeners(settings: Settings, app: FastAPI) -> tuple[uvicorn.Server, uvicorn.Server]:
    """The verbs listener (``app``: every route, and its lifespan runs the extender) and the read-only one
    (``public_app`` of the same extender, no lifespan of its own)."""

    def server(asgi: FastAPI, host: str, port: int, lifespan: Literal["on", "off"]) -> uvicorn.Server:
        # httptools named so a missing one fails loudly instead of falling back to the pure-Python h11
        # parser, which is slower on the 30-60 KB verb bodies; the loop is uvloop (``main``).
        config = uvicorn.Config(
            asgi,
            host=host,
            port=port,
            lifespan=lifespan,
            log_level=settings.log_level,
            access_log=False,
            http="httptools",
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        return uvicorn.Server(config)

    public = public_app(app.state.extender)
    return (
        server(app, settings.verbs_address, settings.verbs_port, "on"),
        server(public, settings.public_address, settings.public_port, "off"),
    )


async def serve(servers: Sequence[uvicorn.Server]) -> None:
    """Run ``servers`` until one of them stops (a signal), then stop the others.

    Every port is bound before any server starts, so one that is taken stops the process at once
    (uvicorn logs the address and exits with status 3), not halfway through starting the extender.
    """
    sockets = [s.config.bind_socket() for s in servers]
    running = [asyncio.ensure_future(s.serve(sockets=[sock])) for s, sock in zip(servers, sockets, strict=True)]
    try:
        await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.wait(running)


if __name__ == "__main__":
    main()
