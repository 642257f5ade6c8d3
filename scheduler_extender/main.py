"""``tf-extender``: run the scheduler extender (flags override ``TF_EXTENDER_*`` environment variables).

Every :class:`Settings` field is a flag, spelled with dashes (``--handoff-wait 5``); ``--help``
prints each with its description and default. The process builds the Kubernetes gateway from
``--kubeconfig`` (or in-cluster config), creates the app and serves it with uvicorn.

    tf-extender --kubeconfig ~/.kube/config --port 8080 --url-prefix /extender --policy binpack
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import Any

import uvicorn

from scheduler_extender.app import create_app
from scheduler_extender.kube.gateway import KubernetesGateway, api_client
from scheduler_extender.settings import Settings
from vgpu.catalog_file import CatalogFileError


def parser() -> argparse.ArgumentParser:
    """Flags generated from the Settings fields, so flags, env and docs cannot drift apart."""
    p = argparse.ArgumentParser(
        prog="tf-extender",
        description="kube-scheduler HTTP extender for fractional GPUs (tensor-fusion.ai pod interface). "
        "Each flag can also be set as TF_EXTENDER_<NAME> in the environment.",
    )
    for name, info in Settings.model_fields.items():
        p.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            default=None,
            help=f"{info.description} (default: {info.default!r})",
        )
    return p


def settings_from(argv: Sequence[str] | None = None) -> Settings:
    """Settings from the environment, overridden by the flags given."""
    given: dict[str, Any] = {k: v for k, v in vars(parser().parse_args(argv)).items() if v is not None}
    return Settings(**given)


def main(argv: Sequence[str] | None = None) -> None:
    settings = settings_from(argv)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    gateway = KubernetesGateway(api_client(settings.kubeconfig))
    try:
        app = create_app(settings, gateway)
    except CatalogFileError as exc:
        raise SystemExit(f"tf-extender: --gpu-catalog {exc}") from None
    # uvloop + httptools (hard dependencies), named so a missing one fails loudly instead of falling
    # back to asyncio + the pure-Python h11 parser, which is slower on the 30–60 KB verb bodies.
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


if __name__ == "__main__":
    main()
