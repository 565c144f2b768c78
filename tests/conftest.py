"""Shared fixtures: every test talks to the throwaway Postgres of dbos_agent.testing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import dbos_agent as da
from dbos_agent.engine.runtime.core import Engine
from dbos_agent.engine.runtime.engine import current_engine
from dbos_agent.testing import Inspector


@pytest.fixture
def executor_id() -> str:
    """A fresh executor id per test, so recovery only sees that test's workflows."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def runtime(dbos_agent_database_url: str, executor_id: str) -> Iterator[da.Runtime]:
    """A launched runtime on the session database, shut down after the test."""
    rt = da.launch(dbos_agent_database_url, executor_id=executor_id, workers=8)
    try:
        yield rt
    finally:
        rt.shutdown(grace=5)


@pytest.fixture
def engine(runtime: da.Runtime) -> Engine:
    """The engine behind ``runtime``, for white-box tests of the engine's own parts."""
    return current_engine()


@pytest.fixture
def inspector(dbos_agent_inspector: Inspector) -> Inspector:
    """What the session database holds, for assertions (see dbos_agent.testing)."""
    return dbos_agent_inspector
