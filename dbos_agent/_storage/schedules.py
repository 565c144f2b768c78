"""Schedules: their rows, and firing a slot (the cursor moved and the workflow inserted in
one transaction)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ..records import ScheduleInfo, SlotOutcome, WorkflowStatus
from .connector import Connection, Connector, Row
from .rows import NewWorkflow
from .sql_files import query


@dataclass(frozen=True, slots=True)
class ScheduleCursor:
    """What the scheduler reads of a schedule on each look."""

    name: str
    paused: bool
    handled_through: datetime
    buffered_slot: datetime | None


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A recorded schedule: what operators see, and what a backfill from the database
    alone needs to record the slots' workflows."""

    info: ScheduleInfo
    slot_param: str
    max_recovery_attempts: int
    executor_id: str
    app_version: str | None
    #: The database clock when the row was read.
    now: datetime


def _utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.astimezone(UTC)


def _schedule_row(row: Row) -> ScheduleRow:
    last_status = row["last_status"]
    info = ScheduleInfo(
        name=row["name"],
        workflow_name=row["workflow_name"],
        cron=row["cron"],
        timezone=row["timezone"],
        catch_up=row["catch_up"],
        catch_up_window=timedelta(seconds=row["catch_up_window"]),
        overlap=row["overlap"],
        paused=bool(row["paused"]),
        handled_through=row["handled_through"].astimezone(UTC),
        last_slot=_utc(row["last_slot"]),
        last_workflow_id=row["last_workflow_id"],
        last_status=None if last_status is None else WorkflowStatus(last_status),
        buffered_slot=_utc(row["buffered_slot"]),
        skipped_slots=int(row["skipped_slots"]),
        last_skipped_slot=_utc(row["last_skipped_slot"]),
        passed_slots=int(row["passed_slots"]),
        last_passed_slot=_utc(row["last_passed_slot"]),
    )
    return ScheduleRow(
        info=info,
        slot_param=row["slot_param"],
        max_recovery_attempts=row["max_recovery_attempts"],
        executor_id=row["executor_id"],
        app_version=row["app_version"],
        now=row["now"].astimezone(UTC),
    )


