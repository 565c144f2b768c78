"""A Postgres server that tests may crash, stop, restart and cut connections of.

Durability claims are only as good as the faults they were tested under. This
wraps a throwaway local cluster (see ``LocalCluster``) with the faults an
operator meets: ``restart()`` (``pg_ctl restart -m immediate``, a crash and
recovery), ``down()`` (an outage of a chosen length) and ``terminate()``
(``pg_terminate_backend`` of chosen connections).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg

from ..postgres.opening import open_system_database
from ..postgres.throwaway import LocalCluster
from .databases import fresh_database

__all__ = ["RestartablePostgres"]


class RestartablePostgres:
    """A throwaway server of this test module alone, with fault injection."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    @property
    def url(self) -> str:
        """The server's ``postgres`` database (trust auth, no password)."""
        return self.cluster.url

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """A fresh database on this server for one test, dropped afterwards; its schema
        applied, as the application's ``launch()`` would (a ``Client``, which never
        migrates, may open it first)."""
        with fresh_database(self.url) as url:
            open_system_database(url, create=False, migrate=True, pool_size=1).close()
            yield url

    def restart(self, mode: str = "immediate") -> None:
        """Crash the server and start it again: every connection dies, nothing committed is lost."""
        self.cluster.restart(mode)

    @contextlib.contextmanager
    def down(self, mode: str = "immediate") -> Iterator[None]:
        """The server is stopped for the block (an outage), then started again."""
        self.cluster.stop_server(mode)
        try:
            yield
        finally:
            self.cluster.start_server()

    def terminate(self, database_url: str, application_name: str = "%") -> int:
        """``pg_terminate_backend`` the connections to ``database_url`` whose application
        name matches the LIKE pattern (not the caller's own); returns how many."""
        with psycopg.connect(database_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND application_name LIKE %s",
                (application_name,),
            ).fetchall()
        return sum(1 for (ok,) in rows if ok)
