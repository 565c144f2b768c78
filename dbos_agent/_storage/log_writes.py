"""The happy path's writes, grouped: a new workflow, an idempotent step's checkpoint and
a workflow's outcome, handed in together by different threads, share one statement and
one commit.

Every workflow makes these writes, and each is a single guarded row: under load, a
start or an outcome that waited for a commit of its own paid one more commit per
workflow than it needs to. A write the batch did not make (the guard refused, the id or
position was taken, the batch failed as a whole) answers False: its store then writes
it alone, with the statement that explains and adopts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal, LiteralString

import psycopg
from psycopg.rows import tuple_row

from .connector import Connector
from .group_commit import GroupCommit
from .sql_files import positional_query

Kind = Literal["start", "step", "finish"]
Item = tuple[Kind, dict[str, Any]]

#: The statement of each kind of write when it is the only one of its batch.
_ALONE: dict[Kind, str] = {
    "start": "insert_workflow",
    "step": "append_step",
    "finish": "finish_workflow",
}


def _key(item: Item) -> tuple[str, str, int | None]:
    kind, params = item
    return kind, params["workflow_id"], params["seq"] if kind == "step" else None


class LogWrites:
    """New workflows and outcomes (``workflows`` rows) and steps (``steps`` rows),
    written in batches (see ``write_checkpoints``)."""

    def __init__(self, db: Connector) -> None:
        self._db = db
        self._batches: GroupCommit[Item, bool] = GroupCommit(self.write)

    def start(self, params: dict[str, Any]) -> bool:
        """Insert a new workflow (``insert_workflow``'s parameters, no ``dedup_id``)
        unless its id is taken; whether it was inserted."""
        return self._batches.submit(("start", params)) is True

    def append_step(self, params: dict[str, Any]) -> bool:
        """Write an idempotent step's row (``append_step``'s parameters) if its workflow
        is PENDING and the caller's and its position is free; whether it was written."""
        return self._batches.submit(("step", params)) is True

    def finish(self, params: dict[str, Any]) -> bool:
        """Record a PENDING workflow's outcome (``finish_workflow``'s parameters) if the
        caller's session owns it; whether it was recorded."""
        return self._batches.submit(("finish", params)) is True

    def write(self, items: Sequence[Item]) -> list[bool]:
        """One guarded statement for the batch; whether each item was written. Of two
        writes of one row in a batch (never on the engine's path: a workflow runs once
        at a time) only the first is sent; the other answers False."""
        if len(items) == 1:  # every write of a workflow running alone: no bookkeeping
            return [self._alone(items[0])]
        keys = [_key(item) for item in items]
        first: dict[tuple[str, str, int | None], int] = {}
        sent = [item for i, item in enumerate(items) if first.setdefault(keys[i], i) == i]
        written = {(kind, wid, seq) for kind, wid, seq in self._together(sent)}
        return [k in written and first[k] == i for i, k in enumerate(keys)]

    def _alone(self, item: Item) -> bool:
        """A write alone, as its own plain statement (cheaper to plan and run): whether a
        row came back (an outcome's row says whether it was recorded)."""
        kind, params = item
        sql, names = positional_query(_ALONE[kind])
        rows = self._run(1, sql, [params[n] for n in names])
        return bool(rows) and (kind != "finish" or rows[0][0] is True)

    def _together(self, items: list[Item]) -> list[tuple[str, str, int | None]]:
        """Several writes as one statement (steps alone: ``append_steps``; else
        ``write_checkpoints``); the keys of those written."""
        if all(kind == "step" for kind, _ in items):
            rows = self._run(
                len(items), positional_query("append_steps")[0], [self._document(items)]
            )
            return [("step", wid, seq) for wid, seq in rows]
        return self._run(
            len(items), positional_query("write_checkpoints")[0], [self._document(items)]
        )

    def _run(self, count: int, sql: LiteralString, values: list[Any]) -> list[Any]:
        """The statement, tried once (a failed batch's writers write alone, riding out
        outages there); its rows as plain tuples."""
        return self._db.run(
            f"write {count} checkpoints",
            # this runs for every checkpoint: positional parameters and plain tuples
            # spare psycopg the per-call rewriting of names and the dict rows
            lambda conn: (
                psycopg.RawCursor(conn, row_factory=tuple_row).execute(sql, values).fetchall()
            ),
            single_attempt=True,
        )

    @staticmethod
    def _document(items: Sequence[Item]) -> str:
        """The rows as one JSON array of objects (for ``json_to_recordset``): one text
        parameter encoded in C, where nine arrays cost psycopg twice as much per batch."""
        return json.dumps(
            [
                {
                    **params,
                    "kind": kind,
                    "status": str(params["status"]),
                    "started_at": params["started_at"].isoformat() if kind == "step" else None,
                }
                for kind, params in items
            ],
            ensure_ascii=False,
        )
