"""One way to open the database, one policy: the application (``launch()``) and
``dbos-agent migrate`` change the schema; ``Client``, the CLI and ``serve`` never do, and
a missing or older schema makes them refuse, naming the command to run."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

import dbos_agent as da
from dbos_agent._storage.sql_files import migrations
from dbos_agent.errors import SchemaNotMigratedError, SchemaVersionError
from dbos_agent.testing import fresh_database
from tests.helpers import cli, dbos_agent_rows, migrate, refused

NEWEST = migrations()[-1][0]


def _objects(url: str) -> tuple[int, int]:
    """How many schemas and relations the database holds: what opening must not change."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM pg_namespace), (SELECT count(*) FROM pg_class)"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _schema_version(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT max(version) FROM dbos_agent.schema_migrations").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def empty(dbos_agent_postgres_url: str) -> Iterator[str]:
    """A database without the dbos_agent schema."""
    with fresh_database(dbos_agent_postgres_url) as url:
        yield url


def test_a_client_refuses_an_empty_database_and_creates_nothing(empty: str) -> None:
    before = _objects(empty)
    with pytest.raises(SchemaNotMigratedError) as refusal:
        da.Client(empty)
    assert "has no dbos_agent schema" in str(refusal.value)
    assert f"`dbos-agent migrate --database-url {empty}`" in str(refusal.value)
    assert _objects(empty) == before


def test_the_command_named_masks_the_password(empty: str) -> None:
    """The test server trusts local connections: a password in the URL is accepted and
    ignored, so it can be checked that the message never shows it."""
    secret = "s3cret-pw"
    user, at, rest = empty.partition("@")
    assert at and ":" not in user.removeprefix("postgresql://"), "a URL without a password"
    with pytest.raises(SchemaNotMigratedError) as refusal:
        da.Client(f"{user}:{secret}@{rest}")
    message = str(refusal.value)
    assert secret not in message
    assert "dbos-agent migrate --database-url postgresql://" in message
    assert ":***@" in message and "in place of ***" in message


def test_a_client_migrates_when_told(empty: str) -> None:
    with da.Client(empty, migrate=True) as client:
        assert client.list_workflows() == []
    assert _schema_version(empty) == NEWEST


def test_an_older_schema_is_refused_and_left_as_it_was(empty: str) -> None:
    migrate(empty)
    with psycopg.connect(empty, autocommit=True) as conn:
        conn.execute("DELETE FROM dbos_agent.schema_migrations WHERE version = %s", (NEWEST,))
    rows = dbos_agent_rows(empty)
    with pytest.raises(SchemaNotMigratedError) as refusal:
        da.Client(empty)
    assert f"schema version {NEWEST - 1}, this dbos_agent needs {NEWEST}" in str(refusal.value)
    assert "dbos-agent migrate --database-url" in str(refusal.value)
    refused(cli(empty, "workflows", "list"), 1, f"run `dbos-agent migrate --database-url {empty}`")
    assert dbos_agent_rows(empty) == rows


def test_a_newer_schema_is_refused_by_everyone(empty: str) -> None:
    """Newer than this code: upgrade dbos_agent (migrating cannot help), as before."""
    migrate(empty)
    with psycopg.connect(empty, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dbos_agent.schema_migrations (version, name) VALUES (%s, 'future')",
            (NEWEST + 1,),
        )
    for migrating in (False, True):
        with pytest.raises(SchemaVersionError, match="upgrade dbos_agent") as refusal:
            da.Client(empty, migrate=migrating)
        assert not isinstance(refusal.value, SchemaNotMigratedError)
    with pytest.raises(SchemaVersionError, match="upgrade dbos_agent"):
        da.launch(empty, executor_id="newer")
    refused(cli(empty, "workflows", "list"), 1, "upgrade dbos_agent")


def test_cli_commands_refuse_an_empty_database_and_alter_nothing(empty: str) -> None:
    before = _objects(empty)
    for args in (["workflows", "list"], ["versions"], ["gc", "--older-than", "1d"]):
        refused(cli(empty, *args), 1, f"run `dbos-agent migrate --database-url {empty}`")
    assert _objects(empty) == before


def test_serve_refuses_an_empty_database_and_alters_nothing(empty: str) -> None:
    before = _objects(empty)
    result = cli(empty, "serve", "--port", "0", "--no-token")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.startswith("dbos-agent serve: error: "), result.stderr
    assert f"run `dbos-agent migrate --database-url {empty}`" in result.stderr
    assert _objects(empty) == before


def test_migrate_then_the_operators_may_open_it(empty: str) -> None:
    assert "migrated from version 0 to" in cli(empty, "migrate").stdout
    assert _schema_version(empty) == NEWEST
    with da.Client(empty) as client:
        assert client.list_workflows() == []


def test_launch_still_creates_and_migrates(empty: str) -> None:
    runtime = da.launch(empty, executor_id="opening", workers=2)
    try:
        assert _schema_version(empty) == NEWEST
    finally:
        runtime.shutdown(grace=5)
