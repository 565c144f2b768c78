"""Suspended workflows as the database sees them: giving a workflow up while it waits,
and waking the ones whose wait can be met (migration 008, queries.sql "suspension")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from .connector import Connector
from .rows import Runner, text_of


@dataclass(frozen=True, slots=True)
class WaitCondition:
    """What wakes a suspended workflow.

    ``kind`` is ``sleep`` (at ``wake_at``), ``recv`` (a message to ``target``, the
    workflow itself, on topic ``name``), ``event`` (workflow ``target`` publishes
    ``name``) or ``child`` (workflow ``target`` finishes); ``wake_at`` is also the
    deadline of a recv or get_event (None: none).
    Times are epoch seconds on the database clock.
    """

    kind: str
    target: str | None = None
    name: str | None = None
    wake_at: float | None = None


@dataclass(frozen=True, slots=True)
class WokenWorkflow:
    """A workflow this session just woke: it now owns it and runs it from its log."""

    workflow_id: str
    name: str
    inputs: str


class SuspensionStore:
    """Suspend and wake; every statement is one guarded UPDATE."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def suspend(self, workflow_id: str, condition: WaitCondition, owner_key: int | None) -> bool:
        """Suspend the workflow unless its wait can be met already; True if it did."""
        wake_at = (
            None if condition.wake_at is None else datetime.fromtimestamp(condition.wake_at, UTC)
        )
        row = self._db.one(
            "suspend_workflow",
            f"suspend workflow {workflow_id!r}",
            workflow_id=workflow_id,
            owner_key=owner_key,
            wait_kind=condition.kind,
            wait_target=condition.target,
            wait_name=condition.name,
            wake_at=wake_at,
        )
        return row is not None

    def wake(
        self,
        *,
        owner_key: int,
        executor_id: str,
        runner: Runner,
        targets: list[str] | None,
        limit: int,
    ) -> list[WokenWorkflow]:
        """Wake (take) up to ``limit`` suspended workflows whose wait can be met: of those
        waiting on ``targets`` (NOTIFY payloads), or any (None: a sweep)."""
        params = {
            "owner_key": owner_key,
            "executor_id": executor_id,
            **runner.params(),
            "limit": limit,
        }
        if targets is None:
            found = self._db.all(
                "list_wake_targets",
                "look for suspended workflows to wake",
                limit=limit,
                **runner.params(),
            )
            targets = [row["target"] for row in found]
            if not targets:
                return []
        rows = self._db.all("wake_notified", "wake suspended workflows", targets=targets, **params)
        return [
            WokenWorkflow(r["workflow_id"], r["name"], text_of(r["inputs"]) or "{}") for r in rows
        ]

    def next_wake_in(self, runner: Runner) -> float | None:
        """Seconds until the earliest suspended timer the caller could wake is due
        (negative: overdue; None: there is none)."""
        row = self._db.one("next_wake_at", "read the next timer", **runner.params())
        return None if row is None or row["seconds"] is None else float(row["seconds"])
