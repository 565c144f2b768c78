"""The integration tier's fixtures: the web app on the session database, a client of its
API with the token, and a runtime with the test's own queues."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

import dbos_agent as da
from dbos_agent._engine.queues import isolated_queues
from tests.support.web import TOKEN, Server


@pytest.fixture
def server(runtime: da.Runtime, dbos_agent_database_url: str) -> Iterator[Server]:
    with Server(dbos_agent_database_url, TOKEN) as running:
        yield running


@pytest.fixture
def api(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    ) as client:
        yield client


@pytest.fixture
def queue_runtime(dbos_agent_database_url: str, executor_id: str) -> Iterator[da.Runtime]:
    """A launched runtime whose queues are the test's own (the ones it declares)."""
    with isolated_queues():
        rt = da.launch(dbos_agent_database_url, executor_id=executor_id, workers=8)
        yield rt
        rt.shutdown(grace=5)
