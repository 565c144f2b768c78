"""Shared fixtures: every test talks to the throwaway Postgres of dbos_agent.testing."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent.errors import PostgresNotFoundError
from dbos_agent.postgres.pgbouncer import Pgbouncer
from dbos_agent.testing import Inspector, RestartablePostgres
from tests.helpers import PER_TEST, REQUIRE_PGBOUNCER_ENV

# The suite starts hundreds of Python processes (apps, workers, the CLI): they write and
# share compiled bytecode (in the checkout's ignored __pycache__/) instead of compiling
# dbos_agent again in each one where the environment says not to write it (~0.1 s each).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# CPython 3.11 parses source to point carets at an expression in every traceback it
# formats, and its AST constructor's recursion counter is not safe across threads
# (python/cpython#106905): two threads parsing at once (a runtime thread formatting a
# traceback, pytest a failing test's source) can crash a test process with "AST
# constructor recursion depth mismatch", as one did, hiding the failure. The test
# processes (started after this) format tracebacks without carets.
os.environ.setdefault("PYTHONNODEBUGRANGES", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules marked ``long`` first (stably), then the tiers in ``testpaths`` order
    (pyproject.toml hands them out in this order: ``--no-loadscope-reorder``): handed out
    last, one of them would keep a test process busy after the others finished."""
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


@pytest.fixture(scope="session")
def pgbouncer(dbos_agent_postgres_url: str) -> Iterator[Pgbouncer]:
    """pgbouncer in transaction mode in front of the session's server: skipped where there
    is none, unless $DBOS_AGENT_REQUIRE_PGBOUNCER is set (.ci/run sets it)."""
    try:
        bouncer = Pgbouncer(dbos_agent_postgres_url, pool_size=20)
    except PostgresNotFoundError as exc:
        if os.environ.get(REQUIRE_PGBOUNCER_ENV):
            pytest.fail(f"{REQUIRE_PGBOUNCER_ENV} is set, but {exc}")
        pytest.skip(str(exc))
    with bouncer:
        yield bouncer


@pytest.fixture(scope="session")
def pooled_database_url(pgbouncer: Pgbouncer, dbos_agent_database_url: str) -> str:
    """The session database through pgbouncer, declared pooled (``?pooler=transaction``)."""
    return pgbouncer.pooled_url(dbos_agent_database_url)


@pytest.fixture
def database_url(request: pytest.FixtureRequest, dbos_agent_database_url: str) -> str:
    """The session database: directly, or through pgbouncer in transaction mode for a
    test parametrized with ``tests.helpers.direct_and_pooled``."""
    if getattr(request, "param", "direct") == "pooled":
        return str(request.getfixturevalue("pooled_database_url"))
    return dbos_agent_database_url


@pytest.fixture
def runtime(database_url: str, executor_id: str) -> Iterator[da.Runtime]:
    """A launched runtime on the session database (directly unless the test is
    parametrized with ``direct_and_pooled``), shut down after the test."""
    rt = da.launch(database_url, executor_id=executor_id, workers=8)
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
