"""schema.sql says what the migrations build: the same tables, columns, constraints,
indexes, functions, triggers and sequences, compared in the catalog."""

from __future__ import annotations

from typing import Any

import psycopg

from dbos_agent._storage.database import SystemDatabase
from dbos_agent._storage.sql_files import schema
from dbos_agent.testing import fresh_database

CATALOG: dict[str, str] = {
    "columns": """
        SELECT table_name, ordinal_position, column_name, data_type, is_nullable,
               column_default, is_identity
        FROM information_schema.columns WHERE table_schema = 'dbos_agent'
          AND table_name <> 'schema_migrations'
        ORDER BY table_name, ordinal_position""",
    "constraints": """
        SELECT t.relname, c.conname, pg_get_constraintdef(c.oid)
        FROM pg_constraint AS c JOIN pg_class AS t ON t.oid = c.conrelid
        JOIN pg_namespace AS n ON n.oid = t.relnamespace
        WHERE n.nspname = 'dbos_agent' AND t.relname <> 'schema_migrations'
        ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'dbos_agent' AND tablename <> 'schema_migrations' ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_functiondef(p.oid)
        FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
        WHERE n.nspname = 'dbos_agent' ORDER BY 1, 2""",  # 2: overloads come in any order
    "triggers": """
        SELECT tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
        JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = 'dbos_agent' AND NOT t.tgisinternal ORDER BY 1""",
    "sequences": """
        SELECT sequencename, data_type::text, min_value, max_value, increment_by, cycle
        FROM pg_sequences WHERE schemaname = 'dbos_agent' ORDER BY 1""",
}


def _catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: conn.execute(sql).fetchall() for name, sql in CATALOG.items()}


def test_schema_sql_is_what_the_migrations_build(dbos_agent_postgres_url: str) -> None:
    with (
        fresh_database(dbos_agent_postgres_url) as migrated,
        fresh_database(dbos_agent_postgres_url) as from_file,
    ):
        db = SystemDatabase(migrated, pool_size=1)
        try:
            db.migrate()
        finally:
            db.close()
        with psycopg.connect(from_file, autocommit=True) as conn:
            conn.execute(schema())
        built, written = _catalog(migrated), _catalog(from_file)
    for part in CATALOG:
        assert built[part] == written[part], f"schema.sql and the migrations differ in {part}"
    assert built["columns"] and built["functions"] and built["indexes"]
