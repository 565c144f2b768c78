"""Fresh, isolated databases on a test server: one per test, or per session."""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Iterator

import psycopg
from psycopg import sql

from .._storage.dsn import redact_url, scrub, with_dbname

__all__ = ["fresh_database"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    """Create an empty database on `server_url`, yield its URL, drop it afterwards.

    Each database is isolated from the others, so tests can use one each without cleanup.
    """
    name = f"dbos_agent_test_{secrets.token_hex(6)}"
    ident = sql.Identifier(name)
    with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    try:
        yield with_dbname(server_url, name)
    finally:
        try:
            with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        except psycopg.Error as exc:
            logger.warning(
                "could not drop test database %s on %s: %s",
                name,
                redact_url(server_url),
                scrub(str(exc), server_url),
            )


@contextlib.contextmanager
def scratch_database(server_url: str | None) -> Iterator[str]:
    """A fresh database on ``server_url``'s server, or, without one, on a throwaway local
    cluster started for it (and stopped after): what a script measuring the library wants
    when it may or may not be given a server."""
    if server_url is not None:
        with fresh_database(server_url) as url:
            yield url
        return
    from ..postgres.throwaway import LocalCluster

    cluster = LocalCluster.start()
    try:
        with fresh_database(cluster.url) as url:
            yield url
    finally:
        cluster.stop()
