"""Shared fixtures: every test talks to the throwaway Postgres of dbos_agent.testing."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent.testing import Inspector, RestartablePostgres
from tests.helpers import PER_TEST

# The suite starts hundreds of Python processes (apps, workers, the CLI): they write and
# share compiled bytecode (in the checkout's ignored __pycache__/) instead of compiling
# dbos_agent again in each one where the environment says not to write it (~0.1 s each).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules marked ``long`` first (stably): handed out last, one of them would keep
    a test process busy after the others finished."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(autouse=True)
def per_test_state() -> Iterator[None]:
    """Every state registered with ``tests.helpers.per_test`` empty when a test starts and
    when it ends (a failed test leaves none behind for the next)."""
    for state in PER_TEST:
        state.clear()
    yield
    for state in PER_TEST:
        state.clear()


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


@pytest.fixture
def restartable_url(dbos_agent_restartable_postgres: RestartablePostgres) -> Iterator[str]:
    """A fresh database on the test module's own server (which the test may crash, stop
    and restart), dropped after the test."""
    with dbos_agent_restartable_postgres.database() as url:
        yield url
