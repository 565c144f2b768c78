"""The scheduler: the pass of a launched process that fires its schedules' due slots.

The schedules are the API's (``@scheduled``, ``_engine/schedules/``): the pass is given a
source of them when built (``launch`` passes the process's registry) and asks it at every
look, so a schedule defined after launch is fired too. It reads them as
:class:`~.collaborators.ScheduleSpec`; a slot's workflow id and inputs are ``slots.py``'s.

Time is the database clock (``dbos_agent.now()``), never this machine's: processes on
different hosts agree on which slots are due, and a test moves time with
``advance_clock``. Each *look* reads every schedule's cursor and the clock in one query,
then, per schedule that is not paused:

1. a buffered slot (``overlap="buffer_one"``) is fired once the run it waited for ended;
2. the due slots (after the cursor, up to now) go through the catch-up policy
   (:func:`plan_slots`): which to fire, and how far to pass over the others (one guarded
   statement, from the cursor the plan was made with);
3. each slot to fire is one transaction (``_storage/schedules.py``): the overlap policy
   decides, the cursor moves past the slot, and a fired slot's workflow is inserted
   PENDING under this process's session, which then runs it on its worker pool.

With ``catch_up="all"`` and ``overlap`` ``"skip"`` or ``"buffer_one"`` the slots run *in
order* (:func:`in_order`): a slot due while the previous run is unfinished is decided
``waiting``, which records nothing, so the cursor stays before it and it keeps its turn;
the run's end wakes the scheduler, which fires it. So a catch-up after downtime runs every
slot of the window one after another, and on-time slots queue behind a long run instead
of being skipped. Only a slot that falls out of the catch-up window before its turn is
passed over, and counted (``passed_slots``). A slot due while the database was down is a
missed slot like any other: the first look once it is back fires it as the policy says.

Any number of processes may look at once: the row lock serialises them and the later one
finds the slot handled. A process killed -9 after a slot's transaction leaves the slot's
workflow PENDING under a dead session; take-over continues it elsewhere, as any workflow.
Killed before the commit, it recorded nothing and the next look (anywhere) fires the
slot. The thread sleeps until the next slot (at most a few seconds, to see pauses and
buffered slots), and wakes at once when the clock is moved or shutdown begins.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..._storage.rows import NewWorkflow
from ...records import SlotOutcome
from .collaborators import BackgroundPass, ScheduleSource, ScheduleSpec
from .core import Engine
from .runs import Claim
from .slots import MAX_SLOTS, slot_inputs, slot_workflow_id

log = logging.getLogger(__name__)

#: With ``catch_up="none"``, a slot this late or less is on time (the look that sees it
#: may come a little after it: a busy machine, an outage ridden out).
ON_TIME = timedelta(minutes=1)
#: The longest a scheduler sleeps between looks (it sees pauses, resumes and others'
#: slots that late at most), and how often it looks while a slot is buffered.
_MAX_SLEEP_S = 5.0
_BUFFER_POLL_S = 0.5
#: A look that could not fire (this session's fence lapsed, a failure) tries again after.
_RETRY_S = 0.2
_MIN_SLEEP_S = 0.005
#: Slots are whole seconds apart at least: a span this long holds MAX_SLOTS at most.
_MAX_SLOTS_SPAN = timedelta(seconds=MAX_SLOTS)
_ONE_MICROSECOND = timedelta(microseconds=1)
#: The most passed-over slots one look counts (a long outage of a per-second schedule
#: is counted over several looks, none of them long).
_PASS_CHUNK = 100_000
#: The slots one look tries in order: the first fires, the next waits for its run.
_IN_ORDER_BATCH = 8


@dataclass(frozen=True, slots=True)
class SlotPlan:
    """What the catch-up policy does with a schedule's due slots."""

    #: The slots to fire, in order (firing one passes over every earlier slot).
    fire: list[datetime]
    #: Move the cursor here first without running anything (the due slots up to here
    #: are missed for good).
    pass_through: datetime | None = None
    #: How many slots that passes over, counted on the row (``catch_up="all"`` only:
    #: they fell out of its promise).
    passed: int = 0
    #: More is due than this plan holds: look again at once.
    more: bool = False


