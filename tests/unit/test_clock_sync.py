"""The moved database clock reaches every pooled connection, even when another thread
moves it while a connection is being set."""

from __future__ import annotations

from typing import Any

from dbos_agent._storage.connector import Connector


class _Conn:
    """A connection whose ``set_config`` is overtaken by another thread moving the clock."""

    def __init__(self, db: Connector) -> None:
        self.db = db
        self.sent: list[str] = []

    def execute(self, sql: str, params: tuple[Any, ...]) -> None:
        self.sent.append(params[0])
        if len(self.sent) == 1:
            self.db.advance_clock(60)  # the race: the clock moves between set and note


def test_a_clock_moved_while_a_connection_is_set_is_set_again_on_its_next_use() -> None:
    db = Connector("postgresql://nobody@127.0.0.1:9/none")
    db.advance_clock(10)
    conn = _Conn(db)
    db.sync_clock(conn)  # type: ignore[arg-type]
    db.sync_clock(conn)  # type: ignore[arg-type]
    db.sync_clock(conn)  # type: ignore[arg-type]
    assert conn.sent == ["10.0 seconds", "70.0 seconds"]
