"""Through pgbouncer in transaction mode (issue 33): what a pooled connection sets for each
transaction, a session judged by its lease alone, the connections a process opens, and
every misuse of a pooled URL refused with a PoolerError naming the fix, never a raw
``prepared statement does not exist`` or a hang."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent._storage.connector import IDLE_IN_TRANSACTION_S, Connector
from dbos_agent.cli import main as cli
from dbos_agent.errors import PoolerError, WriteRefusedError
from dbos_agent.postgres.opening import open_system_database
from dbos_agent.postgres.pgbouncer import Pgbouncer
from dbos_agent.testing import fresh_database


def _shown(db: Connector, setting: str, *, transaction: bool) -> object:
    row = db.run(
        "read a setting",
        lambda conn: conn.execute("SELECT current_setting(%s) AS v", (setting,)).fetchone(),
        transaction=transaction,
    )
    return None if row is None else row["v"]


def test_a_pooled_transaction_sets_what_a_direct_session_has(pooled_database_url: str) -> None:
    """The idle-in-transaction bound, the test clock and read-only, each for the one
    transaction that needs it (a server connection of the pooler keeps none of it)."""
    db = Connector(pooled_database_url, pool_size=2)
    try:
        assert db.pooled
        shown = _shown(db, "idle_in_transaction_session_timeout", transaction=True)
        assert shown == f"{IDLE_IN_TRANSACTION_S}s"
        db.advance_clock(3600)
        moved = db.run(
            "read the clock",
            lambda conn: conn.execute(
                "SELECT extract(epoch FROM dbos_agent.now() - now()) AS s"
            ).fetchone(),
        )
        assert moved is not None and round(float(moved["s"])) == 3600
    finally:
        db.close()
    reader = Connector(pooled_database_url, pool_size=1, read_only=True)
    try:
        with pytest.raises(WriteRefusedError):
            reader.run("write", lambda conn: conn.execute("CREATE TABLE never_made (a int)"))
    finally:
        reader.close()


def test_an_undeclared_pooler_is_refused_naming_the_fix(
    pgbouncer: Pgbouncer, dbos_agent_database_url: str
) -> None:
    with pytest.raises(PoolerError, match=r"add \?pooler=transaction to it"):
        open_system_database(
            pgbouncer.url_for(dbos_agent_database_url), create=False, migrate=False
        )


def test_migrating_through_the_pooler_is_refused_naming_the_fix(
    pooled_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["--database-url", pooled_database_url, "migrate"]) == 1
    said = capsys.readouterr().err
    assert "migrations need a direct connection" in said
    assert "dbos-agent migrate --database-url DIRECT_URL" in said


def test_a_session_url_through_the_pooler_is_refused(
    pgbouncer: Pgbouncer, pooled_database_url: str, dbos_agent_database_url: str
) -> None:
    undeclared = pgbouncer.url_for(dbos_agent_database_url)
    with pytest.raises(PoolerError, match=r"the session URL .* goes through a connection pooler"):
        da.launch(pooled_database_url, session_url=undeclared, executor_id="refused")
    with pytest.raises(PoolerError, match="is a pooled URL"):
        da.launch(pooled_database_url, session_url=pooled_database_url, executor_id="refused")
    with pytest.raises(PoolerError, match="listen=True needs a direct connection"):
        da.launch(pooled_database_url, listen=True, executor_id="refused")


@pytest.fixture
def lenient_pgbouncer(dbos_agent_postgres_url: str) -> Iterator[Pgbouncer]:
    """A pgbouncer that ignores the startup option it would refuse (as some hosted
    poolers do): nothing tells it from a server until a prepared statement goes missing."""
    with Pgbouncer(
        dbos_agent_postgres_url,
        pool_size=2,
        settings={"ignore_startup_parameters": "options", "server_round_robin": "0"},
    ) as bouncer:
        yield bouncer


def test_a_prepared_statement_lost_behind_an_undeclared_pooler_is_refused_naming_the_fix(
    lenient_pgbouncer: Pgbouncer, dbos_agent_database_url: str
) -> None:
    """psycopg prepares a statement on its fifth run; the next run lands on another server
    connection (the one it used is held by another client's open transaction)."""
    url = lenient_pgbouncer.url_for(dbos_agent_database_url)
    db = Connector(url, pool_size=1)
    try:
        for _ in range(6):
            db.run("read", lambda conn: conn.execute("SELECT %s::int", (1,)).fetchone())
        with psycopg.connect(url, autocommit=True) as other, other.transaction():
            other.execute("SELECT 1")  # holds the server connection the statement is on
            with pytest.raises(PoolerError, match=r"add \?pooler=transaction") as refused:
                db.run("read", lambda conn: conn.execute("SELECT %s::int", (1,)).fetchone())
    finally:
        db.close()
    assert "a statement prepared on one server connection" in str(refused.value)


def test_a_session_behind_the_pooler_is_judged_by_its_lease_alone(
    pooled_database_url: str, dbos_agent_database_url: str
) -> None:
    """It holds no lock: others do not take its workflows over a grace after they see it
    without one, but once its lease has run out."""
    rt = da.launch(pooled_database_url, executor_id=f"lease-{uuid.uuid4().hex[:8]}", workers=2)
    try:
        engine = current_engine()
        assert engine.session.lease_only and engine.notifications.polls
        key = rt.session_key

        def dead_after(seconds: float) -> bool:
            with psycopg.connect(dbos_agent_database_url, autocommit=True) as conn:
                conn.execute(
                    "SELECT set_config('dbos_agent.clock_offset', %s, false)",
                    (f"{seconds} seconds",),
                )
                row = conn.execute(
                    "SELECT %s IN (SELECT dbos_agent.dead_sessions()), lease_only"
                    " FROM dbos_agent.executors WHERE session_key = %s",
                    (key, key),
                ).fetchone()
            assert row is not None and row[1] is True
            return bool(row[0])

        grace, lease = engine.options.session_grace, engine.options.lease_seconds
        assert not dead_after(grace * 3)
        assert dead_after(lease * 2)
    finally:
        rt.shutdown()


def _connections(url: str, database: str) -> dict[str, int]:
    """The server's connections to ``database``, by application name."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid() GROUP BY 1",
            (database,),
        ).fetchall()
    return {str(name): int(n) for name, n in rows}


@da.durable_workflow
def _busy(n: int) -> int:
    return sum(_one(i) for i in range(n))


@da.step
def _one(i: int) -> int:
    return i


@pytest.mark.parametrize("via", ["direct", "one-url", "session-url"])
def test_the_connections_a_process_opens(
    via: str, pgbouncer: Pgbouncer, dbos_agent_postgres_url: str
) -> None:
    """Directly: up to ``pool_size`` for statements, one for the session, one that
    LISTENs. Through the pooler: the server sees the pooler's (at most its pool), and with
    a session URL the session's and the listener's besides."""
    with fresh_database(dbos_agent_postgres_url) as url:
        open_system_database(url, create=False, migrate=True, pool_size=1).close()
        database = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        given = url if via == "direct" else pgbouncer.pooled_url(url)
        session_url = url if via == "session-url" else None
        rt = da.launch(given, session_url=session_url, executor_id=f"count-{via}", workers=4)
        try:
            handles = [da.start(_busy, 20) for _ in range(16)]
            assert [h.result(timeout=60) for h in handles] == [190] * 16
            seen = _connections(dbos_agent_postgres_url, str(database))
        finally:
            rt.shutdown()
    own = {"dbos_agent_session": 1, "dbos_agent_listener": 1}
    if via == "direct":
        assert {k: seen.get(k) for k in own} == own
        assert 1 <= seen.get("dbos_agent", 0) <= 4 + 4
    elif via == "session-url":
        assert {k: seen.get(k) for k in own} == own
    else:
        assert "dbos_agent_listener" not in seen
    if via != "direct":  # the pooler's pool (tests/conftest.py), and the direct ones
        assert sum(seen.values()) <= 20 + (2 if via == "session-url" else 0), seen