def in_order(schedule: ScheduleSpec) -> bool:
    """Whether the schedule's due slots run one after another, each once the previous
    run ended: ``catch_up="all"`` keeps every slot of the window, and an ``overlap`` other
    than ``"allow"`` keeps two runs from overlapping."""
    return schedule.catch_up == "all" and schedule.overlap != "allow"


def plan_slots(schedule: ScheduleSpec, handled_through: datetime, now: datetime) -> SlotPlan:
    """Which of the slots in ``(handled_through, now]`` to fire. ``latest``: the most
    recent; ``none``: the most recent if it is on time (see ``ON_TIME``); ``all``: every
    one within the catch-up window (at most ``MAX_SLOTS``, the latest), the earlier ones
    passed over and counted. In order (:func:`in_order`) a look fires the first few only:
    the next waits its turn."""
    times = schedule.times
    if schedule.catch_up != "all":
        latest = times.latest_until(now)
        if latest is None or latest <= handled_through:
            return SlotPlan([])
        if schedule.catch_up == "none" and now - latest > ON_TIME:
            return SlotPlan([], latest)
        return SlotPlan([latest])
    floor = max(handled_through, now - schedule.catch_up_window)
    if now - floor > _MAX_SLOTS_SPAN:  # the window may hold more than MAX_SLOTS slots
        kept = times.latest_between(floor, now, MAX_SLOTS)
        if len(kept) == MAX_SLOTS:
            floor = max(floor, kept[0] - _ONE_MICROSECOND)
    passed = times.between(handled_through, floor, _PASS_CHUNK) if floor > handled_through else []
    if len(passed) == _PASS_CHUNK:  # a long outage: count it a chunk per look
        return SlotPlan([], passed[-1], len(passed), more=True)
    batch = _IN_ORDER_BATCH if in_order(schedule) else MAX_SLOTS
    fire = times.between(floor, now, batch)
    return SlotPlan(
        fire,
        passed[-1] if passed else None,
        len(passed),
        more=len(fire) == batch and fire[-1] < now,
    )


@dataclass(frozen=True, slots=True)
class FiredSlot:
    """What one look decided for one slot."""

    schedule: str
    slot: datetime
    outcome: SlotOutcome
    workflow_id: str
    #: This process inserted the slot's workflow and runs it (False: a backfill had
    #: recorded it, or the slot was skipped or buffered).
    started: bool


@dataclass
class Look:
    """What a look did, and how long to sleep before the next one."""

    slots: list[FiredSlot] = field(default_factory=list)
    sleep: float = _MAX_SLEEP_S


