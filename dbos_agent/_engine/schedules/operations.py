"""Operator actions on schedules: list them, pause, resume, backfill a range of slots.

As with the actions on workflows (``_engine/operations.py``), each comes in two layers. The
functions taking a ``SystemDatabase`` work from the database alone: the CLI uses them,
without the application's code, which is why a schedule's row holds its cron text, time
zone and workflow (``Client`` has them as methods). The public functions of
``dbos_agent.operations`` (``list_schedules``, ``pause_schedule``, ``resume_schedule``,
``backfill_schedule``) go through the launched runtime.

**Pause and resume.** A paused schedule fires nothing; its slots pass. Resuming moves its
cursor to now, so the slots of the pause are not caught up (a backfill runs them).

**Backfill.** Every slot in a range, up to now, whose workflow does not exist is recorded
(its workflow id is the slot's, so each slot runs once, whoever fires it, and a second
backfill of the range records nothing), regardless of the overlap policy and of a pause.
From the CLI the workflows are PENDING and owned by no session: the first live process
with the workflow's code takes them over (every launched process does, woken by the
NOTIFY such a row sends) and runs them. From a launched
process that has the workflow, they are owned by its session and run there at once.
Retention may delete old slots' workflows: a backfill of such a range runs them again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from ..._storage.database import SystemDatabase
from ..._storage.schedules import ScheduleRow
from ...errors import ScheduleError, ScheduleNotFoundError
from ...records import ScheduleInfo
from ..runtime.current import current_engine
from ..runtime.registry import find_workflow
from ..runtime.runs import Claim
from ..runtime.slots import MAX_SLOTS, slot_inputs, slot_workflow_id
from .cron import CronTimes


@dataclass(frozen=True, slots=True)
class BackfillReport:
    """What a backfill did."""

    schedule: str
    #: The slots of the range, up to the database's now (later ones are left to the
    #: schedule itself).
    slots: int
    #: The workflows this backfill recorded, one per slot that had none.
    fired: list[str]
    #: Slots whose workflow existed already (fired by the schedule or a backfill).
    already_fired: int


def _times(info: ScheduleInfo) -> CronTimes:
    """The slots of a recorded schedule (its cron text and zone were checked when it was
    defined; this machine may still lack the zone)."""
    try:
        return CronTimes(info.cron, info.timezone)
    except ValueError as exc:
        raise ScheduleError(f"schedule {info.name!r}: {exc}") from None


def _info(row: ScheduleRow) -> ScheduleInfo:
    """The row as operators see it, with the next slot to come (none while paused)."""
    info = row.info
    if info.paused:
        return info
    next_slot = _times(info).next_after(max(info.handled_through, row.now))
    return replace(info, next_slot=next_slot)


def _row(db: SystemDatabase, name: str) -> ScheduleRow:
    row = db.schedules.get(name)
    if row is None:
        raise ScheduleNotFoundError(name)
    return row


# -- from the database alone (the CLI) ---------------------------------------------------


def read_schedules(db: SystemDatabase) -> list[ScheduleInfo]:
    """Every recorded schedule, by name."""
    return [_info(row) for row in db.schedules.list()]


def read_schedule(db: SystemDatabase, name: str) -> ScheduleInfo:
    """One recorded schedule (ScheduleNotFoundError if there is none of that name)."""
    return _info(_row(db, name))


def set_schedule_paused(db: SystemDatabase, name: str, paused: bool) -> bool:
    """Pause or resume a schedule; whether that changed anything (pausing a paused one
    does nothing, so scripts may retry)."""
    was_paused = db.schedules.set_paused(name, paused)
    if was_paused is None:
        raise ScheduleNotFoundError(name)
    return was_paused is not paused


def backfill_schedule_slots(
    db: SystemDatabase,
    name: str,
    start: datetime,
    end: datetime,
    *,
    owner_key: int | None = None,
    executor_id: str | None = None,
) -> BackfillReport:
    """Record the workflow of every slot in ``[start, end]`` (up to now) that has none.

    ``owner_key`` is the session that will run them (None: whoever takes over orphans),
    ``executor_id`` their executor (None: the one that last registered the schedule).
    A range of more than 10,000 slots raises ScheduleError, recording nothing.
    """
    return _backfill(db, name, start, end, owner_key, executor_id)[0]


def _backfill(
    db: SystemDatabase,
    name: str,
    start: datetime,
    end: datetime,
    owner_key: int | None,
    executor_id: str | None,
) -> tuple[BackfillReport, dict[str, str]]:
    """:func:`backfill_schedule_slots`, and the recorded inputs of each workflow it recorded."""
    row = _row(db, name)
    label = f"cannot backfill schedule {name!r}"
    if start.tzinfo is None or end.tzinfo is None:
        raise ScheduleError(f"{label}: give the range as timezone-aware datetimes")
    if start > end:
        raise ScheduleError(f"{label}: the range starts ({start}) after it ends ({end})")
    slots = _times(row.info).within(start, min(end, row.now), MAX_SLOTS + 1)
    if len(slots) > MAX_SLOTS:
        raise ScheduleError(
            f"{label}: the range holds more than {MAX_SLOTS:,} slots of {row.info.cron!r}; "
            f"backfill it in smaller ranges"
        )
    runs = {slot_workflow_id(name, s): slot_inputs(row.slot_param, s) for s in slots}
    fired = db.schedules.insert_slot_workflows(
        row,
        list(runs.items()),
        owner_key,
        executor_id if executor_id is not None else row.executor_id,
    )
    report = BackfillReport(name, len(slots), fired, len(slots) - len(fired))
    return report, {wid: runs[wid] for wid in fired}


# -- through the launched runtime --------------------------------------------------------


def list_schedules() -> list[ScheduleInfo]:
    """Every schedule recorded in the database, with its next and latest slots."""
    return read_schedules(current_engine().db)


def pause_schedule(name: str) -> bool:
    """Pause the schedule ``name`` (in every process): its slots pass without runs until
    it is resumed. Returns whether it was running (False: already paused)."""
    return set_schedule_paused(current_engine().db, name, True)


def resume_schedule(name: str) -> bool:
    """Resume a paused schedule from the next slot (the slots of the pause are not caught
    up). Returns whether it was paused."""
    return set_schedule_paused(current_engine().db, name, False)


def backfill_schedule(name: str, start: datetime, end: datetime) -> BackfillReport:
    """Run every slot of ``name`` in ``[start, end]`` (up to now) that has not run, once
    each. When this process has the workflow they run here, now (this call returns once
    each is started); otherwise a process that has it takes them over."""
    engine = current_engine()
    row = _row(engine.db, name)
    definition = find_workflow(row.info.workflow_name)
    if definition is None or engine.ownership_mark() < 0:
        return backfill_schedule_slots(engine.db, name, start, end)
    report, inputs = _backfill(engine.db, name, start, end, engine.session_key, engine.executor_id)
    engine.start_claimed([Claim(definition, wid, inputs[wid]) for wid in report.fired])
    return report
