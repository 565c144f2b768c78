"""The happy path's grouped writes (``_storage/log_writes.py``), without a database: which
statement a batch goes out as, and what each writer is told, from the rows it wrote."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from dbos_agent._storage.log_writes import Item, LogWrites
from dbos_agent._storage.sql_files import positional_query


class _Cursor:
    def __init__(self, sent: list[str], rows: list[tuple[Any, ...]]) -> None:
        self._sent, self._rows = sent, rows

    def execute(self, sql: str, values: list[Any]) -> _Cursor:
        self._sent.append(sql)
        return self

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows


class _Connector:
    """What LogWrites needs of a connector: ``run`` a body on a connection."""

    def __init__(self, rows: list[tuple[Any, ...]] | None = None, fail: bool = False) -> None:
        self.rows = rows or []
        self.fail = fail
        self.sent: list[str] = []

    def run(self, what: str, body: Callable[[Any], Any], **kwargs: Any) -> Any:
        assert kwargs == {"single_attempt": True}  # a failed batch goes alone, never retried
        if self.fail:
            raise ConnectionError("the server went away")
        return body(self)


@pytest.fixture(autouse=True)
def _cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "dbos_agent._storage.log_writes.psycopg.RawCursor",
        lambda conn, row_factory: _Cursor(conn.sent, conn.rows),
    )


def _step(wid: str, seq: int) -> Item:
    return "step", {
        "owner_key": 1,
        "workflow_id": wid,
        "seq": seq,
        "name": "s",
        "status": "SUCCESS",
        "inputs": None,
        "output": "1",
        "error": None,
        "attempts": 1,
        "started_at": datetime.now(UTC),
    }


def _finish(wid: str) -> Item:
    return "finish", {
        "workflow_id": wid,
        "status": "SUCCESS",
        "output": "1",
        "error": None,
        "owner_key": 1,
    }


def _writes(db: _Connector) -> LogWrites:
    return LogWrites(db)  # type: ignore[arg-type]


def test_a_write_alone_goes_out_as_its_own_plain_statement() -> None:
    db = _Connector([("a", 0)])
    assert _writes(db).write([_step("a", 0)]) == [True]
    finished = _Connector([(False, "SUCCESS", "1", None)])  # finished before: not by us
    assert _writes(finished).write([_finish("a")]) == [False]
    assert db.sent == [positional_query("append_step")[0]]
    assert finished.sent == [positional_query("finish_workflow")[0]]


def test_steps_alone_are_append_steps_and_a_mixed_batch_is_write_checkpoints() -> None:
    steps = _Connector([("a", 0), ("b", 0)])
    assert _writes(steps).write([_step("a", 0), _step("b", 0), _step("c", 0)]) == [
        True,
        True,
        False,  # its guard refused, or its position was taken
    ]
    mixed = _Connector([("step", "a", 1), ("finish", "b", None)])
    assert _writes(mixed).write([_step("a", 1), _finish("b"), _finish("c")]) == [
        True,
        True,
        False,
    ]
    assert steps.sent == [positional_query("append_steps")[0]]
    assert mixed.sent == [positional_query("write_checkpoints")[0]]


def test_a_row_twice_in_a_batch_is_sent_once_and_only_the_first_writer_is_told_written() -> None:
    db = _Connector([("step", "a", 0), ("finish", "b", None)])
    items = [_step("a", 0), _finish("b"), _step("a", 0), _finish("b")]
    assert _writes(db).write(items) == [True, True, False, False]


def test_every_writer_of_a_failed_batch_writes_alone() -> None:
    writes = _writes(_Connector(fail=True))
    assert writes.append_step(_step("a", 0)[1]) is False
    assert writes.finish(_finish("a")[1]) is False