class Scheduler(BackgroundPass):
    """Fires the due slots of this process's schedules; :meth:`run` is its thread."""

    thread_name = "dbos-agent-scheduler"

    def __init__(self, engine: Engine, schedules: ScheduleSource) -> None:
        self.engine = engine
        self._schedules = schedules
        self._recorded: set[str] = set()
        self._wake = threading.Event()

    def poke(self) -> None:
        """Look again now (the clock was moved, or shutdown begins)."""
        self._wake.set()

    def wake(self) -> None:
        self.poke()

    def run(self) -> None:
        """Look, sleep until the next slot or a poke, until shutdown."""
        engine = self.engine
        while not engine.stopping:
            self._wake.clear()
            try:
                sleep = self.look().sleep
            except Exception as exc:
                if engine.stopping:
                    return
                log.error("firing the schedules failed (%s); trying again", exc)
                sleep = 1.0
            self._wake.wait(sleep)

    def look(self) -> Look:
        """Fire what is due now, once."""
        schedules = self._schedules()
        look = Look()
        if not schedules:
            return look
        db = self.engine.db
        for schedule in schedules:
            if schedule.name not in self._recorded:
                self._record(schedule)
        now, cursors = db.schedules.cursors([s.name for s in schedules])
        started = time.monotonic()
        for schedule in schedules:
            cursor = cursors.get(schedule.name)
            if cursor is None:  # not recorded (deleted meanwhile): record it next look
                self._recorded.discard(schedule.name)
                look.sleep = _RETRY_S
                continue
            if cursor.paused:
                continue
            try:
                self._fire_due(schedule, cursor.buffered_slot, cursor.handled_through, now, look)
            except _NotNow:
                look.sleep = _RETRY_S
                return look
            following = schedule.times.next_after(now)
            if following is not None:
                look.sleep = min(look.sleep, (following - now).total_seconds())
        look.sleep = max(_MIN_SLEEP_S, look.sleep - (time.monotonic() - started))
        return look

    def _record(self, schedule: ScheduleSpec) -> None:
        engine = self.engine
        engine.db.schedules.register(
            name=schedule.name,
            workflow_name=schedule.workflow.name,
            slot_param=schedule.slot_param,
            max_recovery_attempts=schedule.workflow.max_recovery_attempts,
            cron=schedule.cron,
            timezone=schedule.timezone,
            catch_up=schedule.catch_up,
            catch_up_window=schedule.catch_up_window,
            overlap=schedule.overlap,
            executor_id=engine.executor_id,
            app_version=engine.app_version,
        )
        self._recorded.add(schedule.name)

    def _fire_due(
        self,
        schedule: ScheduleSpec,
        buffered: datetime | None,
        handled_through: datetime,
        now: datetime,
        look: Look,
    ) -> None:
        """The buffered slot, then the due ones (raises _NotNow when this session cannot
        fire now)."""
        waiting = False
        if buffered is not None:
            waiting = self._fire(schedule, buffered, look, from_buffer=True) is None
        plan = plan_slots(schedule, handled_through, now)
        if plan.pass_through is not None and not self.engine.db.schedules.pass_slots(
            schedule.name, handled_through, plan.pass_through, plan.passed
        ):
            look.sleep = min(look.sleep, _MIN_SLEEP_S)  # another process moved the cursor
            return
        if plan.more:
            look.sleep = min(look.sleep, _MIN_SLEEP_S)
        for slot in plan.fire:
            outcome = self._fire(schedule, slot, look)
            if outcome is SlotOutcome.WAITING:  # the later slots wait behind it
                waiting = True
                break
            waiting |= outcome is SlotOutcome.BUFFERED
        if waiting:  # a slot waits for an unfinished run: look again soon
            look.sleep = min(look.sleep, _BUFFER_POLL_S)

    def _fire(
        self, schedule: ScheduleSpec, slot: datetime, look: Look, *, from_buffer: bool = False
    ) -> SlotOutcome | None:
        """One slot's transaction, and its run here when it started; the outcome (None:
        nothing to do, e.g. the buffered slot's run is still unfinished). A slot that may
        have others waiting for its run wakes this scheduler when the run ends."""
        engine = self.engine
        if engine.ownership_mark() < 0 or engine.stopping:
            raise _NotNow
        definition = schedule.workflow
        workflow = NewWorkflow(
            workflow_id=slot_workflow_id(schedule.name, slot),
            name=definition.name,
            inputs=slot_inputs(schedule.slot_param, slot),
            executor_id=engine.executor_id,
            app_version=engine.app_version,
            max_recovery_attempts=definition.max_recovery_attempts,
            owner_key=engine.session_key,
        )
        outcome, started = engine.db.schedules.fire(
            schedule.name, slot, workflow, from_buffer=from_buffer
        )
        if outcome is not None:
            look.slots.append(
                FiredSlot(schedule.name, slot, outcome, workflow.workflow_id, started)
            )
        if started:
            [run] = engine.start_claimed([Claim(definition, workflow.workflow_id, workflow.inputs)])
            if run is not None and schedule.overlap != "allow":
                run.add_done_callback(lambda _: self.poke())
        return outcome


class _NotNow(Exception):
    """This session cannot fire now: its fence does not hold (others might think it dead
    and take over what it starts), or shutdown began."""
