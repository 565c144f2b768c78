"""The integration tier's fixtures: the web app on the session database, and a client of
its API with the token."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

import dbos_agent as da
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
