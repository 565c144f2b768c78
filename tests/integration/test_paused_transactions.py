"""A process paused inside a transaction (SIGSTOP, a VM stall) must not hold its locks for
as long as it is paused: the server ends a pooled connection left idle in a transaction
(``IDLE_IN_TRANSACTION_S``), so whoever takes its workflows over is not blocked by it."""

from __future__ import annotations

import threading

import psycopg

from dbos_agent._storage.connector import IDLE_IN_TRANSACTION_S, Connector
from tests.helpers import direct_and_pooled


@direct_and_pooled
def test_pooled_connections_end_a_transaction_left_idle(database_url: str) -> None:
    """Directly, the setting holds for the connection's whole session; through a
    transaction pooler, for each transaction, which sets it for itself."""
    db = Connector(database_url, pool_size=2)
    db.open()
    try:
        shown = db.run(
            "read the setting",
            lambda conn: conn.execute("SHOW idle_in_transaction_session_timeout").fetchone(),
            transaction=True,
        )
        assert shown == {"idle_in_transaction_session_timeout": f"{IDLE_IN_TRANSACTION_S}s"}
    finally:
        db.close()


def test_a_paused_transaction_holding_a_row_lets_the_next_writer_in(
    dbos_agent_database_url: str,
) -> None:
    """A transaction that takes a row lock and then stops (the holder paused between two
    statements) is ended by the server; a second writer waiting for the row gets it."""
    db = Connector(dbos_agent_database_url, pool_size=2)
    db.open()
    locked, release = threading.Event(), threading.Event()
    with psycopg.connect(dbos_agent_database_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE IF NOT EXISTS paused_lock_probe (id int PRIMARY KEY)")
        admin.execute("TRUNCATE paused_lock_probe")

    failures: list[BaseException] = []

    def body(conn: psycopg.Connection[dict[str, object]]) -> None:
        conn.execute("INSERT INTO paused_lock_probe VALUES (1)")
        locked.set()
        release.wait(IDLE_IN_TRANSACTION_S * 4)  # "paused" while the server ends it

    def paused_holder() -> None:
        try:
            db.run("hold a row", body, transaction=True, single_attempt=True)
        except Exception as exc:  # its connection was ended under it: the commit fails
            failures.append(exc)

    holder = threading.Thread(target=paused_holder)
    holder.start()
    try:
        assert locked.wait(30)
        with psycopg.connect(dbos_agent_database_url, autocommit=True) as other:
            # waits for the row until the paused transaction is ended, then inserts it
            other.execute("SET statement_timeout = '120s'")
            other.execute("INSERT INTO paused_lock_probe VALUES (1)")
            assert other.execute("SELECT count(*) FROM paused_lock_probe").fetchone() == (1,)
    finally:
        release.set()
        holder.join(60)
        db.close()
    assert failures, "the paused transaction committed after its connection was ended"
