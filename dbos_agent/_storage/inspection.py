"""Read-only questions about what happened, for tests and tools.

The other stores answer what the engine needs to run workflows; this one answers
what a test wants to assert afterwards (a workflow's mailbox, who owns it now, what
is left of it after retention), so that no test reaches into the tables itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..records import WorkflowStatus
from . import jsonb

if TYPE_CHECKING:
    from .connector import Connector


@dataclass(frozen=True, slots=True)
class SentMessage:
    """A message in a workflow's mailbox, consumed or not."""

    topic: str | None
    #: The message as stored: its JSON, decoded.
    message: Any
    idempotency_key: str | None
    #: The position of the recv step that consumed it (None: not consumed yet).
    consumed_seq: int | None


@dataclass(frozen=True, slots=True)
class RowCounts:
    """How many rows a workflow has in each table."""

    workflows: int
    steps: int
    messages: int
    events: int


class InspectionStore:
    """Reads only; every statement is an ``inspect_*`` query."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def messages(self, workflow_id: str) -> list[SentMessage]:
        """Every message sent to ``workflow_id``, oldest first."""
        rows = self._db.all("inspect_messages", "read a mailbox", workflow_id=workflow_id)
        return [
            SentMessage(
                r["topic"] or None,
                jsonb.parse(r["message"]),
                r["idempotency_key"],
                r["consumed_seq"],
            )
            for r in rows
        ]

    def event(self, workflow_id: str, key: str) -> tuple[bool, Any]:
        """``(True, value)`` if the workflow published ``key``, else ``(False, None)``."""
        row = self._db.one("inspect_event", "read an event", workflow_id=workflow_id, key=key)
        return (False, None) if row is None else (True, jsonb.parse(row["value"]))

    def owner_pid(self, workflow_id: str) -> int | None:
        """The pid of the process whose session owns the workflow (None: no owner)."""
        row = self._db.one("inspect_owner_pid", "read an owner", workflow_id=workflow_id)
        return None if row is None else int(row["pid"])

    def rows_of(self, workflow_id: str) -> RowCounts:
        """How many rows ``workflow_id`` has in each table."""
        row = self._db.one("inspect_rows_of", "count rows", workflow_id=workflow_id)
        assert row is not None
        return RowCounts(row["workflows"], row["steps"], row["messages"], row["events"])

    def recovery_attempts(self, workflow_ids: list[str] | None = None) -> dict[str, int]:
        """Recovery attempts by workflow id (of every workflow without ``workflow_ids``)."""
        rows = self._db.all(
            "inspect_recovery_attempts", "read recovery attempts", workflow_ids=workflow_ids
        )
        return {r["workflow_id"]: int(r["recovery_attempts"]) for r in rows}

    def statuses(self, workflow_ids: list[str]) -> dict[str, WorkflowStatus]:
        """The status of each of ``workflow_ids`` that exists, in one statement."""
        rows = self._db.all("inspect_statuses", "read statuses", workflow_ids=workflow_ids)
        return {r["workflow_id"]: WorkflowStatus(r["status"]) for r in rows}

    def locked_sessions(self) -> set[int]:
        """The executor sessions whose advisory lock is held now."""
        rows = self._db.all("inspect_locked_sessions", "read locked sessions")
        return {int(r["session_key"]) for r in rows}
