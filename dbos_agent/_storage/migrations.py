"""Applying the numbered migrations of ``dbos_agent/sql/migrations``, and reading the version."""

from __future__ import annotations

import logging
from typing import LiteralString

from ..errors import SchemaVersionError
from .connector import Connection, Connector
from .locks import MIGRATION_LOCK_KEY
from .sql_files import migrations, query

log = logging.getLogger(__name__)


def migrate(db: Connector) -> int:
    """Apply the numbered migrations in ``sql/migrations`` that are missing.

    Safe when several processes start at once: a transaction-scoped advisory
    lock serialises them, and the loser finds everything applied.
    Returns the schema version now in force.
    """
    known = migrations()
    newest_known = known[-1][0] if known else 0

    def body(conn: Connection) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS dbos_agent")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS dbos_agent.schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        rows = conn.execute("SELECT version FROM dbos_agent.schema_migrations").fetchall()
        applied = {row["version"] for row in rows}
        newest_applied = max(applied, default=0)
        if newest_applied > newest_known:
            raise SchemaVersionError(
                f"the database at {db.redacted_url} has dbos_agent schema version "
                f"{newest_applied}, newer than this library knows ({newest_known}); "
                f"upgrade dbos_agent"
            )
        for version, name, sql in known:
            if version in applied:
                continue
            log.info("applying dbos_agent migration %s", name)
            migration: LiteralString = sql
            conn.execute(migration)
            conn.execute(
                "INSERT INTO dbos_agent.schema_migrations (version, name) VALUES (%s, %s)",
                (version, name),
            )

    db.run("apply the dbos_agent schema", body, transaction=True)
    return newest_known


def schema_version(db: Connector) -> int:
    """The newest migration applied to this database (0 before the first ``migrate``)."""

    def body(conn: Connection) -> int:
        present = conn.execute(query("has_schema")).fetchone()
        if present is None or not present["present"]:
            return 0
        row = conn.execute(query("get_schema_version")).fetchone()
        return 0 if row is None else int(row["version"])

    return db.run("read the schema version", body)
