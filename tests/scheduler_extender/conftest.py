"""Fixtures for the extender shell: a fake API server and a running app (informers synced) on top of it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler_extender.app import Extender, create_app
from scheduler_extender.gateway import Kind
from scheduler_extender.settings import Settings
from tests.scheduler_extender.fakes import FakeGateway
from tests.vgpu.scheduling.conftest import checks  # noqa: F401  (the fixture: the core's fit checks, counted)
from tf_shell.access import Gate


def wait_for(condition: Callable[[], object], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class Running:
    """A started app over a fake API server."""

    def __init__(self, client: TestClient, fake: FakeGateway) -> None:
        self.client = client
        self.fake = fake

    @property
    def ext(self) -> Extender:
        extender: Extender = self.client.app.state.extender  # type: ignore[attr-defined]
        return extender

    def post(self, path: str, body: Any) -> Any:
        response = self.client.post(path, json=body)
        assert response.status_code == 200, response.text
        return response.json()

    def settle(self) -> None:
        """Wait until the cache has applied every change made to the fake so far."""
        with self.fake._cond:
            latest = {k: max((rv for rv, kk, _ in self.fake.log if kk is k), default=0) for k in Kind}
        wait_for(
            lambda: all(int(i.resource_version or 0) >= latest[Kind(i.name)] for i in self.ext.informers),
            what="cache to catch up",
        )


@pytest.fixture
def fake() -> FakeGateway:
    return FakeGateway()


@pytest.fixture
def run(fake: FakeGateway) -> Iterator[Callable[..., Running]]:
    clients: list[TestClient] = []

    def start(access: Gate | None = None, **settings: Any) -> Running:
        app = create_app(Settings(**{"handoff_wait": 1.0, **settings}), fake, access=access)
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        running = Running(client, fake)
        wait_for(lambda: running.ext.ready, what="informers to sync")
        return running

    yield start
    fake.close()
    for client in clients:
        client.__exit__(None, None, None)
