"""The launched runtime's background passes and database clock, on demand.

The races that matter are between passes that pick up workflows: the waker, the take-back
of what this process owns but does not run, recovery and take-over. With their default
intervals (seconds) two of them rarely meet; a stress test makes them meet thousands of
times a minute (``run_passes_every``) and then checks, from outside the process, that no
step ran twice.

A test that checks what a pass must *not* do (start a workflow a queue's limit holds,
cancel a workflow that finished in time) runs the pass once itself and looks at once,
instead of sleeping longer than the pass's interval and hoping it ran meanwhile.

Leases, the grace of a lost session lock, durable timers, rate-limit periods and
retention read time through ``dbos_agent.now()``: the database's time plus an offset
that the library sets on its own connections. ``advance_clock`` moves that offset, so
they behave as if the time had passed, for this process's connections only.

``dbos_agent.testing`` presents these to tests; :func:`fire_due` steps schedules one look
at a time (``_engine/scheduler.py`` keeps its older path).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..records import RecoveryReport
from .runtime.collaborators import ScheduleSpec
from .runtime.core import Engine
from .runtime.current import current_engine
from .runtime.dispatcher import dispatch_once as _dispatch_once
from .runtime.recovery import take_over_once as _take_over_once
from .runtime.scheduler import FiredSlot, Scheduler
from .runtime.waking import Sweep
from .runtime.waking import sweep_once as _sweep_once
from .schedules import registered_schedules


def run_passes_every(seconds: float) -> None:
    """Make each background pass of the launched runtime look every ``seconds`` (e.g.
    0.005) whether or not something woke it, from its next round on."""
    current_engine().run_passes_every(seconds)


def sweep_once() -> Sweep:
    """Run one sweep of the waker in the launched runtime now (whether or not it was
    launched with ``wake_suspended``): cancel the workflows past their deadline, wake and
    start the suspended workflows whose wait can be met. Returns what it did."""
    return _sweep_once(current_engine())


def dispatch_once() -> int:
    """Run one pass of the queue dispatcher in the launched runtime now: dequeue what
    the queues' limits and this process's free slots allow. Returns how many started."""
    return _dispatch_once(current_engine())


def take_over_once() -> RecoveryReport:
    """Run one take-over pass in the launched runtime now (whether or not it was launched
    to take over): take over the workflows of dead sessions that this process can run (a
    registered name, its application version), as many as it can start at once. Returns
    what it did."""
    return _take_over_once(current_engine())


def fire_due(
    engine: Engine | None = None, schedules: Sequence[ScheduleSpec] | None = None
) -> list[FiredSlot]:
    """Look once at this process's schedules (or ``schedules``) and fire their due slots,
    on ``engine`` (default: the launched one); returns what became of each slot decided.
    The scheduler pass does this on its own; tests call it to drive schedules one step
    at a time (``launch(run_schedules=False)``)."""
    given = schedules
    source = registered_schedules if given is None else lambda: given
    return Scheduler(engine or current_engine(), source).look().slots


def advance_clock(seconds: float) -> None:
    """Move the launched runtime's database clock ``seconds`` forward (or back, if
    negative): leases run out, timers come due, rate-limit periods pass. Workflows
    sleeping or waiting with a timeout in this process look at the clock again now."""
    current_engine().advance_clock(seconds)


def clock_offset() -> float:
    """How far the launched runtime's database clock is moved now, in seconds."""
    return current_engine().db.clock_offset
