"""Retention: the statements that delete finished workflows, one batch at a time.

Both are named queries (``queries.sql``, section retention) run through the
:class:`SystemDatabase` helpers, so they ride out outages like every other call.
A batch is re-sent after a lost reply: deleting what is old and finished is
harmless to repeat, at worst the counts of that batch are lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .connector import Connector, Row


@dataclass(frozen=True, slots=True)
class GcCounts:
    """Rows deleted (or that would be) by retention, per table."""

    workflows: int = 0
    steps: int = 0
    messages: int = 0
    events: int = 0

    def __add__(self, other: GcCounts) -> GcCounts:
        return GcCounts(
            self.workflows + other.workflows,
            self.steps + other.steps,
            self.messages + other.messages,
            self.events + other.events,
        )


def _counts(row: Row | None) -> GcCounts:
    assert row is not None  # the query always returns its one row of counts
    return GcCounts(
        int(row["workflows"]), int(row["steps"]), int(row["messages"]), int(row["events"])
    )


class RetentionStore:
    """Deleting finished workflows with everything keyed by their ids."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def delete_batch(
        self, *, older_than_s: float, statuses: Sequence[str], batch_size: int
    ) -> GcCounts:
        """Delete the oldest ``batch_size`` workflows with one of ``statuses`` that finished
        more than ``older_than_s`` seconds ago (database clock), with their rows, in one
        statement. Fewer than ``batch_size`` deleted means nothing (unlocked) is left."""
        return _counts(
            self._db.one(
                "delete_finished_workflows",
                "delete finished workflows",
                statuses=list(statuses),
                older_than=older_than_s,
                batch_size=batch_size,
            )
        )

    def count(self, *, older_than_s: float, statuses: Sequence[str]) -> GcCounts:
        """What :meth:`delete_batch`, repeated, would delete now (reads only)."""
        return _counts(
            self._db.one(
                "count_finished_workflows",
                "count finished workflows",
                statuses=list(statuses),
                older_than=older_than_s,
            )
        )
