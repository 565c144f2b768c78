"""Messages into workflows, events out of them, and the database clock timers use."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from . import jsonb
from .connector import Connector
from .rows import StepWrite, step_write, text_of


class MessageStore:
    """The ``messages`` and ``events`` tables."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def database_time(self) -> float:
        """The database's clock in epoch seconds: the one clock every executor shares."""
        row = self._db.one("get_database_time", "read the database clock")
        assert row is not None
        return float(row["now"])

    def send(
        self, *, destination_id: str, topic: str, message: str, idempotency_key: str | None
    ) -> tuple[bool, bool]:
        """Send a message; ``(destination exists, inserted)`` (a known key inserts nothing)."""
        where = f"message to workflow {destination_id!r}"
        row = self._db.one(
            "insert_message",
            f"send a message to workflow {destination_id!r}",
            where=where,
            destination_id=destination_id,
            topic=topic,
            message=self._db.json_in(message, where),
            idempotency_key=idempotency_key,
        )
        assert row is not None
        return bool(row["destination_exists"]), bool(row["inserted"])

    def send_many(
        self, messages: Sequence[tuple[str, str, str, str | None]]
    ) -> tuple[int, list[str]]:
        """Send ``(destination_id, topic, message JSON, idempotency key)`` messages in one
        statement: ``(how many were inserted, the destinations that do not exist)``; when
        one does not, nothing is inserted."""
        what = f"send {len(messages)} messages"
        row = self._db.one(
            "insert_messages",
            what,
            destination_ids=[m[0] for m in messages],
            topics=[m[1] for m in messages],
            messages=[self._db.json_in(m[2], f"message to workflow {m[0]!r}") for m in messages],
            idempotency_keys=[m[3] for m in messages],
        )
        assert row is not None
        return int(row["inserted"]), list(row["missing"])

    def receive(
        self,
        *,
        workflow_id: str,
        seq: int,
        name: str,
        topic: str,
        inputs: str,
        started_at: datetime,
        owner_key: int | None,
    ) -> tuple[StepWrite, str | None]:
        """Consume the oldest message and record it as step ``seq``, atomically.

        Returns the write (``written`` when a message was taken) and the message's JSON.
        """
        with self._db.log_write(workflow_id, seq):
            row = self._db.one(
                "receive_message",
                f"receive a message in workflow {workflow_id!r}",
                workflow_id=workflow_id,
                seq=seq,
                name=name,
                topic=topic,
                inputs=jsonb.to_db(inputs),
                started_at=started_at,
                owner_key=owner_key,
            )
        assert row is not None
        return step_write(seq, row), text_of(row["message"])

    def set_event(
        self,
        *,
        workflow_id: str,
        seq: int,
        name: str,
        key: str,
        value: str,
        inputs: str,
        started_at: datetime,
        owner_key: int | None,
    ) -> StepWrite:
        """Record step ``seq`` and set the event in one statement (neither without the other)."""
        where = f"workflow {workflow_id!r} event {key!r}"
        with self._db.log_write(workflow_id, seq):
            row = self._db.one(
                "set_event",
                f"set event {key!r} of workflow {workflow_id!r}",
                where=where,
                workflow_id=workflow_id,
                seq=seq,
                name=name,
                key=key,
                value=self._db.json_in(value, where),
                inputs=jsonb.to_db(inputs),
                started_at=started_at,
                owner_key=owner_key,
            )
        return step_write(seq, row)

    def get_event(self, workflow_id: str, key: str) -> str | None:
        """The event's JSON, or None when it was never set."""
        row = self._db.one(
            "get_event",
            f"read event {key!r} of workflow {workflow_id!r}",
            workflow_id=workflow_id,
            key=key,
        )
        return None if row is None else text_of(row["value"])