class ScheduleStore:
    """The ``schedules`` table (see migration 017 for the cursor and the guarantees)."""

    def __init__(self, db: Connector) -> None:
        self._db = db

    def _write(self, name: str, what: str, /, **params: object) -> None:
        """The named statement, which returns no rows (sent again after a lost
        connection: both writes are guarded)."""
        self._db.run(what, lambda c: c.execute(query(name), params))

    def register(
        self,
        *,
        name: str,
        workflow_name: str,
        slot_param: str,
        max_recovery_attempts: int,
        cron: str,
        timezone: str,
        catch_up: str,
        catch_up_window: timedelta,
        overlap: str,
        executor_id: str,
        app_version: str | None,
    ) -> None:
        """Record the schedule, or bring its description up to date (its pause, cursor
        and runs stay)."""
        self._write(
            "register_schedule",
            f"record schedule {name!r}",
            name=name,
            workflow_name=workflow_name,
            slot_param=slot_param,
            max_recovery_attempts=max_recovery_attempts,
            cron=cron,
            timezone=timezone,
            catch_up=catch_up,
            catch_up_window=catch_up_window.total_seconds(),
            overlap=overlap,
            executor_id=executor_id,
            app_version=app_version,
        )

    def cursors(self, names: list[str]) -> tuple[datetime, dict[str, ScheduleCursor]]:
        """The database clock, and the cursor of each named schedule that is recorded."""
        rows = self._db.all("list_schedule_cursors", "read the schedules' cursors", names=names)
        found = {
            row["name"]: ScheduleCursor(
                row["name"],
                bool(row["paused"]),
                row["handled_through"].astimezone(UTC),
                _utc(row["buffered_slot"]),
            )
            for row in rows
            if row["name"] is not None
        }
        return rows[0]["now"].astimezone(UTC), found

    def fire(
        self, name: str, slot: datetime, workflow: NewWorkflow, *, from_buffer: bool = False
    ) -> tuple[SlotOutcome | None, bool]:
        """Decide what becomes of ``slot`` and record it, with the slot's workflow when it
        fires, in one transaction; ``(outcome, started)``. The outcome is None when there
        was nothing to do (paused, handled already, a buffered slot whose run is still
        unfinished); WAITING records nothing (the slot keeps its turn); ``started`` is
        whether this call inserted the workflow (False when a backfill had). Sent again
        after a lost connection: the guard makes that harmless (a workflow whose insert
        committed unacknowledged is taken back by this session's take-back pass).

        The workflow is PENDING under the caller's session, which runs it: one on a queue
        or delayed is refused (ValueError).
        """
        if workflow.status is not WorkflowStatus.PENDING:
            raise ValueError(
                f"a slot's workflow starts PENDING, not on a queue or delayed: "
                f"{workflow.workflow_id!r} is {workflow.status.value}"
            )
        decide = {
            "name": name,
            "slot": slot,
            "from_buffer": from_buffer,
            "workflow_id": workflow.workflow_id,
        }
        where = f"the inputs of workflow {workflow.workflow_id!r} ({workflow.name})"
        insert = workflow.insert_params(self._db.json_in(workflow.inputs, where))

        def body(conn: Connection) -> tuple[SlotOutcome | None, bool]:
            conn.execute(query("lock_schedule"), {"name": name})
            row = conn.execute(query("decide_schedule_slot"), decide).fetchone()
            if row is None:
                return None, False
            outcome = SlotOutcome(row["outcome"])
            if outcome is not SlotOutcome.FIRED:
                return outcome, False
            return outcome, conn.execute(query("insert_workflow"), insert).fetchone() is not None

        return self._db.run(
            f"fire slot {slot.isoformat()} of schedule {name!r}", body, transaction=True
        )

    def pass_slots(self, name: str, after: datetime, through: datetime, passed: int) -> bool:
        """Move the cursor from ``after`` to ``through`` without running the slots it passes
        over, counting ``passed`` of them; False when the cursor was no longer at ``after``
        (another process moved it: plan again). Sent again after a lost connection, a
        move that committed finds the cursor moved, and reports False: harmless."""
        row = self._db.one(
            "pass_schedule_slots",
            f"pass over slots of schedule {name!r}",
            name=name,
            after=after,
            slot=through,
            passed=passed,
        )
        return row is not None

    def set_paused(self, name: str, paused: bool) -> bool | None:
        """Pause or resume; whether it was paused before (None: no such schedule)."""
        row = self._db.one(
            "set_schedule_paused",
            f"{'pause' if paused else 'resume'} schedule {name!r}",
            name=name,
            paused=paused,
        )
        return None if row is None else bool(row["was_paused"])

    def get(self, name: str) -> ScheduleRow | None:
        """One recorded schedule, or None."""
        rows = self._db.all("list_schedules", f"read schedule {name!r}", name=name)
        return _schedule_row(rows[0]) if rows else None

    def insert_slot_workflows(
        self,
        schedule: ScheduleRow,
        runs: list[tuple[str, str]],
        owner_key: int | None,
        executor_id: str,
    ) -> list[str]:
        """Record the workflows ``(workflow id, inputs)`` of a backfill's slots, skipping
        those that exist; returns the ids inserted."""
        if not runs:
            return []
        info = schedule.info
        rows = self._db.all(
            "insert_slot_workflows",
            f"record the backfilled slots of schedule {info.name!r}",
            workflow_name=info.workflow_name,
            executor_id=executor_id,
            app_version=schedule.app_version,
            max_recovery_attempts=schedule.max_recovery_attempts,
            owner_key=owner_key,
            workflow_ids=[wid for wid, _ in runs],
            inputs=[inputs for _, inputs in runs],
        )
        return [row["workflow_id"] for row in rows]

    def list(self) -> list[ScheduleRow]:  # last: the name hides the builtin in annotations
        """Every recorded schedule, by name."""
        rows = self._db.all("list_schedules", "list schedules", name=None)
        return [_schedule_row(row) for row in rows]
