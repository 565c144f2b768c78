"""The ``streams`` table: items a workflow publishes under a key, read by offset."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from ..errors import StreamClosedError
from ..records import WorkflowStatus
from . import jsonb
from .connector import Connection, Connector
from .rows import StepWrite, text_of
from .sql_files import query
from .steps import write_with_checkpoint


@dataclass(frozen=True, slots=True)
class StreamRow:
    """One stored item: a value (JSON text), a reset of a step's items, or the close."""

    offset: int
    kind: str
    value: str | None
    step_seq: int | None
    attempt: int | None


@dataclass(frozen=True, slots=True)
class StreamKey:
    """A key a workflow has written a stream under: how many items it holds (values,
    resets and its close: the offset the next item would take) and whether it is closed."""

    key: str
    next_offset: int
    closed: bool


#: The most stream keys :meth:`StreamStore.keys` answers for one workflow.
MAX_STREAM_KEYS = 1000


class StreamStore:
    """Appends to and reads from durable streams."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def append_live(
        self,
        workflow_id: str,
        key: str,
        kind: str,
        value: str | None,
        *,
        seq: int | None,
        attempt: int | None,
        attempt_id: str | None,
        owner_key: int | None,
    ) -> int | None:
        """Append an item now (written from inside a step: not checkpointed); its offset,
        or None when this session no longer owns the workflow (nothing is written: the
        step's output is void, and the run stops at its checkpoint).

        Raises StreamClosedError when the stream is closed.
        """
        where = f"stream {key!r} of workflow {workflow_id!r}"
        row = self._db.one(
            "append_stream_item",
            f"write to {where}",
            where=where,
            workflow_id=workflow_id,
            key=key,
            kind=kind,
            value=self._db.json_in_optional(value, where),
            seq=seq,
            attempt=attempt,
            attempt_id=attempt_id,
            owner_key=owner_key,
        )
        assert row is not None
        if row["offset"] == -2:
            return None
        if row["offset"] < 0:
            raise StreamClosedError(f"{where} is closed")
        return int(row["offset"])

    def append_checkpointed(
        self,
        *,
        workflow_id: str,
        key: str,
        kind: str,
        value: str | None,
        seq: int,
        step_name: str,
        owner_key: int | None,
        started_at: datetime,
    ) -> tuple[StepWrite, int | None]:
        """Append an item and checkpoint step ``seq`` with its offset, in one transaction
        (written from the workflow body: exactly once); the step's output is the offset
        (what every version reads back) and its inputs name the key, so that a fork copies
        exactly this item (logs of older versions lack the inputs). When the step
        cannot be recorded (not the owner, the position taken) nothing is appended:
        ``(write, None)``.
        Raises StreamClosedError when the stream is closed."""
        where = f"stream {key!r} of workflow {workflow_id!r}"
        stored = self._db.json_in_optional(value, where)

        def append(conn: Connection) -> int:
            row = conn.execute(
                query("append_stream_item"),
                {
                    "workflow_id": workflow_id,
                    "key": key,
                    "kind": kind,
                    "value": stored,
                    "seq": None,
                    "attempt": None,
                    "attempt_id": None,
                    "owner_key": owner_key,
                },
            ).fetchone()
            assert row is not None
            if row["offset"] < 0:
                raise StreamClosedError(f"{where} is closed")
            return int(row["offset"])

        def output(offset: int) -> str:
            return str(offset)

        done = write_with_checkpoint(
            self._db,
            f"write to {where}",
            append,
            output,
            workflow_id=workflow_id,
            seq=seq,
            name=step_name,
            owner_key=owner_key,
            started_at=started_at,
            where=where,
            inputs=json.dumps({"key": key}),
        )
        return done.write, done.result

    def read(
        self,
        workflow_id: str,
        key: str,
        offset: int,
        limit: int = 500,
        max_bytes: int = 1024 * 1024,
    ) -> tuple[list[StreamRow], WorkflowStatus | None]:
        """Items from ``offset`` on, at most ``limit`` of them and ``max_bytes`` of JSON
        text (at least one, however large: a reader holds one page at a time, so this
        bounds its memory), and the workflow's status (None: no such workflow), read
        together."""
        rows = self._db.all(
            "read_stream_items",
            f"read stream {key!r} of workflow {workflow_id!r}",
            workflow_id=workflow_id,
            key=key,
            offset=offset,
            limit=limit,
            max_bytes=max_bytes,
        )
        status = rows[0]["workflow_status"] if rows else None
        items = [
            StreamRow(
                int(r["offset"]),
                r["kind"],
                jsonb.from_db(text_of(r["value"])),
                r["step_seq"],
                r["attempt"],
            )
            for r in rows
            if r["offset"] is not None
        ]
        return items, None if status is None else WorkflowStatus(status)

    def keys(self, workflow_id: str, limit: int = MAX_STREAM_KEYS) -> list[StreamKey]:
        """The keys ``workflow_id`` has written streams under, in order (at most
        ``limit``): what a reader may follow (none for a workflow that never streamed)."""
        rows = self._db.all(
            "list_stream_keys",
            f"list the streams of workflow {workflow_id!r}",
            workflow_id=workflow_id,
            limit=limit,
        )
        return [StreamKey(r["key"], int(r["next_offset"]), bool(r["closed"])) for r in rows]
